"""config.ensemble: other runs of the same vocabulary and languages ('DIR[:STEP],...'),
decoded together with the workdir's as one model (decode.py, "Ensembles"). Each brings the
parameters config.init_from would read, and its own recorded model keys (sizes may differ
from the workdir's); the compute dtype and hardware forms are this invocation's.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import ml_collections

from t2t_jax.model.transformer import ModelConfig
from t2t_jax.platform import errors
from t2t_jax.run import params as params_lib
from t2t_jax.run import recorded, vocabulary


class Member(NamedTuple):
  """Another run decoded with the workdir's (config.ensemble)."""
  workdir: str
  source: str  # its parameters: 'averaged/1000' or 'checkpoints/1000'
  covers: list[int] | None  # the checkpoints behind them (as Translator.covers)
  model_config: ModelConfig
  params: Any


def runs(spec: str) -> list[tuple[str, int]]:
  """config.ensemble 'DIR[:STEP],...' -> [(DIR, STEP)], STEP 0 when not given."""
  return [params_lib.parse_run(item, 'config.ensemble')
          for item in (part.strip() for part in spec.split(',')) if item]


def load(config: ml_collections.ConfigDict, workdir: str, tokenizer: Any) -> list[Member]:
  """config.ensemble's runs, each checked to share the workdir's languages and vocabulary
  (`tokenizer`'s) and to hold the model its recorded config builds."""
  return [load_member(config, folder, step, workdir, tokenizer)
          for folder, step in runs(config.ensemble)]


def load_member(config: ml_collections.ConfigDict, folder: str, step: int, workdir: str,
                tokenizer: Any) -> Member:
  """One run of an ensemble: its average if it has one, else its newest checkpoint (at
  STEP if given)."""
  member = recorded.read(folder, what='config.ensemble: ', missing=errors.MissingFileError)
  member.model.dtype, member.model.kernels = config.model.dtype, config.model.kernels
  vocabulary.check_same(config, member, folder, workdir, tokenizer)
  model_config = ModelConfig.from_config(member)
  loaded = params_lib.load_params(folder, step=step)
  params_lib.check_params_match(loaded.params, member, model_config,
                                f'{folder}/{loaded.source}', folder)
  return Member(folder, loaded.source, loaded.covers, model_config, loaded.params)
