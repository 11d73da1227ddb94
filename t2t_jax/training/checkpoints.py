"""Checkpoints through orbax (§6.1: "written at 10-minute intervals").

A workdir holds
  checkpoints/<step>/params       the model parameters
  checkpoints/<step>/train_state  step, Adam state and dropout RNG
  checkpoints/<step>/data         the input iterator's position (JSON)
  checkpoints/corrupt-<step>/     a checkpoint that could not be read, moved aside
  checkpoints/<step>/metrics      the dev metrics of that step, where training evaluated there
and averaged/<step>/, §6.1's mean of the last checkpoints (run/averaging.py). orbax writes
each checkpoint into a temporary directory and renames it when complete, so a crash
mid-write never leaves a checkpoint that looks finished.

Which checkpoints stay is orbax's preservation policies' choice: the last `keep` (§6.1's
average needs them) and the `keep_best` of lowest dev loss, which a long run would otherwise
rotate away. orbax reads each checkpoint's metrics back when it opens the folder, so a resumed
run keeps the same ones.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging

from t2t_jax.platform import distributed, errors, files

CHECKPOINTS = 'checkpoints'
AVERAGED = 'averaged'
CORRUPT = 'corrupt-'  # checkpoints/corrupt-<step>: unreadable, moved aside
# A read that fails is tried this often, waiting RETRY_SECONDS × attempt in between:
# network file systems (NFS, GCS FUSE) have bad seconds that are not corruption.
READ_ATTEMPTS = 3
RETRY_SECONDS = 2.0

Shapes = dict[str, tuple[int, ...]]


class CheckpointMismatch(errors.UserError):
  """A checkpoint holds parameters of another shape or structure than the model asked for."""

  def __init__(self, where: str, differences: list[tuple[str, Any, Any]]):
    self.where, self.differences = where, differences  # (name, in checkpoint, expected)
    name, have, want = differences[0]
    super().__init__(f'{where}: parameter {name} has shape {have} there but {want} under this '
                     f'config ({len(differences)} parameter(s) differ)')


class CheckpointNotSaved(errors.UserError):
  """A save at or below the latest step (orbax never writes one)."""


class CheckpointWriteError(files.DiskWriteError):
  """A checkpoint write the system refused (a full disk): orbax's other writes of it may
  still be in flight, and fail again at exit (main ends the process at once)."""


@contextlib.contextmanager
def _checkpoint_write_errors(directory: str) -> Iterator[None]:
  try:
    with files.disk_write_errors(directory, 'checkpoints'):
      yield
  except files.DiskWriteError as e:
    raise CheckpointWriteError(directory, 'checkpoints', e.__cause__ or e) from e.__cause__


DEV_LOSS = 'dev_loss'  # the metric keep_best ranks checkpoints by


def _dev_loss(metrics: dict) -> float:
  """A checkpoint's dev loss; one saved where training did not evaluate ranks last."""
  return float(metrics.get(DEV_LOSS, math.inf))


class Checkpointer:
  """Saves at orbax's policies' steps (every `every_steps`, and JAX's preemption sync point),
  and every `every_minutes` minutes by the clock; keeps the last `keep` and the `keep_best` of
  lowest dev loss."""

  def __init__(self, workdir: str, *, keep: int, keep_best: int = 0, every_steps: int = 0,
               every_minutes: float = 0.0):
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINTS))
    self._every_seconds = every_minutes * 60
    self._last_save_time = time.monotonic()
    if jax.process_index() == 0:  # a real folder in the workdir, not a link out of it
      files.make_folder(self.directory, os.path.abspath(workdir), 'checkpoints')
    self._remove_torn_writes()
    policies = ocp.checkpoint_managers
    steps = [policies.FixedIntervalPolicy(every_steps)] if every_steps else []
    # Handlers named up front, so that item_metadata can read shapes before any restore.
    self._manager = ocp.CheckpointManager(
        self.directory, item_handlers={'params': ocp.StandardCheckpointHandler(),
                                       'train_state': ocp.StandardCheckpointHandler(),
                                       'data': ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(
            save_decision_policy=policies.AnySavePolicy(
                [*steps, policies.PreemptionCheckpointingPolicy()]),
            # best_fn makes orbax write and read each checkpoint's metrics; which are kept
            # is the preservation policy's alone.
            best_fn=_dev_loss, best_mode='min',
            preservation_policy=policies.AnyPreservationPolicy([
                policies.LatestN(keep),
                # reverse: descending, so the lowest losses are the last, the ones kept.
                policies.BestN(get_metric_fn=_dev_loss, reverse=True, n=keep_best,
                               keep_checkpoints_without_metrics=False)])))
    self._closed = False

  def _remove_torn_writes(self) -> None:
    """Removes the temporary folders of saves a kill or a full disk cut short (orbax's
    `<step>.orbax-checkpoint-tmp-*`), now, before orbax opens the folder. orbax's own
    cleanup (cleanup_tmp_directories) runs in a background thread that a run stopping at
    once (a bad config.restore_step) left scanning during interpreter shutdown, printing a
    traceback. Process 0 removes, the others wait for it."""
    if jax.process_index() == 0 and os.path.isdir(self.directory):
      for name in ocp.path.step.tmp_checkpoints(self.directory):
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    distributed.sync('t2t_jax_torn_writes')

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _) -> None:
    """Closes; after an error, without raising a second one over it, letting a save in flight
    finish (or fail, logged): the error that stopped the run is the one to report, and a write
    cut off at exit would be lost work. After a refused write it waits for nothing: the others
    in flight fail too, and main ends the process."""
    if kind is None:
      self.close()
    elif not self._closed and not isinstance(error, CheckpointWriteError):
      self._closed = True
      try:
        self._manager.wait_until_finished()
        self._manager.close()
      except Exception as e:  # the run already stops with another error
        logging.warning('Checkpoint writes in %s did not finish: %s', self.directory,
                        errors.summary(e))
    self._closed = True

  def should_save(self, step: int) -> bool:
    """Whether orbax's policies save `step`: the same answer on every host (a step count,
    and the preemption sync point JAX's processes agree on)."""
    return self._manager.should_save(step)

  def reached_preemption(self, step: int) -> bool:
    """Whether the processes of a jax.distributed run reached the sync point JAX set after
    a preemption notice (a one-process run has none: the loop's signal handler serves it)."""
    return self._manager.reached_preemption(step)

  def clock_due(self) -> bool:
    """Whether `every_minutes` passed since this invocation's start or last save, by this
    host's clock (the training loop agrees on it across hosts). Not orbax's
    ContinuousCheckpointingPolicy: that one saves at an invocation's first step whenever the
    newest checkpoint is older than the interval (a fresh run's step 1, every resume), which
    would put near-duplicates into §6.1's averaged window."""
    elapsed = time.monotonic() - self._last_save_time
    return bool(self._every_seconds) and elapsed >= self._every_seconds

  def save(self, state: Any, data_state: dict, metrics: dict[str, float] | None = None) -> None:
    """Writes the state at its own step (asynchronously; `wait` or `close` to finish), which
    the caller decided on (should_save, clock_due, a stop), with the dev `metrics` evaluated
    at that step ({'dev_loss': ...}; none: ranked last by keep_best). A step at or below the
    latest raises CheckpointNotSaved, never a save that never was."""
    step = int(state.step)
    latest = self._manager.latest_step()
    if latest is not None and step <= latest:
      raise CheckpointNotSaved(
          f'{self.directory}: declined to save checkpoint {step} there, which already holds step '
          f'{latest}: orbax never writes a step at or below its latest. Nothing was '
          'overwritten; resume from the latest checkpoint, or pick one with '
          '--config.restore_step.')
    # A full disk surfaces here (the previous save's background write) or at close: one
    # error naming the folder, not orbax's exception.
    with _checkpoint_write_errors(self.directory):
      self._manager.save(step, args=ocp.args.Composite(
          params=ocp.args.StandardSave(state.params),
          train_state=ocp.args.StandardSave({'step': state.step, 'opt_state': state.opt_state,
                                             'rng': state.rng}),
          data=ocp.args.JsonSave(data_state)), metrics=dict(metrics or {}), force=True)
    self._last_save_time = time.monotonic()
    logging.info('Saving checkpoint %d to %s', step, self.directory)

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def best_step(self) -> int | None:
    """The kept checkpoint of lowest dev loss (None: none has one)."""
    ranked = [s for s in self.steps() if math.isfinite(_dev_loss(self._manager.metrics(s) or {}))]
    return min(ranked, key=lambda s: (_dev_loss(self._manager.metrics(s)), -s), default=None)

  def set_aside(self) -> list[str]:
    """The checkpoints moved aside as unreadable (checkpoints/corrupt-*)."""
    if not os.path.isdir(self.directory):
      return []
    return sorted(n for n in os.listdir(self.directory) if n.startswith(CORRUPT))

  def restore(self, state: Any, *, step: int = 0) -> tuple[Any, dict] | None:
    """Checkpoint `step` (0: the newest readable one) as (state like `state`, data state);
    None when there is no checkpoint at all.

    A checkpoint of another shape raises CheckpointMismatch: a model change is never taken
    for corruption. A read that keeps failing (a torn or corrupt write) moves that
    checkpoint to checkpoints/corrupt-<step>/ and tries the one before; with an explicit
    `step` it is an error instead. If checkpoints were there but none could be read, that is
    an error too: training from step 0 over them needs --config.restart=True.
    """
    steps = sorted(self._manager.all_steps(), reverse=True)
    if step:
      if step not in steps:
        raise errors.UserError(f'config.restore_step={step}: {self.directory} has no checkpoint '
                               f'{step} (it has {sorted(steps)})')
      steps = [step]
    for candidate in steps:
      try:
        return self._read(candidate, state)
      except CheckpointMismatch:
        raise
      except Exception as e:  # after retries, any failure to read is "unreadable"
        denied = files.unreadable(os.path.join(self.directory, str(candidate)))
        if denied or errors.is_permission_refusal(e):  # not corruption: nothing is moved aside
          raise errors.UserError(
              f'{self.directory}/{candidate}: cannot be read (permission denied: '
              f'{denied or errors.summary(e)}); give this user read access to the checkpoints'
              ) from e
        if step:
          raise errors.UserError(f'config.restore_step={step}: {self.directory}/{step} is '
                                 f'unreadable ({errors.summary(e)})') from e
        self._move_aside(candidate, e)
    if self.set_aside():
      raise errors.UserError(
          f'No readable checkpoint in {self.directory}; unreadable ones were moved to '
          f'{", ".join(self.set_aside())}. Starting again from step 0 would lose the run: find '
          'out why they fail (a full disk? other code?), or set --config.restart=True to '
          'start from step 0 anyway.')
    return None

  def _read(self, step: int, state: Any) -> tuple[Any, dict]:
    _check_shapes(self._manager.item_metadata, step, state, f'{CHECKPOINTS}/{step}')
    return retry(lambda: self._restore(step, state), f'checkpoint {self.directory}/{step}')

  def _move_aside(self, step: int, error: Exception) -> None:
    target = os.path.join(self.directory, f'{CORRUPT}{step}')
    if jax.process_index() == 0:
      while os.path.exists(target):  # the same step was set aside before
        target += '+'
      os.rename(os.path.join(self.directory, str(step)), target)
    distributed.sync('t2t_jax_checkpoint_aside')
    self._manager.reload()
    logging.warning('Checkpoint %d in %s is unreadable (%s); moved it to %s and trying the '
                    'one before.', step, self.directory, errors.summary(error), target)

  def _restore(self, step: int, state: Any) -> tuple[Any, dict]:
    abstract = lambda tree: jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)  # noqa: E731
    train_target = {'step': state.step, 'opt_state': state.opt_state, 'rng': state.rng}
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract(state.params)),
        train_state=ocp.args.StandardRestore(abstract(train_target)),
        data=ocp.args.JsonRestore()))
    ts = restored['train_state']
    if int(ts['step']) != step:
      raise OSError(f'step {int(ts["step"])} stored under directory {step}')  # unreadable
    new_state = state.replace(step=ts['step'], params=restored['params'],
                              opt_state=ts['opt_state'], rng=ts['rng'])
    logging.info('Restored checkpoint %d from %s', step, self.directory)
    return new_state, dict(restored['data'] or {})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def reload(self) -> None:
    """Re-reads the directory (after checkpoints were moved)."""
    self._manager.reload()

  def wait(self) -> None:
    with _checkpoint_write_errors(self.directory):
      self._manager.wait_until_finished()

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    self.wait()
    self._manager.close()


def retry(read: Callable[[], Any], what: str) -> Any:
  """`read()`, tried READ_ATTEMPTS times before its error is final."""
  for attempt in range(1, READ_ATTEMPTS + 1):
    try:
      return read()
    except CheckpointMismatch:
      raise
    except Exception as e:  # the last attempt re-raises it
      if attempt == READ_ATTEMPTS or errors.is_permission_refusal(e):  # no second try helps
        raise
      logging.warning('Reading %s failed (%s); retrying in %.0f s.', what, errors.summary(e),
                      RETRY_SECONDS * attempt)
      time.sleep(RETRY_SECONDS * attempt)


def shapes(tree: Any) -> Shapes:
  """{'decoder/layer_0/ffn/w_1/kernel': (512, 2048), ...} of a tree of arrays or metadata."""
  tree = getattr(tree, 'tree', tree)  # orbax wraps item metadata in a TreeMetadata
  return {jax.tree_util.keystr(path, simple=True, separator='/'): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def shape_differences(have: Shapes, want: Shapes) -> list[tuple[str, Any, Any]]:
  """(name, shape in the checkpoint or None, expected shape or None), sorted by name."""
  return [(name, have.get(name), want.get(name)) for name in sorted(set(have) | set(want))
          if have.get(name) != want.get(name)]


def _check_shapes(metadata: Callable[[int], Any], step: int, state: Any, where: str) -> None:
  """Compares a checkpoint's metadata with the state it is restored into, before reading."""
  items = retry(lambda: metadata(step), f'the metadata of {where}')
  if items['params'] is None or items['train_state'] is None:
    raise OSError(f'{where}: no metadata for its params or train_state')  # unreadable
  differences = shape_differences(shapes(items['params']), shapes(state.params))
  if differences:
    raise CheckpointMismatch(where, differences)
  # Optimizer state paths depend on how optax's named tuples were stored: compare the
  # multiset of shapes, which any change of optimizer or model alters.
  stored = sorted(shapes(items['train_state']).values())
  expected = sorted(shapes({'step': state.step, 'opt_state': state.opt_state,
                            'rng': state.rng}).values())
  if stored != expected:
    raise CheckpointMismatch(where, [('train_state (optimizer state)', f'{len(stored)} arrays',
                                      f'{len(expected)} arrays of other shapes')])


def checkpoint_steps(workdir: str, subdir: str = CHECKPOINTS) -> list[int]:
  """The finished checkpoints' steps, oldest first (corrupt-* and temporaries are not)."""
  directory = os.path.join(workdir, subdir)
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def read_data_state(workdir: str, step: int) -> dict:
  """checkpoints/<step>/data: the input pipeline's position, and what modes/train.py records beside
  it (the seconds trained)."""
  path = os.path.join(os.path.abspath(workdir), CHECKPOINTS, str(step), 'data')
  checkpointer = ocp.Checkpointer(ocp.JsonCheckpointHandler())
  try:
    return dict(retry(lambda: checkpointer.restore(path), f'{path}') or {})
  finally:
    checkpointer.close()


