"""A trained run's vocabulary is part of the run: its ids mean the pieces of vocab/spm.model.
Each checkpoint records that vocabulary's fingerprint (tokenizer.py) beside the data
position, and every mode that reads a run's parameters with a vocabulary checks it is the
same one: a resume, a fine-tuning start (init_from.py) and an ensemble (ensemble.py).
"""
from __future__ import annotations

import os
from typing import Any

import ml_collections

from t2t_jax.data import pipeline
from t2t_jax.platform import errors, files
from t2t_jax.training import checkpoints

# The key of the fingerprint in a checkpoint's data/ item.
VOCABULARY = 'vocabulary'


def fingerprint(tokenizer: Any) -> str:
  """The tokenizer's fingerprint ('' for the synthetic task's ids, which have none)."""
  return getattr(tokenizer, 'fingerprint', '')


def check_kept(config: ml_collections.ConfigDict, workdir: str) -> None:
  """With checkpoints present, a missing vocab/spm.model is an error, never a new
  vocabulary trained silently under them."""
  path = os.path.join(workdir, 'vocab', 'spm.model')
  if (config.dataset != 'synthetic' and checkpoints.checkpoint_steps(workdir)
      and not files.exists(path, 'the vocabulary')):
    raise errors.UserError(
        f'{path}: missing, but {workdir} holds checkpoints trained with it; restore the '
        'vocab/ folder, or set --config.restart=True to train anew (the checkpoints are '
        'moved aside)')


def check_recorded(data_state: dict, tokenizer: Any, workdir: str) -> None:
  """A restored checkpoint's recorded fingerprint (absent in one saved before it was
  recorded) is the fingerprint of the vocabulary now in the workdir."""
  recorded, now = data_state.get(VOCABULARY), fingerprint(tokenizer)
  if recorded is not None and recorded != now:
    raise errors.UserError(
        f'{os.path.join(workdir, "vocab", "spm.model")}: not the vocabulary the checkpoints '
        f'were trained with (fingerprint {now}, recorded {recorded}); restore that vocab/ '
        'folder, or set --config.restart=True')


def check_same(config: ml_collections.ConfigDict, member: ml_collections.ConfigDict,
               folder: str, workdir: str, tokenizer: Any) -> None:
  """An ensemble averages log-probabilities of the same pieces in the same languages: the
  run in `folder` must translate the workdir's pair with a vocabulary of its fingerprint
  (as every host's must in a multi-process run)."""
  pairs = [f'{c.source_lang}→{c.target_lang}' for c in (member, config)]
  if pairs[0] != pairs[1]:
    raise errors.UserError(f'config.ensemble: {folder} translates {pairs[0]}, {workdir} '
                           f'{pairs[1]}; the runs of an ensemble translate the same pair')
  theirs = pipeline.load_tokenizer(member, folder)
  if theirs.fingerprint != tokenizer.fingerprint:
    raise errors.UserError(f'config.ensemble: {folder} has another vocabulary than {workdir} '
                           f'(fingerprint {theirs.fingerprint}, not {tokenizer.fingerprint}); '
                           'the runs of an ensemble share one vocabulary')
