"""A trained run's recorded config (DIR/config.json) read back for the modes that use the run,
and the keys a later invocation may not change: its parameters and vocabulary were made with
them.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from t2t_jax.platform import errors
from t2t_jax.platform import workdir as workdir_lib

# What a trained run fixes: its parameters and vocabulary were made with these values, so a
# later mode must use them. Every other key (beam_size, eval_split, the test files,
# restore_step, ...) may change from one invocation to the next.
TRAINED_KEYS = ('vocab_size', 'source_lang', 'target_lang', 'model')
# ...except the compute dtype, which only sets the precision of the arithmetic, and the
# hardware forms, which compute the same model.
MAY_DIFFER = frozenset({'config.model.dtype', 'config.model.kernels'})
# Keys added since runs were first recorded: a config.json without one reads as this.
ADDED_MODEL_KEYS = {'kernels': 'auto'}
ADDED_KEYS = {'decode_method': 'beam', 'sample_temperature': 1.0, 'sample_top_k': 0,
              'sample_seed': 0, 'ensemble': '', 'compile_ahead': True,
              'decode_bucket_growth': 2.0, 'sample_top_p': 1.0, 'ensemble_weights': '',
              'lr_schedule': 'warmup_rsqrt', 'learning_rate': 0.0, 'average_select': 'last'}
# ...and how it was batched: a run recorded before packing existed had §5.1's buckets.
ADDED_BATCHING = {'batching': 'buckets', 'pack_length': 256}
# Keys that act on the invocation that has them (workdir.move_aside, an older checkpoint):
# a config read back from the workdir has them at their defaults.
PER_INVOCATION = {'restart': False, 'restore_step': 0}


def from_recorded(recorded: Mapping[str, Any], overrides: Sequence[str],
                  where: str) -> ml_collections.ConfigDict:
  """The config recorded in `where` (DIR/config.json), with PER_INVOCATION keys reset and
  `overrides` ('config.beam_size=8', as on the command line) applied, each checked against
  the recorded run (check_against_recorded)."""
  added = {**ADDED_KEYS, **ADDED_BATCHING}
  config = ml_collections.ConfigDict({**recorded, **{key: value for key, value in
                                                     added.items() if key not in recorded}})
  config.update(PER_INVOCATION)
  if isinstance(config.get('model'), ml_collections.ConfigDict):
    for key, value in ADDED_MODEL_KEYS.items():
      if key not in config.model:
        config.model[key] = value
  for override in overrides:
    path, equals, text_value = override.partition('=')
    if not equals or not path.startswith('config.'):
      raise errors.UserError(f'--{override}: expected --config.KEY=VALUE')
    *parents, name = path.split('.')[1:]
    node = config
    for part in parents:
      node = node[part] if part in node else None
      if not isinstance(node, ml_collections.ConfigDict):
        raise errors.UserError(f'--{path}: no such key in {where}')
    if name not in node:
      nearest = difflib.get_close_matches(name, list(node.keys()))
      hint = ('; did you mean ' + ' or '.join(f'--{".".join(["config", *parents, n])}'
                                                for n in nearest) + '?') if nearest else ''
      raise errors.UserError(f'--{path}: no such key in {where}{hint}')
    node[name] = _parse_override(path, text_value, node[name])
  check_against_recorded(config, recorded, where)
  return config


def _parse_override(path: str, text_value: str, current: Any) -> Any:
  """A command-line value as the type of the recorded one (bool, int, float or str)."""
  try:
    if isinstance(current, bool):
      if text_value.lower() not in ('true', 'false'):
        raise ValueError(text_value)
      return text_value.lower() == 'true'
    if isinstance(current, (int, float, str)):
      return type(current)(text_value)
    return int(text_value) if re.fullmatch(r'-?\d+', text_value) else text_value
  except ValueError:
    raise errors.UserError(f'--{path}={text_value}: expected type {type(current).__name__} '
                           f'(the recorded value is {current!r})') from None


def check_against_recorded(config: ml_collections.ConfigDict, recorded: Mapping[str, Any],
                           where: str, *, may_differ: frozenset[str] = MAY_DIFFER) -> None:
  """UserError naming the first TRAINED_KEYS key on which `config` contradicts the run
  recorded in `where`: decoding, averaging and attention maps use the trained model."""
  current = config.to_dict()
  for key in TRAINED_KEYS:  # in this order: the vocabulary is named before a model key
    differences = workdir_lib.config_differences({key: recorded.get(key)},
                                                 {key: current.get(key)})
    for path, (old, new) in differences.items():
      if path in may_differ:
        continue
      raise errors.UserError(
          f'{path}={new!r} contradicts the trained run recorded in {where} ({old!r}): its '
          'parameters and vocabulary were made with that value; drop the --config or the '
          'override (decoding keys such as beam_size may change)')
