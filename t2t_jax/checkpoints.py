"""Checkpoints through orbax (§5.2: one every 10 minutes) and checkpoint averaging (§6.1).

A workdir holds
  checkpoints/<step>/params       the model parameters
  checkpoints/<step>/train_state  step, Adam state and dropout RNG
  checkpoints/<step>/data         the input iterator's position (JSON)
  averaged/<step>/params          the mean of the last K checkpoints' parameters
orbax writes each checkpoint into a temporary directory and renames it when complete, so
a crash mid-write never leaves a checkpoint that looks finished.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

CHECKPOINTS = 'checkpoints'
AVERAGED = 'averaged'


class Checkpointer:
  """Saves every `every_steps` steps and/or `every_minutes` minutes; keeps the last `keep`."""

  def __init__(self, workdir: str, *, keep: int, every_steps: int = 0, every_minutes: float = 0.0):
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINTS))
    self._every_steps, self._every_seconds = every_steps, every_minutes * 60
    self._last_save_time = time.monotonic()
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=('params', 'train_state', 'data'),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, cleanup_tmp_directories=True))

  def should_save(self, step: int) -> bool:
    """Same answer on every host: the clock of process 0 decides for all."""
    due = bool(self._every_steps) and step % self._every_steps == 0
    if self._every_seconds and time.monotonic() - self._last_save_time >= self._every_seconds:
      due = True
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      due = bool(multihost_utils.broadcast_one_to_all(np.array(due)))
    return due

  def save(self, state: Any, data_state: dict) -> None:
    """Writes the state at its own step (asynchronously; `wait` or `close` to finish)."""
    step = int(state.step)
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(state.params),
        train_state=ocp.args.StandardSave({'step': state.step, 'opt_state': state.opt_state,
                                           'rng': state.rng}),
        data=ocp.args.JsonSave(data_state)))
    self._last_save_time = time.monotonic()
    logging.info('Saving checkpoint %d to %s', step, self.directory)

  def restore_latest(self, state: Any) -> tuple[Any, dict] | None:
    """The newest readable checkpoint as (state like `state`, data state), or None.

    A checkpoint that fails to restore (truncated, corrupt) is skipped with a warning and
    the one before it is tried, so one bad write never ends a run.
    """
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        return self._restore(step, state)
      except Exception as e:  # noqa: BLE001 — any failure to read means: use an older one
        logging.warning('Checkpoint %d in %s is unreadable (%s: %s); trying the one before.',
                        step, self.directory, type(e).__name__, str(e)[:300])
    return None

  def _restore(self, step: int, state: Any) -> tuple[Any, dict]:
    abstract = lambda tree: jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, tree)  # noqa: E731
    train_target = {'step': state.step, 'opt_state': state.opt_state, 'rng': state.rng}
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract(state.params)),
        train_state=ocp.args.StandardRestore(abstract(train_target)),
        data=ocp.args.JsonRestore()))
    ts = restored['train_state']
    if int(ts['step']) != step:
      raise ValueError(f'step {int(ts["step"])} stored under directory {step}')
    new_state = state.replace(step=ts['step'], params=restored['params'],
                              opt_state=ts['opt_state'], rng=ts['rng'])
    logging.info('Restored checkpoint %d from %s', step, self.directory)
    return new_state, dict(restored['data'] or {})

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def checkpoint_steps(workdir: str, subdir: str = CHECKPOINTS) -> list[int]:
  """The finished checkpoints' steps, oldest first."""
  directory = os.path.join(workdir, subdir)
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def _restore_params(directory: str, step: int) -> Any:
  """directory/<step>/params, replicated on every device, whatever topology saved it."""
  path = os.path.join(os.path.abspath(directory), str(step), 'params')
  replicated = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.asarray(jax.devices()), ('replica',)), jax.sharding.PartitionSpec())
  checkpointer = ocp.StandardCheckpointer()
  try:
    metadata = checkpointer.metadata(path).item_metadata
    abstract = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=replicated), metadata)
    return checkpointer.restore(path, abstract)
  finally:
    checkpointer.close()


def load_params(workdir: str, *, prefer_averaged: bool = True) -> tuple[Any, str]:
  """Parameters for decoding: the averaged model when there is one, else the latest
  checkpoint. Returns (params, where they came from, e.g. 'averaged/1000')."""
  latest = checkpoint_steps(workdir)
  for subdir in ((AVERAGED, CHECKPOINTS) if prefer_averaged else (CHECKPOINTS,)):
    steps = checkpoint_steps(workdir, subdir)
    if steps:
      if subdir == AVERAGED and latest and latest[-1] > steps[-1]:
        logging.warning('Using %s/%d although training has reached step %d: run '
                        '--mode=average again to average the newest checkpoints.',
                        AVERAGED, steps[-1], latest[-1])
      directory = os.path.join(workdir, subdir)
      return _restore_params(directory, steps[-1]), f'{subdir}/{steps[-1]}'
  raise FileNotFoundError(f'No checkpoint in {os.path.join(workdir, CHECKPOINTS)}: train first '
                          '(--mode=train)')


def average_checkpoints(workdir: str, last: int, *, allow_fewer: bool = False) -> tuple[int, list[int]]:
  """Averages the parameters of the last `last` checkpoints into averaged/<step>/ (§6.1).

  Accumulates in float32 one checkpoint at a time (memory: two copies of the params),
  then casts back to each parameter's dtype. Returns (step, the steps averaged).
  """
  steps = checkpoint_steps(workdir)
  if not steps:
    raise FileNotFoundError(f'No checkpoint in {os.path.join(workdir, CHECKPOINTS)} to average')
  if len(steps) < last:
    message = (f'config.average_last={last} but {os.path.join(workdir, CHECKPOINTS)} holds only '
               f'{len(steps)} checkpoint(s): {steps}')
    if not allow_fewer:
      raise ValueError(message + '; set --config.average_allow_fewer=True to average those')
    logging.warning('%s; averaging those.', message)
  chosen = steps[-last:]
  directory = os.path.join(workdir, CHECKPOINTS)
  total = None
  for step in chosen:
    params = _restore_params(directory, step)
    params32 = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
    total = params32 if total is None else jax.tree_util.tree_map(np.add, total, params32)
    dtypes = jax.tree_util.tree_map(lambda x: np.asarray(x).dtype, params)
  mean = jax.tree_util.tree_map(lambda s, d: (s / len(chosen)).astype(d), total, dtypes)
  save_params(os.path.join(workdir, AVERAGED), chosen[-1], mean)
  logging.info('Averaged checkpoints %s into %s/%d', chosen, AVERAGED, chosen[-1])
  return chosen[-1], chosen


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
