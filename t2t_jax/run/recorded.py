"""A trained run's config, recorded by its first training invocation (DIR/config.json) and
read back by the modes that use the run, and the keys a later invocation may not change: its
parameters and vocabulary were made with them.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from t2t_jax.platform import errors, files
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
              'lr_schedule': 'warmup_rsqrt', 'learning_rate': 0.0, 'average_select': 'last',
              'eval_metrics': 'bleu,chrf,ter', 'keep_best': 1, 'early_stopping_patience': 0,
              'early_stopping_metric': 'dev_loss', 'export_format': 'marian'}
# ...and how it was batched: a run recorded before packing existed had §5.1's buckets.
ADDED_BATCHING = {'batching': 'buckets', 'pack_length': 256}
# Keys that act on the invocation that has them (workdir.move_aside, an older checkpoint):
# a config read back from the workdir has them at their defaults.
PER_INVOCATION = {'restart': False, 'restore_step': 0}
# Settings of the machine, not of the run: where compiled programs are cached (JAX loads what
# it finds there as native code) and whether threads compile ahead. A recorded run may come
# from someone else, so a recorded value is never used: the invocation's is (the base
# config's default, or --config.KEY).
MACHINE_KEYS = {'compilation_cache_dir': '~/.cache/t2t_jax/xla', 'compile_ahead': True}


def config_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The config as plain JSON values (what config.json holds)."""
  return json.loads(config.to_json_best_effort(sort_keys=True))


def load_config(workdir: str) -> dict[str, Any] | None:
  """The config recorded by the run's first training invocation, or None."""
  path = os.path.join(workdir, workdir_lib.CONFIG)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      recorded = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise errors.UserError(f'{path}: damaged, not the JSON of a config ({e}); restore it '
                           'from a copy, or move it away to record the config anew') from None
  if not isinstance(recorded, dict):
    raise errors.UserError(f'{path}: damaged, a JSON {type(recorded).__name__} where a '
                           'config (an object) was recorded; restore it from a copy')
  return recorded


def config_differences(recorded: dict[str, Any], current: dict[str, Any],
                       prefix: str = 'config.') -> dict[str, tuple[Any, Any]]:
  """{'config.model.num_layers': (recorded, current), ...} for every key that differs."""
  differences = {}
  for key in sorted(set(recorded) | set(current)):
    old, new = recorded.get(key), current.get(key)
    if isinstance(old, dict) and isinstance(new, dict):
      differences.update(config_differences(old, new, f'{prefix}{key}.'))
    elif old != new:
      differences[f'{prefix}{key}'] = (old, new)
  return differences


def compare_config(workdir: str, config: ml_collections.ConfigDict,
                   ) -> dict[str, tuple[Any, Any]]:
  """For a run that resumes: logs how `config` differs from the recorded one, returns that."""
  recorded = load_config(workdir)
  if recorded is None:
    return {}
  differences = config_differences(recorded, config_dict(config))
  if differences:
    logging.warning('The config differs from the one this run started with (%s): %s',
                    os.path.join(workdir, workdir_lib.CONFIG), '; '.join(
                        f'{k}: {old!r} -> {new!r}' for k, (old, new) in differences.items()))
  return differences


def save_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Records the config of a run that starts (or of one that predates config.json)."""
  if jax.process_index() == 0:
    os.makedirs(workdir, exist_ok=True)
    text = json.dumps(config_dict(config), indent=2) + '\n'
    path = os.path.join(workdir, workdir_lib.CONFIG)
    files.write_text(path, text)
    logging.info('Config: recorded in %s (--mode=help --workdir=%s lists it)', path, workdir)


def read(workdir: str, overrides: Sequence[str] = (), *, what: str = '',
         missing: type[errors.UserError] = errors.UserError) -> ml_collections.ConfigDict:
  """The config the run in `workdir` recorded, with `overrides` (from_recorded); a workdir
  without one is a `missing` error, its message led by `what` ('config.ensemble: ')."""
  workdir_lib.check_local(workdir)
  where = os.path.join(workdir, workdir_lib.CONFIG)
  recorded = load_config(workdir)
  if recorded is None:
    raise missing(f'{what}{where}: no recorded run there (training records it)')
  return from_recorded(recorded, overrides, where)


def from_recorded(recorded: Mapping[str, Any], overrides: Sequence[str],
                  where: str) -> ml_collections.ConfigDict:
  """The config recorded in `where` (DIR/config.json), with PER_INVOCATION and MACHINE_KEYS
  keys reset and `overrides` ('config.beam_size=8', as on the command line) applied, each
  checked against the recorded run (check_against_recorded)."""
  config = ml_collections.ConfigDict({**ADDED_KEYS, **ADDED_BATCHING, **recorded})
  config.update(PER_INVOCATION)
  for key, default in MACHINE_KEYS.items():
    if recorded.get(key, default) != default:
      logging.warning('%s records %s=%r, a setting of the machine that trained it: this '
                      'invocation uses %r (--config.%s=... chooses)', where, key, recorded[key],
                      default, key)
    config[key] = default
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
    differences = config_differences({key: recorded.get(key)}, {key: current.get(key)})
    for path, (old, new) in differences.items():
      if path in may_differ:
        continue
      raise errors.UserError(
          f'{path}={new!r} contradicts the trained run recorded in {where} ({old!r}): its '
          'parameters and vocabulary were made with that value; drop the --config or the '
          'override (decoding keys such as beam_size may change)')
