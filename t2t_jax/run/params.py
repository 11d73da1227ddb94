"""The parameters a mode decodes with (config.decode_params, config.restore_step): a run's
average (§6.1, averaging.py), a checkpoint, or the checkpoint of lowest dev loss; read
replicated on every device, whatever topology saved them, and checked against the model
the config builds before XLA sees them.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import errors, metrics, quiet
from t2t_jax.run import recorded as recorded_lib
from t2t_jax.training import checkpoints
from t2t_jax.training.checkpoints import AVERAGED, CHECKPOINTS, checkpoint_steps, retry


def restore_params(directory: str, step: int) -> Any:
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


COVERS = 'steps.json'  # averaged/<step>/steps.json: the checkpoints the mean is of


@dataclasses.dataclass(frozen=True)
class AverageRecord:
  """averaged/<step>/steps.json: the checkpoints the mean is of, and the dev losses
  --mode=average measured (None where it did not: no dev set, or an older record)."""
  steps: list[int]
  dev_loss: float | None = None
  members_dev_loss: dict[int, float] | None = None


def average_record(workdir: str, step: int) -> AverageRecord | None:
  """averaged/<step>/steps.json (None for a mean that predates the record)."""
  path = os.path.join(workdir, AVERAGED, str(step), COVERS)
  try:
    with open(path, encoding='utf-8') as f:
      record = json.load(f)
    members = record.get('members_dev_loss')
    return AverageRecord(
        [int(s) for s in record['steps']],
        None if record.get('dev_loss') is None else float(record['dev_loss']),
        None if members is None else {int(s): float(v) for s, v in members.items()})
  except FileNotFoundError:
    return None
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise errors.UserError(f'{path}: damaged ({e}); average again (--mode=average)') from None


def averaged_steps(workdir: str, step: int) -> list[int] | None:
  """The checkpoints averaged/<step>/ is the mean of (None for a mean that predates the
  record)."""
  record = average_record(workdir, step)
  return None if record is None else record.steps


@dataclasses.dataclass(frozen=True)
class Loaded:
  """Parameters read for decoding, and where from."""
  params: Any
  kind: str  # 'averaged' or 'checkpoint'
  step: int
  covers: list[int] | None  # the checkpoints behind them (an average's, None if unrecorded)
  dev_loss: float | None = None  # their dev loss where it was measured (metrics, steps.json)

  @property
  def source(self) -> str:
    """'averaged/1000' or 'checkpoints/1000': the folder under the workdir."""
    return f'{AVERAGED if self.kind == "averaged" else CHECKPOINTS}/{self.step}'

  def describe(self) -> str:
    """'averaged/1000 (the mean of checkpoints [850, 900, 950, 1000]; dev loss 1.234)'."""
    parts = []
    if self.kind == 'averaged' and self.covers:
      parts.append(f'the mean of checkpoints {self.covers}')
    if self.dev_loss is not None:
      parts.append(f'dev loss {self.dev_loss:.4f}')
    return f'{self.source} ({"; ".join(parts)})' if parts else self.source


def parse_run(spec: str, key: str) -> tuple[str, int]:
  """'DIR' -> (DIR, 0), 'DIR:STEP' -> (DIR, STEP): a run and the step to read (0: its
  average if it has one, else its newest checkpoint); an errors.UserError names `key`."""
  folder, colon, step = spec.rpartition(':') if ':' in spec else (spec, '', '')
  if not folder or (colon and not step.isdigit()):
    raise errors.UserError(f'{key}={spec!r}: expected DIR or DIR:STEP')
  return folder, int(step) if colon else 0


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
    ranked = ranked_steps(workdir, key="config.decode_params='best'")
    best, losses = ranked[0], metrics.dev_losses(workdir)
    logging.info("config.decode_params='best': %s/%d, the lowest of the kept checkpoints' dev "
                 'losses (%s).', CHECKPOINTS, best,
                 ', '.join(f'{s}: {losses[s]:.4f}' for s in sorted(ranked)))
    which, step = 'checkpoint', best
  kinds = ('averaged', 'checkpoint') if which == 'auto' else (which,)
  for kind in kinds:
    subdir = AVERAGED if kind == 'averaged' else CHECKPOINTS
    steps = [s for s in checkpoint_steps(workdir, subdir) if not step or s == step]
    if kind == 'averaged' and steps and not step:
      _warn_if_stale(workdir, steps[-1])
    for s in reversed(steps):
      where = os.path.join(workdir, subdir, str(s))
      try:
        read = functools.partial(restore_params, os.path.join(workdir, subdir), s)
        if kind == 'averaged':
          record = average_record(workdir, s)
          covers, loss = (None, None) if record is None else (record.steps, record.dev_loss)
        else:
          covers, loss = [s], metrics.dev_losses(workdir).get(s)
        return Loaded(retry(read, where), kind, s, covers, loss)
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


def mismatch_message(error: checkpoints.CheckpointMismatch, model: ModelConfig,
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


def check_params_match(params: Any, config: ml_collections.ConfigDict,
                       model_config: ModelConfig, source: str, workdir: str) -> None:
  """A checkpoint from another config fails here with the parameter named, not in XLA."""
  dummy = np.ones((1, 1), np.int32)
  expected = jax.eval_shape(lambda: Transformer(model_config).init(
      jax.random.PRNGKey(0), dummy, dummy)['params'])
  differences = checkpoints.shape_differences(checkpoints.shapes(params),
                                              checkpoints.shapes(expected))
  if differences:
    recorded = recorded_lib.load_config(workdir)
    changes = (recorded_lib.config_differences(recorded, recorded_lib.config_dict(config))
               if recorded is not None else None)
    error = checkpoints.CheckpointMismatch(source, differences)
    raise errors.UserError(f'{mismatch_message(error, model_config, changes)} Decode '
                           'with the config the run was trained with.')
