"""Checkpoints through orbax (§6.1: "written at 10-minute intervals") and their averaging (§6.1).

A workdir holds
  checkpoints/<step>/params       the model parameters
  checkpoints/<step>/train_state  step, Adam state and dropout RNG
  checkpoints/<step>/data         the input iterator's position (JSON)
  checkpoints/corrupt-<step>/     a checkpoint that could not be read, moved aside
  averaged/<step>/params          the mean of the last K checkpoints' parameters
  averaged/<step>/steps.json      which checkpoints that mean is of
orbax writes each checkpoint into a temporary directory and renames it when complete, so
a crash mid-write never leaves a checkpoint that looks finished.

Nothing here fails quietly: a checkpoint of another model shape is an error naming the
parameter (never "unreadable, start over"), a save orbax declines is an error, and a
checkpoint that stays unreadable after retries is moved aside, not deleted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from t2t_jax.model.transformer import ModelConfig
from t2t_jax.platform import distributed, errors, files, metrics, quiet
from t2t_jax.platform import workdir as workdir_lib

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
  """orbax declined a save (it never writes a step at or below its latest one)."""


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


class Checkpointer:
  """Saves every `every_steps` steps and/or `every_minutes` minutes; keeps the last `keep`."""

  def __init__(self, workdir: str, *, keep: int, every_steps: int = 0, every_minutes: float = 0.0):
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINTS))
    self._every_steps, self._every_seconds = every_steps, every_minutes * 60
    self._last_save_time = time.monotonic()
    self._remove_torn_writes()
    # Handlers named up front, so that item_metadata can read shapes before any restore.
    self._manager = ocp.CheckpointManager(
        self.directory, item_handlers={'params': ocp.StandardCheckpointHandler(),
                                       'train_state': ocp.StandardCheckpointHandler(),
                                       'data': ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(max_to_keep=keep))
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
    """Closes; after an error, without raising a second one over it. After a refused write
    it waits for nothing: the others in flight fail too, and main ends the process."""
    if kind is None:
      self.close()
    elif not self._closed and not isinstance(error, CheckpointWriteError):
      self._abandon()
    self._closed = True

  def _abandon(self) -> None:
    """Lets a save in flight finish (or fail, logged): the error that stopped the run is
    the one to report, and a write cut off at exit would be lost work."""
    self._closed = True
    try:
      self._manager.wait_until_finished()
      self._manager.close()
    except Exception as e:  # the run already stops with another error
      logging.warning('Checkpoint writes in %s did not finish: %s', self.directory,
                      errors.summary(e))

  def is_due(self, step: int) -> bool:
    """Whether `step` is a periodic save by this host's clock: a multi-process run must
    agree on the answer (the training loop does, with its other per-step decisions)."""
    due = bool(self._every_steps) and step % self._every_steps == 0
    elapsed = time.monotonic() - self._last_save_time
    return due or bool(self._every_seconds and elapsed >= self._every_seconds)

  def save(self, state: Any, data_state: dict) -> None:
    """Writes the state at its own step (asynchronously; `wait` or `close` to finish).

    Raises CheckpointNotSaved if orbax declines, instead of logging a save that never was.
    """
    step = int(state.step)
    # A full disk surfaces here (the previous save's background write) or at close: one
    # error naming the folder, not orbax's exception.
    with _checkpoint_write_errors(self.directory):
      saved = self._manager.save(step, args=ocp.args.Composite(
          params=ocp.args.StandardSave(state.params),
          train_state=ocp.args.StandardSave({'step': state.step, 'opt_state': state.opt_state,
                                             'rng': state.rng}),
          data=ocp.args.JsonSave(data_state)))
    if not saved:
      raise CheckpointNotSaved(
          f'orbax declined to save checkpoint {step} in {self.directory}, which already holds '
          f'step {self._manager.latest_step()}: it never writes a step at or below its latest. '
          'Nothing was overwritten; resume from the latest checkpoint, or pick one with '
          '--config.restore_step.')
    self._last_save_time = time.monotonic()
    logging.info('Saving checkpoint %d to %s', step, self.directory)

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

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
        if errors.is_permission_refusal(e):  # not corruption: nothing is moved aside
          raise errors.UserError(
              f'{self.directory}/{candidate}: cannot be read (permission denied: '
              f'{errors.summary(e)}); give this user read access to the checkpoints') from e
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
    with _checkpoint_write_errors(self.directory):
      self._manager.wait_until_finished()
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
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = '/'.join(str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))) for k in path)
    out[name] = tuple(leaf.shape)
  return out


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


def config_keys_behind(differences: list[tuple[str, Any, Any]], model: ModelConfig) -> list[str]:
  """The config keys whose values explain the differing shapes (a best guess)."""
  keys = set()
  sizes = {'config.vocab_size': model.vocab_size, 'config.model.d_model': model.d_model,
           'config.model.d_ff': model.d_ff, 'config.model.num_heads': model.num_heads,
           'config.model.d_k': model.key_size, 'config.model.d_v': model.value_size,
           'config.model.max_len': model.max_len}
  for name, have, want in differences:
    if have is None or want is None:
      keys.add('config.model.positional' if 'positions' in name else 'config.model.num_layers')
      continue
    for h, w in zip(have, want, strict=False):  # ranks may differ
      if h != w:
        keys.update(key for key, value in sizes.items() if value == w)
  return sorted(keys)


def mismatch_message(error: CheckpointMismatch, model: ModelConfig,
                     recorded: dict[str, tuple[Any, Any]] | None) -> str:
  """One paragraph: which parameter differs, and which config keys made it differ."""
  absent = lambda shape: 'absent' if shape is None else shape  # noqa: E731
  shown = '; '.join(f'{name}: {absent(have)} there, {absent(want)} now'
                    for name, have, want in error.differences[:3])
  more = f' (and {len(error.differences) - 3} more)' if len(error.differences) > 3 else ''
  model_changes = {k: v for k, v in (recorded or {}).items()
                   if k.startswith('config.model.') or k == 'config.vocab_size'}
  if model_changes:
    why = 'the run was started with ' + ', '.join(
        f'{k}={old!r} (now {new!r})' for k, (old, new) in model_changes.items())
  else:
    why = 'check ' + (', '.join(config_keys_behind(error.differences, model))
                      or 'config.model.* and config.vocab_size')
  return f'{error.where} holds another model than this config builds: {shown}{more}; {why}.'


def checkpoint_steps(workdir: str, subdir: str = CHECKPOINTS) -> list[int]:
  """The finished checkpoints' steps, oldest first (corrupt-* and temporaries are not)."""
  directory = os.path.join(workdir, subdir)
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def read_data_state(workdir: str, step: int) -> dict:
  """checkpoints/<step>/data: the input pipeline's position, and what trainer.py records beside
  it (the seconds trained)."""
  path = os.path.join(os.path.abspath(workdir), CHECKPOINTS, str(step), 'data')
  checkpointer = ocp.Checkpointer(ocp.JsonCheckpointHandler())
  try:
    return dict(retry(lambda: checkpointer.restore(path), f'{path}') or {})
  finally:
    checkpointer.close()


def _restore_params(directory: str, step: int) -> Any:
  """directory/<step>/params, replicated on every device, whatever topology saved it."""
  path = os.path.join(os.path.abspath(directory), str(step), 'params')
  replicated = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.asarray(jax.devices()), ('replica',)), jax.sharding.PartitionSpec())
  quiet.drop_orbax_metadata_warning()
  checkpointer = ocp.StandardCheckpointer()
  try:
    metadata = checkpointer.metadata(path).item_metadata
    abstract = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=replicated), metadata)
    return checkpointer.restore(path, abstract)
  finally:
    checkpointer.close()


@dataclasses.dataclass(frozen=True)
class Loaded:
  """Parameters read for decoding, and where from."""
  params: Any
  kind: str  # 'averaged' or 'checkpoint'
  step: int

  @property
  def source(self) -> str:
    """'averaged/1000' or 'checkpoints/1000': the folder under the workdir."""
    return f'{AVERAGED if self.kind == "averaged" else CHECKPOINTS}/{self.step}'


PARAMS_CHOICES = ('auto', 'averaged', 'checkpoint', 'best')


def ranked_steps(workdir: str, *, key: str) -> list[int]:
  """The kept checkpoints that have a dev loss (metrics.dev_losses: only steps where
  training evaluated the dev set), lowest loss first; ties go to the later step. None is an
  errors.UserError naming `key` and the fix."""
  losses = metrics.dev_losses(workdir)
  kept = [s for s in checkpoint_steps(workdir) if s in losses]
  if not kept:
    raise errors.UserError(
        f'{key}: no checkpoint in {workdir}/{CHECKPOINTS} has a dev loss in metrics.jsonl '
        '(training records one every config.eval_every_steps; make checkpoint_every_steps a '
        'multiple of it)')
  return sorted(kept, key=lambda s: (losses[s], -s))


def best_steps(workdir: str, count: int, *, key: str) -> list[int]:
  """The `count` best of ranked_steps (fewer where fewer have a dev loss), in step order."""
  return sorted(ranked_steps(workdir, key=key)[:count])


def load_params(workdir: str, *, which: str = 'auto', step: int = 0) -> Loaded:
  """Parameters for decoding (config.decode_params, config.restore_step).

  which: 'auto' = the averaged model when there is one (at `step`, if given), else the
  checkpoint; 'averaged' or 'checkpoint' to choose; 'best' = the checkpoint of lowest dev
  loss (best_steps). step: 0 = the newest. Without a step, an unreadable newest one is
  named in a warning and the one before it used; an explicit step that cannot be read is
  an error.
  """
  if which not in PARAMS_CHOICES:
    raise errors.UserError(f'config.decode_params={which!r}: choose one of {PARAMS_CHOICES}')
  if which == 'best':
    if step:
      raise errors.UserError(f"config.restore_step={step}: config.decode_params='best' "
                             'chooses the step itself; set one or the other')
    [best] = best_steps(workdir, 1, key="config.decode_params='best'")
    logging.info('The checkpoint of lowest dev loss: %s/%d.', CHECKPOINTS, best)
    which, step = 'checkpoint', best
  kinds = {'auto': ('averaged', 'checkpoint'), 'averaged': ('averaged',),
           'checkpoint': ('checkpoint',)}[which]
  for kind in kinds:
    subdir = AVERAGED if kind == 'averaged' else CHECKPOINTS
    steps = [s for s in checkpoint_steps(workdir, subdir) if not step or s == step]
    if kind == 'averaged' and steps and not step:
      _warn_if_stale(workdir, steps[-1])
    for s in reversed(steps):
      where = os.path.join(workdir, subdir, str(s))
      try:
        read = functools.partial(_restore_params, os.path.join(workdir, subdir), s)
        return Loaded(retry(read, where), kind, s)
      except Exception as e:  # named, then the one before is tried
        if step:
          raise errors.UserError(f'config.restore_step={step}: {where} is unreadable '
                                 f'({errors.summary(e)})') from e
        logging.warning('%s is unreadable (%s); using the one before it.', where,
                        errors.summary(e))
  found = {kind: checkpoint_steps(workdir, AVERAGED if kind == 'averaged' else CHECKPOINTS)
           for kind in kinds}
  if step and any(found.values()):  # a step the run does not have: say which it has
    has = '; '.join(f'{kind} steps {steps}' for kind, steps in found.items())
    raise errors.MissingFileError(
        f'{workdir} has no {" or ".join(kinds)} at step {step} (config.decode_params={which!r}, '
        f'config.restore_step={step}, or DIR:{step}); it has {has}')
  wanted = f'step {step} ' if step else ''
  raise errors.MissingFileError(
      f'No readable {" or ".join(kinds)} {wanted}in {workdir} (config.decode_params={which!r}'
      f'{f", config.restore_step={step}" if step else ""}): train first (--mode=train), or '
      '--mode=average for averaged parameters')


def _warn_if_stale(workdir: str, averaged_step: int) -> None:
  latest = checkpoint_steps(workdir)
  if latest and latest[-1] > averaged_step:
    logging.warning('Using %s/%d although training has reached step %d: run --mode=average '
                    'again to average the newest checkpoints, or set '
                    '--config.decode_params=checkpoint.', AVERAGED, averaged_step, latest[-1])


def average_checkpoints(workdir: str, last: int, *, allow_fewer: bool = False, step: int = 0,
                        best: bool = False) -> tuple[int, list[int]]:
  """Averages the parameters of the last `last` checkpoints into averaged/<step>/ (§6.1).

  The last ones up to `step` (config.restore_step; 0 = the newest), or with `best`
  (config.average_select='best') the `last` of lowest dev loss (best_steps). An unreadable
  checkpoint is named in a warning and skipped: the next older one takes its place.
  Accumulates in float32 one checkpoint at a time (memory: two copies of the params),
  then casts back to each parameter's dtype. Returns (step, the steps averaged).
  """
  directory = os.path.join(workdir, CHECKPOINTS)
  steps = checkpoint_steps(workdir)
  if step:
    if step not in steps:
      raise errors.UserError(f'config.restore_step={step}: {directory} has no checkpoint {step} '
                             f'(it has {steps})')
    steps = [s for s in steps if s <= step]
  if best:
    # Taken from the end, best first: an unreadable one gives its place to the next best, as
    # it does to the next older.
    steps = [s for s in ranked_steps(workdir, key="config.average_select='best'")
             if s in steps][::-1]
  if not steps:
    raise errors.MissingFileError(f'No checkpoint in {directory} to average')
  chosen, total, dtypes = [], None, None
  for s in reversed(steps):
    if len(chosen) == last:
      break
    try:
      params = retry(functools.partial(_restore_params, directory, s), f'{directory}/{s}')
    except Exception as e:  # named and skipped
      logging.warning('%s/%d is unreadable (%s); averaging without it.', directory, s,
                      errors.summary(e))
      continue
    chosen.append(s)
    params32 = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
    total = params32 if total is None else jax.tree_util.tree_map(np.add, total, params32)
    dtypes = jax.tree_util.tree_map(lambda x: np.asarray(x).dtype, params)
  chosen.sort()
  if not chosen:
    raise errors.UserError(f'No readable checkpoint in {directory} to average (see the warnings)')
  if len(chosen) < last:
    message = (f'config.average_last={last} but {directory} holds only {len(chosen)} readable '
               f'checkpoint(s){f" up to step {step}" if step else ""}: {chosen}')
    if not allow_fewer:
      raise errors.UserError(message + '; set --config.average_allow_fewer=True to average those')
    logging.warning('%s; averaging those.', message)
  mean = jax.tree_util.tree_map(lambda t, d: (t / len(chosen)).astype(d), total, dtypes)
  _publish_mean(workdir, chosen, mean)
  logging.info('Averaged checkpoints %s into %s/%d', chosen, AVERAGED, chosen[-1])
  return chosen[-1], chosen


COVERS = 'steps.json'  # averaged/<step>/steps.json: the checkpoints the mean is of


def _publish_mean(workdir: str, steps: list[int], mean: Any) -> None:
  """Writes averaged/<step>/{params,steps.json} into a temporary sibling and renames it into
  place when complete: a kill or a full disk leaves the earlier mean of that step (moved
  into previous-<time>/ only once the new one is whole) and never a half-written one."""
  directory = os.path.join(workdir, AVERAGED)
  # One name on every process (they write one checkpoint together); a killed run's is
  # removed by the next averaging of that step, or after a day by sweep_temp_dirs.
  tmp = os.path.join(directory, f'.tmp-averaging-{steps[-1]}')
  if jax.process_index() == 0:
    os.makedirs(directory, exist_ok=True)
    files.sweep_temp_dirs(directory)
    shutil.rmtree(tmp, ignore_errors=True)
  distributed.sync('t2t_jax_average_start')
  checkpointer = ocp.StandardCheckpointer()
  with files.disk_write_errors(tmp, 'the averaged parameters'):
    checkpointer.save(os.path.join(os.path.abspath(tmp), 'params'),
                      jax.tree_util.tree_map(jnp.asarray, mean))
    checkpointer.wait_until_finished()
    checkpointer.close()
    if jax.process_index() == 0:
      files.write_text(os.path.join(tmp, COVERS), json.dumps({'steps': steps}) + '\n')
      workdir_lib.publish_output(workdir, tmp, f'{AVERAGED}/{steps[-1]}')
  distributed.sync('t2t_jax_average_done')


def averaged_steps(workdir: str, step: int) -> list[int] | None:
  """The checkpoints averaged/<step>/ is the mean of (None for a mean that predates the
  record)."""
  path = os.path.join(workdir, AVERAGED, str(step), COVERS)
  try:
    with open(path, encoding='utf-8') as f:
      return [int(s) for s in json.load(f)['steps']]
  except FileNotFoundError:
    return None
  except (ValueError, KeyError, TypeError) as e:
    raise errors.UserError(f'{path}: damaged ({e}); average again (--mode=average)') from None


def save_params(directory: str, step: int, params: Any) -> None:
  """Writes params alone to directory/<step>/params, atomically (orbax renames when done)."""
  manager = ocp.CheckpointManager(os.path.abspath(directory), item_names=('params',),
                                  options=ocp.CheckpointManagerOptions(
                                      enable_async_checkpointing=False,
                                      cleanup_tmp_directories=True))
  if step in manager.all_steps():  # re-averaging the same checkpoints replaces the old mean
    manager.delete(step)
  manager.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(
      jax.tree_util.tree_map(jnp.asarray, params))))
  manager.close()
