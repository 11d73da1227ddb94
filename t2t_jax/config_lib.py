"""Checks an experiment config before anything is built, naming the key that is wrong.

`validate` (every mode of main.py calls it first) reads RULES, one rule a key of
experiments/wmt_ende_base.py and demo.py, then the few rules that tie two keys together.
`command_line_error` turns a --config file, Table 3 row or --config.KEY that does not exist
into one line naming the nearest valid names, instead of a traceback from ml_collections.
"""
from __future__ import annotations

import dataclasses
import difflib
import glob
import importlib.machinery
import importlib.util
import os
import re
from typing import Any, Callable, Sequence

import jax
import ml_collections

from t2t_jax.model import ModelConfig

DATASETS = ('tfds', 'files', 'demo', 'synthetic')
EVAL_SPLITS = ('dev', 'test')
DECODE_PARAMS = ('auto', 'averaged', 'checkpoint')
EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           'experiments')


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a key allows, in the words of the error message, and the test of a value."""
  allowed: str
  test: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
  # bool is an int to Python, and ConfigDict lets True into an int field.
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_at_least(low: int, note: str = '') -> Rule:
  allowed = 'a positive integer' if low == 1 else f'an integer ≥ {low}'
  return Rule(allowed + note, lambda v: _is_int(v) and v >= low)


def number_at_least(low: float, note: str = '') -> Rule:
  return Rule(f'a number ≥ {low:g}{note}', lambda v: _is_number(v) and v >= low)


def one_of(*choices: str) -> Rule:
  return Rule(f'one of {choices}', lambda v: isinstance(v, str) and v in choices)


def text(note: str = '', *, empty_ok: bool = False) -> Rule:
  allowed = f'a string{note}' if empty_ok else 'a non-empty string'
  return Rule(allowed, lambda v: isinstance(v, str) and (empty_ok or bool(v.strip())))


POSITIVE_INT = int_at_least(1)
POSITIVE_NUMBER = Rule('a number > 0', lambda v: _is_number(v) and v > 0)
FRACTION = Rule('in [0, 1)', lambda v: _is_number(v) and 0 <= v < 1)  # ε_ls, β1, β2
BOOL = Rule('True or False', lambda v: isinstance(v, bool))
# numpy's seeding refuses negative seeds and jax.random.PRNGKey anything past int64.
SEED = Rule('an integer in [0, 2**63)', lambda v: _is_int(v) and 0 <= v < 2**63)
MODEL = Rule('a ConfigDict of model keys (each checked by model.ModelConfig, §3)',
             lambda v: isinstance(v, ml_collections.ConfigDict))

# Every key of experiments/wmt_ende_base.py and demo.py (tests/test_configs.py checks that
# none is missing). The numbers' meaning and sections are in wmt_ende_base.py.
RULES: dict[str, Rule] = {
    # Data, §5.1
    'dataset': one_of(*DATASETS),
    'tfds_name': text(),
    'tfds_data_dir': text(" ('' = the tfds default)", empty_ok=True),
    'tfds_manual_dir': text(" ('' = none)", empty_ok=True),
    'source_lang': text(),
    'target_lang': text(),
    'train_split': text(),
    'dev_split': text(" ('' = no dev set)", empty_ok=True),
    'test_split': text(" ('' = no test set)", empty_ok=True),
    'train_files': text(" (a PREFIX; '' = none)", empty_ok=True),
    'dev_files': text(" (a PREFIX; '' = none)", empty_ok=True),
    'test_files': text(" (a PREFIX; '' = none)", empty_ok=True),
    'demo_num_train': POSITIVE_INT,
    'demo_num_eval': POSITIVE_INT,
    'demo_seed': SEED,
    'vocab_size': POSITIVE_INT,
    'vocab_sample_sentences': POSITIVE_INT,
    'max_length': POSITIVE_INT,
    'tokens_per_batch': POSITIVE_INT,
    'eval_tokens_per_batch': POSITIVE_INT,
    'bucket_growth': number_at_least(1),
    'bucket_band': int_at_least(0, ' (0 = pad both sides to the longer)'),
    # Model, §3 and Table 3
    'model': MODEL,
    # Training, §5.2-§5.4
    'label_smoothing': FRACTION,
    'num_train_steps': POSITIVE_INT,
    'train_minutes': number_at_least(0, ' (0 = no time limit)'),
    'warmup_steps': POSITIVE_INT,
    'adam_beta1': FRACTION,
    'adam_beta2': FRACTION,
    'adam_eps': POSITIVE_NUMBER,
    'learning_rate_scale': POSITIVE_NUMBER,
    'grad_accum_steps': int_at_least(1, ' (micro-batches summed into one update)'),
    'seed': SEED,
    'log_every_steps': POSITIVE_INT,
    'eval_every_steps': POSITIVE_INT,
    # Decoding and BLEU, §6.1
    'beam_size': POSITIVE_INT,
    'beam_alpha': number_at_least(0),
    'decode_extra_length': int_at_least(0),
    'decode_tokens_per_batch': POSITIVE_INT,
    'max_decode_input_length': POSITIVE_INT,
    'eval_split': one_of(*EVAL_SPLITS),
    'eval_bleu_every_steps': int_at_least(0, ' (0 = off)'),
    # Checkpoints and averaging, §5.2 and §6.1
    'checkpoint_every_minutes': number_at_least(0, ' (0 = off)'),
    'checkpoint_every_steps': int_at_least(0, ' (0 = off)'),
    'keep_checkpoints': POSITIVE_INT,
    'average_last': POSITIVE_INT,
    'average_allow_fewer': BOOL,
    'restore_step': int_at_least(0, ' (0 = the newest checkpoint)'),
    'restart': BOOL,
    'decode_params': one_of(*DECODE_PARAMS),
    # Plumbing
    'compilation_cache_dir': text(" ('' = no compilation cache)", empty_ok=True),
}
# Keys only some datasets' configs have: checked when present.
OPTIONAL_KEYS = frozenset({'demo_num_train', 'demo_num_eval', 'demo_seed'})


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """ModelConfig straight from `config.model` (and the shared `config.vocab_size`), with
  dtype 'auto' made the compute dtype of this machine's accelerator (`compute_dtype`)."""
  known = {f.name for f in dataclasses.fields(ModelConfig)} - {'vocab_size', 'deterministic',
                                                               'decode'}
  unknown = sorted(set(config.model.keys()) - known)
  if unknown:
    raise ValueError(f'config.model.{unknown[0]}: unknown key; known keys: {sorted(known)}')
  fields = config.model.to_dict()
  if fields.get('dtype') == 'auto':
    fields['dtype'] = compute_dtype()
  return ModelConfig(vocab_size=config.vocab_size, **fields)


def compute_dtype(backend: str | None = None) -> str:
  """What config.model.dtype='auto' means: bfloat16 on GPU and TPU, whose matrix units run
  it at 2× (or more) the float32 rate; float32 on CPU, where bfloat16 matmuls are slower.

  Only the compute dtype: parameters, Adam moments, softmax, layer-norm statistics and the
  loss stay float32 (model.py). A deviation from the paper, which trained in float32 on
  P100s, in exchange for ~2× speed; --config.model.dtype=float32 restores it.
  """
  backend = backend or jax.default_backend()
  return 'float32' if backend == 'cpu' else 'bfloat16'


def validate(config: ml_collections.ConfigDict) -> ModelConfig:
  """Raises ValueError `config.<key>: must be ..., got ...` for the first bad key (RULES, then
  the model's keys, then the rules across keys); returns the model's config."""
  for key, rule in RULES.items():
    if key not in config:
      if key in OPTIONAL_KEYS:
        continue
      raise ValueError(f'config.{key}: missing; it must be {rule.allowed} (every config '
                       'has it: build on experiments/wmt_ende_base.py)')
    if not rule.test(config[key]):
      raise ValueError(f'config.{key}: must be {rule.allowed}, got {config[key]!r}')
  model = model_config(config)
  _check_across_keys(config, model)
  return model


def _check_across_keys(config: ml_collections.ConfigDict, model: ModelConfig) -> None:
  """The rules that tie two keys together."""
  if config.target_lang == config.source_lang:
    raise ValueError(f'config.target_lang: must differ from config.source_lang, got '
                     f'{config.target_lang!r} for both')
  if config.average_last > config.keep_checkpoints:
    raise ValueError(f'config.average_last: must be ≤ config.keep_checkpoints '
                     f'({config.keep_checkpoints}), the checkpoints kept to average (§6.1), '
                     f'got {config.average_last}')
  if model.positional != 'learned':
    return  # sinusoids (§3.5) extend to any length
  # A learned embedding has positions 0..max_len-1 only (Table 3 row E).
  if model.max_len < config.max_length:
    raise ValueError(f'config.model.max_len: must be ≥ config.max_length ({config.max_length}) '
                     f'with learned positions, or training sentences run out of positions, '
                     f'got {model.max_len}')
  if config.decode_extra_length >= model.max_len:
    raise ValueError(f'config.decode_extra_length: must be < config.model.max_len '
                     f'({model.max_len}) with learned positions: the decoder needs input + '
                     f'decode_extra_length positions, got {config.decode_extra_length}')


# ------------------------------------------------------- mistakes on the command line


def command_line_error(argv: Sequence[str]) -> str | None:
  """One line for a --config file, row or --config.KEY override that does not exist, else None.

  Called once absl's flag parsing has failed: ml_collections reports these mistakes with a
  traceback, the name buried in it. This loads the config again to name the nearest valid
  file, row or key (difflib); None leaves the original error to be shown.
  """
  path = _config_argument(argv)
  if path is None:
    return None  # absl says --config is required
  file, colon, row = path.partition(':')  # as ml_collections: FILE[:ARGUMENT]
  if not os.path.isfile(file):
    return _missing_file(path, file, colon + row)
  try:
    config = _load_config(file, [row] if colon else [])
  except SyntaxError as e:
    return f'{file}, line {e.lineno}: not a Python config file ({e.msg})'
  except (ValueError, TypeError) as e:  # get_config's own message, e.g. table3.py's unknown row
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    named = message.split(':', 1)[0].endswith(os.path.basename(file))
    return message if named else f'{file}: {message}'
  for arg in argv[1:]:
    override = re.match(r'-{1,2}(?:no)?config\.([^=]+)', arg)
    message = override and _unknown_key(config, override.group(1))
    if message:
      return message
  return None


def _config_argument(argv: Sequence[str]) -> str | None:
  """The value of --config (`--config=F` or `--config F`; the last one wins, as in absl)."""
  value = None
  for i, arg in enumerate(argv[1:], 1):
    name, equals, rest = arg.partition('=')
    if name in ('--config', '-config'):
      value = rest if equals else (argv[i + 1] if i + 1 < len(argv) else None)
  return value


def _missing_file(path: str, file: str, row: str) -> str:
  """Names the experiments/*.py nearest to `file` by name (all of them if none is near)."""
  folder = os.path.relpath(EXPERIMENTS)  # as the user would type it, from where they are
  names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, '*.py'))
                 if not p.endswith('__init__.py'))
  nearest = difflib.get_close_matches(os.path.basename(file), names)
  if nearest:
    hint = 'did you mean ' + ' or '.join(os.path.join(folder, n) + row for n in nearest) + '?'
  else:
    hint = 'the configs are ' + ', '.join(os.path.join(folder, n) for n in names)
  return f'--config={path}: no such file; {hint}'


def _load_config(file: str, args: list[str]) -> Any:
  """`get_config(*args)` of a config file, loaded as ml_collections' config flag loads it."""
  loader = importlib.machinery.SourceFileLoader('t2t_jax_config_check', file)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  loader.exec_module(module)
  return module.get_config(*args)


def _unknown_key(config: Any, path: str) -> str | None:
  """`config.modle: no such key; did you mean config.model?` for the first missing part."""
  node, walked = config, 'config'
  for part in path.split('.'):
    if not isinstance(node, ml_collections.ConfigDict):
      return (f'{walked}.{part}: no such key; {walked} is a value '
              f'({type(node).__name__}), not a group of keys')
    if part not in node:
      keys = sorted(node.keys())
      nearest = difflib.get_close_matches(part, keys)
      hint = ('did you mean ' + ' or '.join(f'{walked}.{k}' for k in nearest) + '?' if nearest
              else f'the keys of {walked} are ' + ', '.join(keys))
      return f'{walked}.{part}: no such key; {hint}'
    node, walked = node[part], f'{walked}.{part}'
  return None
