"""§6.1: "For the base models, we used a single model obtained by averaging the last 5
checkpoints ... For the big models, we averaged the last 20 checkpoints." The mean is written
to averaged/<step>/params, beside steps.json: the checkpoints it is the mean of and, where it
was measured (--mode=average does, run/dev_loss.py), the dev loss of the mean and of each.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from t2t_jax.platform import distributed, errors, files
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.run.params import COVERS, ranked_steps, restore_params
from t2t_jax.training.checkpoints import AVERAGED, CHECKPOINTS, checkpoint_steps, retry


def average_checkpoints(workdir: str, last: int, *, allow_fewer: bool = False, step: int = 0,
                        best: bool = False, dev_loss: Callable[[Any], float] | None = None,
                        ) -> tuple[int, list[int]]:
  """Averages the parameters of the last `last` checkpoints into averaged/<step>/ (§6.1).

  The last ones up to `step` (config.restore_step; 0 = the newest), or with `best`
  (config.average_select='best') the `last` of lowest dev loss (best_steps). An unreadable
  checkpoint is named in a warning and skipped: the next older one takes its place.
  Accumulates in float32 one checkpoint at a time (memory: two copies of the params),
  then casts back to each parameter's dtype. With `dev_loss` (parameters -> their dev loss),
  each checkpoint is measured as it is read, and the mean before it is written: steps.json
  records them (params.AverageRecord). Returns (step, the steps averaged).
  """
  if jax.process_index() == 0:  # before the checkpoints are read: minutes for a big model
    files.writable_folder(os.path.join(workdir, AVERAGED), workdir, 'the averaged parameters')
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
  chosen, total, dtypes, losses = [], None, None, {}
  for s in reversed(steps):
    if len(chosen) == last:
      break
    try:
      params = retry(functools.partial(restore_params, directory, s), f'{directory}/{s}')
    except Exception as e:  # named and skipped
      logging.warning('%s/%d is unreadable (%s); averaging without it.', directory, s,
                      errors.summary(e))
      continue
    chosen.append(s)
    if dev_loss is not None:
      losses[s] = dev_loss(params)
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
  record: dict[str, Any] = {'steps': chosen}
  if dev_loss is not None:
    record.update(dev_loss=dev_loss(mean), members_dev_loss={str(s): losses[s] for s in chosen})
  _publish_mean(workdir, chosen, mean, record)
  return chosen[-1], chosen


def _publish_mean(workdir: str, steps: list[int], mean: Any, record: dict[str, Any]) -> None:
  """Writes averaged/<step>/{params,steps.json} into a temporary sibling and renames it into
  place when complete: a kill or a full disk leaves the earlier mean of that step (moved
  into previous-<time>/ only once the new one is whole) and never a half-written one."""
  directory = os.path.join(workdir, AVERAGED)
  # One name on every process (they write one checkpoint together); a killed run's is
  # removed by the next averaging of that step, or after a day by sweep_temp_dirs.
  tmp = os.path.join(directory, f'.tmp-averaging-{steps[-1]}')
  if jax.process_index() == 0:
    files.writable_folder(directory, workdir, 'the averaged parameters')
    files.sweep_temp_dirs(directory)
    shutil.rmtree(tmp, ignore_errors=True)
    # Made here, not by orbax: a folder orbax fails to make leaves its writer threads waiting
    # for it, and the process would never exit after the error.
    with files.disk_write_errors(tmp, 'the averaged parameters'):
      os.mkdir(tmp, files.FOLDER_MODE)
  distributed.sync('t2t_jax_average_start')
  checkpointer = ocp.StandardCheckpointer()
  with files.disk_write_errors(tmp, 'the averaged parameters'):
    try:
      checkpointer.save(os.path.join(os.path.abspath(tmp), 'params'),
                        jax.tree_util.tree_map(jnp.asarray, mean))
      checkpointer.wait_until_finished()
    finally:
      checkpointer.close()
    if jax.process_index() == 0:
      files.write_text(os.path.join(tmp, COVERS), json.dumps(record) + '\n')
      workdir_lib.publish_output(workdir, tmp, f'{AVERAGED}/{steps[-1]}')
  distributed.sync('t2t_jax_average_done')
