"""Fine-tuning (not in the paper): a new run that starts from another run's parameters.

`config.init_from='DIR'` (or `'DIR:STEP'`) starts a run from the parameters of the run
trained in DIR: its average if it has one, else its newest checkpoint (at STEP if given:
params.py's `load_params`), with a fresh optimizer (Adam's moments at zero) and the §5.3
schedule from step 1. The new run reuses DIR's vocabulary, copied into its own `vocab/`,
so the ids mean the same pieces; the model keys (but the dropout rate), vocab_size and
languages must agree with DIR's recorded config, as on a resume. Only a run's start reads
DIR: once the new run has a checkpoint, it resumes from that.
"""
from __future__ import annotations

import filecmp
import os
import shutil
from typing import Any

import jax
import ml_collections
from absl import logging

from t2t_jax.platform import errors, files
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.run import params as params_lib
from t2t_jax.run import recorded as recorded_lib

VOCABULARY_FILES = ('spm.vocab', 'spm.model')  # the model last: it means complete
# What a fine-tuning run may set otherwise than its source: besides the arithmetic's dtype
# and forms, the dropout rate, which shapes no parameter.
MAY_DIFFER = recorded_lib.MAY_DIFFER | {'config.model.dropout_rate'}


def source(init_from: str) -> tuple[str, int]:
  """'DIR' -> (DIR, 0); 'DIR:STEP' -> (DIR, STEP)."""
  return params_lib.parse_run(init_from, 'config.init_from')


def check_source(config: ml_collections.ConfigDict, init_from: str) -> str:
  """The source run's folder, after checking that its recorded config agrees with `config`
  on every key its parameters and vocabulary were made with."""
  folder, _ = source(init_from)
  recorded = recorded_lib.load_config(folder)
  where = os.path.join(folder, workdir_lib.CONFIG)
  if recorded is None:
    raise errors.MissingFileError(f'config.init_from={init_from!r}: {where}: no recorded run '
                                  'there (training records it)')
  try:
    recorded_lib.check_against_recorded(config, recorded, where, may_differ=MAY_DIFFER)
  except errors.UserError as e:
    raise errors.UserError(f'config.init_from={init_from!r}: {e}') from None
  return folder


def adopt_vocabulary(config: ml_collections.ConfigDict, init_from: str, workdir: str) -> None:
  """Copies the source run's vocabulary into `workdir/vocab/`; a different vocabulary
  already there is an error naming both files."""
  if config.dataset == 'synthetic':
    return  # token ids are the task itself: no vocabulary
  folder, _ = source(init_from)
  theirs = os.path.join(folder, 'vocab', 'spm.model')
  ours = os.path.join(workdir, 'vocab', 'spm.model')
  if not os.path.exists(theirs):
    raise errors.MissingFileError(f'config.init_from={init_from!r}: {theirs}: no vocabulary '
                                  'there')
  if os.path.exists(ours):
    if not filecmp.cmp(theirs, ours, shallow=False):
      raise errors.UserError(f'config.init_from={init_from!r}: {ours} is another vocabulary '
                             f'than {theirs}; fine-tuning needs the same pieces (use a new '
                             '--workdir, or remove its vocab/ folder)')
    return
  files.make_folder(os.path.dirname(ours), workdir, 'the vocabulary')
  tmp = files.make_temp_dir(os.path.dirname(ours))
  try:
    with files.disk_write_errors(os.path.dirname(ours), 'the vocabulary'):
      for name in VOCABULARY_FILES:
        shutil.copyfile(os.path.join(folder, 'vocab', name), os.path.join(tmp, name))
        files.publish(os.path.join(tmp, name), os.path.join(os.path.dirname(ours), name))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  logging.info('Vocabulary: %s, copied from %s (config.init_from).', ours, theirs)


def initial_params(state: Any, init_from: str) -> Any:
  """`state` (a fresh one: step 0, Adam's moments zero) with the source run's parameters,
  placed as state.params are."""
  folder, step = source(init_from)
  loaded = params_lib.load_params(folder, step=step)
  if jax.tree_util.tree_structure(loaded.params) != jax.tree_util.tree_structure(state.params):
    raise errors.UserError(f'config.init_from={init_from!r}: {folder}/{loaded.source} holds '
                           'other parameters than this model has')
  params = jax.tree_util.tree_map(
      lambda new, old: jax.device_put(jax.numpy.asarray(new, old.dtype), old.sharding),
      loaded.params, state.params)
  logging.info('Starting from the parameters of %s/%s (config.init_from), with a fresh '
               'optimizer and schedule.', folder, loaded.source)
  return state.replace(params=params)
