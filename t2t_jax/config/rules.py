"""Checks an experiment config before any work, naming the key that is wrong.

One validator, driven by tables: RULES (every top-level key), MODEL_RULES (config.model, §3
and Table 3) and DATASET_KEYS (what each config.dataset needs in the modes that read its
text, §5.1), then the rules that tie two keys together. Every mode of main.py calls
`validate` first; transformer.ModelConfig calls `check_model`, so that a ModelConfig built by
hand (the Python API) meets the same tables and messages. Every mistake is an
errors.UserError that starts `config.<key>: `. The config is checked before the data and the
model are built from it, so of the project this imports only platform.errors.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import ml_collections

from t2t_jax.config.modes import MODES
from t2t_jax.platform import errors

DATASETS = ('tfds', 'files', 'demo', 'synthetic')
# §5.1's length buckets, or whole pairs packed into rows of one length (data/packing.py).
BATCHINGS = ('buckets', 'packed')
EVAL_SPLITS = ('dev', 'test')
# optim.learning_rate_schedule's: §5.3's, then two without warm-up for fine-tuning.
LR_SCHEDULES = ('warmup_rsqrt', 'rsqrt', 'constant')
DECODE_PARAMS = ('auto', 'averaged', 'checkpoint', 'best')
# Which checkpoints --mode=average takes: the last ones (§6.1) or those of lowest dev loss.
AVERAGE_SELECTS = ('last', 'best')
# What early stopping watches: the dev loss (every eval_every_steps) or dev BLEU (every
# eval_bleu_every_steps).
EARLY_STOPPING_METRICS = ('dev_loss', 'dev_bleu')
# --mode=eval's scores beside the paper's tokenized BLEU: sacreBLEU's BLEU, chrF2 and TER.
EVAL_METRICS = ('bleu', 'chrf', 'ter')
# beam search (§6.1), beam search with one beam, sampling (decoding/sampling.py)
DECODE_METHODS = ('beam', 'greedy', 'sample')
POSITIONAL = ('sinusoidal', 'learned')  # §3.5; 'learned' is Table 3 row (E)
COMPUTE_DTYPES = ('float32', 'bfloat16', 'float16')
# kernels.py's choices of hardware forms; 'auto' is kernel_forms() of the platform. A choice
# may add levers for accelerators (kernels.LEVERS): 'xla+one_pass_loss+fused_attention'.
KERNEL_FORMS = ('xla', 'cpu')
KERNEL_LEVERS = ('one_pass_loss', 'rbg_dropout', 'hash_dropout', 'fused_attention')


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a key allows, in the words of the error message, and the test of a value."""
  allowed: str
  test: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
  # bool is an int to Python, and ConfigDict lets True into an int field; numbers.Integral
  # also admits NumPy integers, which Python API users may pass to ModelConfig.
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  """A finite real number: an infinite temperature or time budget is no setting."""
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))


def int_at_least(low: int, note: str = '') -> Rule:
  allowed = 'a positive integer' if low == 1 else f'an integer ≥ {low}'
  return Rule(allowed + note, lambda v: _is_int(v) and v >= low)


def number_at_least(low: float, note: str = '') -> Rule:
  return Rule(f'a finite number ≥ {low:g}{note}', lambda v: _is_number(v) and v >= low)


def one_of(*choices: str, note: str = '') -> Rule:
  return Rule(f'one of {choices}{note}', lambda v: isinstance(v, str) and v in choices)


def text(note: str = '', *, empty_ok: bool = False) -> Rule:
  allowed = f'a string{note}' if empty_ok else 'a non-empty string'
  return Rule(allowed, lambda v: isinstance(v, str) and (empty_ok or bool(v.strip())))


def kernels_rule(*, auto: bool) -> Rule:
  """config.model.kernels: one of KERNEL_FORMS, then any of KERNEL_LEVERS after '+', each
  once; or 'auto' where `auto` (ModelConfig.from_config resolves it)."""
  def test(value: Any) -> bool:
    if not isinstance(value, str):
      return False
    base, *levers = value.split('+')
    return ((auto and value == 'auto')
            or (base in KERNEL_FORMS and set(levers) <= set(KERNEL_LEVERS)
                and len(set(levers)) == len(levers)))
  choices = ("'auto' or " if auto else '') + f'one of {KERNEL_FORMS}'
  return Rule(f"{choices}, then levers joined by '+' from {KERNEL_LEVERS}", test)


POSITIVE_INT = int_at_least(1)
POSITIVE_NUMBER = Rule('a finite number > 0', lambda v: _is_number(v) and v > 0)
FRACTION = Rule('in [0, 1)', lambda v: _is_number(v) and 0 <= v < 1)  # ε_ls, β1, β2, P_drop
BOOL = Rule('True or False', lambda v: isinstance(v, bool))
TOP_P = Rule('a number in (0, 1] (1 = the whole vocabulary)',
             lambda v: _is_number(v) and 0 < v <= 1)
# numpy's seeding refuses negative seeds and jax.random.PRNGKey anything past int64.
SEED = Rule('an integer in [0, 2**63)', lambda v: _is_int(v) and 0 <= v < 2**63)
# jax.random.PRNGKey keeps the low 32 bits of a seed (without jax_enable_x64): larger ones
# would repeat smaller ones' samples.
SAMPLE_SEED = Rule('an integer in [0, 2**32)', lambda v: _is_int(v) and 0 <= v < 2**32)
MODEL = Rule('a ConfigDict of model keys (each checked by MODEL_RULES, §3)',
             lambda v: isinstance(v, ml_collections.ConfigDict))
# d_k, d_v: None means d_model / h (§3.2.2); Table 3 rows (A) and (B) set them.
HEAD_SIZE = Rule('a positive integer or None (None: d_model / num_heads)',
                 lambda v: v is None or (_is_int(v) and v >= 1))

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
    'batching': one_of('auto', *BATCHINGS),  # 'auto': batching_of()
    'pack_length': POSITIVE_INT,
    # Model, §3 and Table 3: its keys are MODEL_RULES'
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
    'lr_schedule': one_of(*LR_SCHEDULES),
    'learning_rate': number_at_least(0, " (0 with lr_schedule='rsqrt': §5.3's peak)"),
    'grad_accum_steps': int_at_least(1, ' (micro-batches summed into one update)'),
    'seed': SEED,
    'log_every_steps': POSITIVE_INT,
    'eval_every_steps': POSITIVE_INT,
    # Decoding and BLEU, §6.1
    'beam_size': POSITIVE_INT,
    'beam_alpha': number_at_least(0),
    'decode_method': one_of(*DECODE_METHODS),
    'sample_temperature': POSITIVE_NUMBER,
    'sample_top_k': int_at_least(0, ' (0 = the whole vocabulary)'),
    'sample_top_p': TOP_P,
    'sample_seed': SAMPLE_SEED,
    'ensemble': text(" (other runs' DIR or DIR:STEP, comma-separated; '' = none)",
                     empty_ok=True),
    'ensemble_weights': text(" (positive numbers, comma-separated, one a model: this run's, "
                             "then each ensemble run's; '' = equal)", empty_ok=True),
    'decode_extra_length': int_at_least(0),
    'decode_tokens_per_batch': int_at_least(0, ' (0 = per platform: decode_tokens_of)'),
    'decode_bucket_growth': number_at_least(1),
    'max_decode_input_length': POSITIVE_INT,
    'export_format': one_of('marian', 'ctranslate2'),
    'eval_split': one_of(*EVAL_SPLITS),
    'eval_bleu_every_steps': int_at_least(0, ' (0 = off)'),
    'eval_metrics': text(f" (comma-separated, of {', '.join(EVAL_METRICS)})"),
    'early_stopping_patience': int_at_least(0, ' (dev evaluations without a better one; 0 = off)'),
    'early_stopping_metric': one_of(*EARLY_STOPPING_METRICS),
    # Checkpoints and averaging, §5.2 and §6.1
    'checkpoint_every_minutes': number_at_least(0, ' (0 = off)'),
    'checkpoint_every_steps': int_at_least(0, ' (0 = off)'),
    'keep_checkpoints': POSITIVE_INT,
    'keep_best': int_at_least(0, ' (0 = only the last keep_checkpoints)'),
    'average_last': POSITIVE_INT,
    'average_allow_fewer': BOOL,
    'average_select': one_of(*AVERAGE_SELECTS),
    'restore_step': int_at_least(0, ' (0 = the newest checkpoint)'),
    'restart': BOOL,
    'init_from': text(" (a trained run's DIR or DIR:STEP; '' = none)", empty_ok=True),
    'decode_params': one_of(*DECODE_PARAMS),
    # Plumbing
    'compilation_cache_dir': text(" ('' = no compilation cache)", empty_ok=True),
    'compile_ahead': BOOL,
}

# Every key of config.model: the fields of transformer.ModelConfig but vocab_size (shared with the
# data, §5.1) and the mode flags deterministic and decode (tests/test_configs.py compares).
MODEL_RULES: dict[str, Rule] = {
    'num_layers': POSITIVE_INT,  # N, §3.1
    'd_model': POSITIVE_INT,  # §3.1
    'd_ff': POSITIVE_INT,  # §3.3
    'num_heads': POSITIVE_INT,  # h, §3.2.2
    'd_k': HEAD_SIZE,
    'd_v': HEAD_SIZE,
    'dropout_rate': FRACTION,  # P_drop, §5.4
    'positional': one_of(*POSITIONAL),
    'max_len': POSITIVE_INT,  # positions a learned embedding covers
    'dtype': one_of('auto', *COMPUTE_DTYPES),  # 'auto': compute_dtype()
    'kernels': kernels_rule(auto=True),  # 'auto': kernel_forms()
}
CONCRETE_DTYPE = one_of(*COMPUTE_DTYPES, note=" ('auto' is resolved by ModelConfig.from_config)")
CONCRETE_KERNELS = kernels_rule(auto=False)


@dataclasses.dataclass(frozen=True)
class DatasetNeeds:
  """The keys one config.dataset needs set, by mode, and what to do about a missing one."""
  keys: dict[str, tuple[str, ...]]  # mode -> keys; '{eval_split}' is config.eval_split
  how: str  # the message's advice; {key}, {source_lang} and {target_lang} are filled in


DEMO_KEYS = ('demo_num_train', 'demo_num_eval', 'demo_seed')
# Only 'train' and 'eval' read the dataset's text ('study' both, for each Table 3 row); the
# other modes read the workdir alone, so they need no data keys.
DATASET_KEYS: dict[str, DatasetNeeds] = {
    'tfds': DatasetNeeds({'train': ('tfds_name', 'train_split'),
                          'eval': ('tfds_name', '{eval_split}_split')},
                         'pass --config.{key}=SPLIT, a split of config.tfds_name'),
    'files': DatasetNeeds({'train': ('train_files',), 'eval': ('{eval_split}_files',)},
                          'pass --config.{key}=PREFIX: reads PREFIX.{source_lang} and '
                          'PREFIX.{target_lang}, one sentence a line'),
    'demo': DatasetNeeds({'train': DEMO_KEYS, 'eval': DEMO_KEYS}, 'see experiments/demo.py'),
    'synthetic': DatasetNeeds({}, ''),  # generated from config.seed and the sizes alone
}
# Keys only some datasets' configs have: checked by RULES when present.
OPTIONAL_KEYS = frozenset(DEMO_KEYS)
# Keys one config.dataset alone reads, '' where unset: set with another dataset, they would be
# silently ignored (the demo's corpus trained on instead of the files named).
READ_BY: dict[str, str] = {'train_files': 'files', 'dev_files': 'files', 'test_files': 'files',
                           'tfds_data_dir': 'tfds', 'tfds_manual_dir': 'tfds'}


def compute_dtype(backend: str | None = None) -> str:
  """What config.model.dtype='auto' means: bfloat16 on GPU and TPU, whose matrix units run it
  faster; float32 on CPU, where bfloat16 matmuls are slower. Only the compute dtype: parameters,
  Adam moments, softmax, layer-norm statistics and the loss stay float32 (transformer.py). A
  deviation from the paper's float32 (docs/performance.md); --config.model.dtype=float32
  restores it."""
  return 'float32' if _on_cpu(backend) else 'bfloat16'


def kernel_forms(backend: str | None = None) -> str:
  """What config.model.kernels='auto' means (kernels.py): the CPU forms on a CPU, the plain
  ones, which XLA's GPU and TPU compilers take as they are, elsewhere."""
  return 'cpu' if _on_cpu(backend) else 'xla'


def _on_cpu(backend: str | None) -> bool:
  # Only here does validating a config start a JAX backend: --distributed initialises first.
  return (backend or jax.default_backend()) == 'cpu'


# config.decode_tokens_per_batch=0: padded source tokens a decoding batch, per platform. A CPU
# gains nothing from larger batches (each device searches its own rows); a GPU's step costs
# about the same for 128 sentences as for 512 of 32 tokens (docs/performance.md).
DECODE_TOKENS = {'cpu': 4096, 'gpu': 16384, 'tpu': 16384}


def decode_tokens_of(config: ml_collections.ConfigDict, backend: str | None = None) -> int:
  """config.decode_tokens_per_batch, with 0 (per platform) resolved for the platform."""
  return (config.decode_tokens_per_batch
          or DECODE_TOKENS.get(backend or jax.default_backend(), DECODE_TOKENS['cpu']))


def batching_of(config: ml_collections.ConfigDict, backend: str | None = None) -> str:
  """config.batching, with 'auto' resolved: packed rows on GPU and TPU, where each of the
  buckets' tens of batch shapes is a slow compilation; §5.1's buckets on a CPU, whose step
  gains nothing from packing (docs/performance.md), and for the synthetic task."""
  if config.batching != 'auto':
    return config.batching
  return 'buckets' if config.dataset == 'synthetic' or _on_cpu(backend) else 'packed'


def validate(config: ml_collections.ConfigDict, mode: str = 'train') -> None:
  """Raises errors.UserError `config.<key>: ...` for the first mistake, before any work.
  RULES apply in every mode, so that a bad value fails the quick `--mode=params` too, not
  hours later in an eval; config.dataset's keys (DATASET_KEYS) only in the modes that read it."""
  if mode not in MODES:  # the caller's bug, not the user's
    raise ValueError(f'mode={mode!r}: not one of {MODES}')
  _check_values(config, RULES, optional=OPTIONAL_KEYS)
  check_model_keys_known(config.model.keys())
  _check_model_values(config.model, MODEL_RULES)
  for reads in (('train', 'eval') if mode == 'study' else (mode,)):
    _check_dataset_keys(config, reads)
  _check_keys_read(config)
  _check_across_keys(config)


def _check_pack_length(config: ml_collections.ConfigDict) -> None:
  """A packed row (data/packing.py) holds a pair of config.max_length tokens, fits in one
  batch's config.tokens_per_batch, and its attention fits a device: checked before anything
  is allocated, where a wrong value would otherwise drop pairs or fail after a compilation."""
  pack_length, max_length = config.pack_length, config.max_length
  if pack_length < max_length:
    raise errors.UserError(
        f'config.pack_length: must be ≥ config.max_length ({max_length}) with packed batches, '
        f'or the pairs longer than a row are left out of training, got {pack_length}; raise '
        'it, or lower config.max_length')
  if pack_length > config.tokens_per_batch:
    raise errors.UserError(
        f'config.pack_length: must be ≤ config.tokens_per_batch ({config.tokens_per_batch}): a '
        f'row is part of one batch, got {pack_length}')
  # The attention weights a device keeps for the backward pass: [rows, h, L, L] float32 for
  # each of a layer's attentions (encoder, decoder, encoder-decoder: 3N in all).
  rows = max(1, config.tokens_per_batch // pack_length)
  rows = -(-rows // (jax.device_count() * config.get('grad_accum_steps', 1)))
  need = rows * config.model.num_heads * pack_length ** 2 * 4 * 3 * config.model.num_layers
  have = _device_memory_bytes()
  if need > have:
    raise errors.UserError(
        f'config.pack_length: {pack_length} tokens a row need {need / 2**30:.1f} GiB a device '
        f'for the attention weights alone ({rows} rows × h × pack_length² × 4 bytes × 3N), '
        f'more than its {have / 2**30:.1f} GiB; lower it (§5.1\'s sentences: 256)')


def _device_memory_bytes() -> int:
  """One device's memory: what XLA may allocate on a GPU or TPU, the machine's memory on a CPU
  (whose devices share it)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'bytes_limit' in stats:
    return int(stats['bytes_limit'])
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def ensemble_weights(config: ml_collections.ConfigDict) -> tuple[float, ...] | None:
  """config.ensemble_weights as weights summing to 1: this run's, then config.ensemble's runs'
  in order; None where none are given (the models' mean). Raises errors.UserError naming the
  key for a weight that is not a finite positive number, or a count not the ensemble's."""
  given = config.get('ensemble_weights', '').strip()
  if not given:
    return None
  runs = [run for run in config.ensemble.split(',') if run.strip()]
  if not runs:
    raise errors.UserError(f'config.ensemble_weights={given!r}: weighs the models of '
                           "config.ensemble, which is ''; give it the other runs, or leave "
                           'the weights unset')
  try:
    weights = [float(w) for w in given.split(',')]
  except ValueError:
    weights = []
  if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
    raise errors.UserError(f'config.ensemble_weights={given!r}: must be positive numbers, '
                           "comma-separated (e.g. '2,1')")
  if len(weights) != 1 + len(runs):
    raise errors.UserError(
        f'config.ensemble_weights={given!r}: {len(weights)} weight(s) for {1 + len(runs)} '
        f'model(s): one for this run, then one for each of config.ensemble={config.ensemble!r}')
  total = math.fsum(weights)
  return tuple(w / total for w in weights)


def eval_metrics_of(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """config.eval_metrics as a tuple in EVAL_METRICS' order: 'ter,bleu' -> ('bleu', 'ter')."""
  given = [name.strip() for name in str(config.eval_metrics).split(',') if name.strip()]
  unknown = [name for name in given if name not in EVAL_METRICS]
  if unknown or not given:
    raise errors.UserError(f'config.eval_metrics={config.eval_metrics!r}: name one or more of '
                           f'{", ".join(EVAL_METRICS)}, comma-separated')
  return tuple(name for name in EVAL_METRICS if name in given)


def check_model(fields: Mapping[str, Any]) -> None:
  """Raises errors.UserError for a bad field of transformer.ModelConfig, as `validate` would for
  config.vocab_size and config.model. Fields beside those (the mode flags) are ignored; dtype
  and kernels are concrete here ('auto' is resolved by ModelConfig.from_config)."""
  _check_values(fields, {'vocab_size': RULES['vocab_size']})
  _check_model_values(fields, {**MODEL_RULES, 'dtype': CONCRETE_DTYPE,
                               'kernels': CONCRETE_KERNELS})


def check_model_keys_known(keys: Iterable[str]) -> None:
  """Raises errors.UserError for a key of config.model that no MODEL_RULES (nor a field of
  transformer.ModelConfig) has: a misspelt key would otherwise be silently ignored."""
  unknown = sorted(set(keys) - set(MODEL_RULES))
  if unknown:
    raise errors.UserError(f'config.model.{unknown[0]}: unknown key; known keys: '
                           f'{sorted(MODEL_RULES)}')


def _check_values(values: Mapping[str, Any] | ml_collections.ConfigDict,
                  rules: Mapping[str, Rule], prefix: str = '',
                  optional: frozenset[str] = frozenset()) -> None:
  """Each key of `rules` present (unless `optional`) in `values` and allowed by its rule."""
  for key, rule in rules.items():
    if key in values:
      if not rule.test(values[key]):
        raise errors.UserError(f'config.{prefix}{key}: must be {rule.allowed}, '
                               f'got {values[key]!r}')
    elif key not in optional:
      raise errors.UserError(f'config.{prefix}{key}: missing; it must be {rule.allowed} (every '
                             'config has it: build on experiments/wmt_ende_base.py)')


def _check_model_values(values: Mapping[str, Any] | ml_collections.ConfigDict,
                        rules: Mapping[str, Rule]) -> None:
  """`rules` on the model's keys, then the per-head sizes that an unset d_k or d_v implies."""
  _check_values(values, rules, 'model.')
  for key in ('d_k', 'd_v'):
    # None means d_model / h (§3.2.2), which must then be a whole number of dimensions.
    if values[key] is None and values['d_model'] % values['num_heads']:
      raise errors.UserError(
          f'config.model.{key}: unset, so it would be d_model / num_heads = '
          f'{values["d_model"]} / {values["num_heads"]}, which is not a whole number; set it '
          'or change num_heads')


def _check_dataset_keys(config: ml_collections.ConfigDict, mode: str) -> None:
  """The keys config.dataset needs in `mode` (DATASET_KEYS): present and not empty."""
  needs = DATASET_KEYS[config.dataset]
  for pattern in needs.keys.get(mode, ()):
    key = pattern.format(eval_split=config.eval_split)
    how = needs.how.format(key=key, source_lang=config.source_lang,
                           target_lang=config.target_lang)
    needed = f'config.dataset={config.dataset!r} needs it'
    if key not in config:
      raise errors.UserError(f'config.{key}: missing; {needed} ({how})')
    if isinstance(config[key], str) and not config[key].strip():
      split = (f' with config.eval_split={config.eval_split!r}' if '{eval_split}' in pattern
               else '')
      raise errors.UserError(f'config.{key}: empty; {needed} for --mode={mode}{split} ({how})')


def _check_keys_read(config: ml_collections.ConfigDict) -> None:
  """No READ_BY key is set for a dataset that does not read it."""
  for key, dataset in READ_BY.items():
    if config.dataset != dataset and isinstance(config[key], str) and config[key].strip():
      raise errors.UserError(
          f'config.{key}={config[key]!r}: read only with config.dataset={dataset!r}, not '
          f'{config.dataset!r}, which would ignore it; add --config.dataset={dataset}, or '
          f'leave {key} unset')


def _check_across_keys(config: ml_collections.ConfigDict) -> None:
  """The rules that tie two keys together."""
  if config.target_lang == config.source_lang:
    raise errors.UserError(f'config.target_lang: must differ from config.source_lang, got '
                           f'{config.target_lang!r} for both')
  if config.sample_top_k > config.vocab_size:
    raise errors.UserError(f'config.sample_top_k: must be ≤ config.vocab_size '
                           f'({config.vocab_size}), got {config.sample_top_k}')
  ensemble_weights(config)  # one positive weight a model, or none given
  if config.lr_schedule == 'constant' and not config.learning_rate > 0:
    raise errors.UserError("config.learning_rate: must be > 0 with config.lr_schedule="
                           f"'constant' (the rate throughout), got {config.learning_rate!r}")
  if config.batching == 'packed' and config.dataset == 'synthetic':
    raise errors.UserError("config.batching: the synthetic task has no packed form; use "
                           "'buckets' (or 'auto'), or train on text (config.dataset)")
  if batching_of(config) == 'packed':
    _check_pack_length(config)
  eval_metrics_of(config)
  if config.early_stopping_patience and config.early_stopping_metric == 'dev_bleu' and (
      config.eval_bleu_every_steps <= 0):
    raise errors.UserError("config.early_stopping_metric='dev_bleu': needs dev BLEU during "
                           'training, config.eval_bleu_every_steps > 0 (it is 0); or watch '
                           "'dev_loss'")
  if config.average_last > config.keep_checkpoints:
    raise errors.UserError(f'config.average_last: must be ≤ config.keep_checkpoints '
                           f'({config.keep_checkpoints}), the checkpoints kept to average '
                           f'(§6.1), got {config.average_last}')
  model = config.model
  if model.positional != 'learned':
    return  # sinusoids (§3.5) extend to any length
  # A learned embedding has positions 0..max_len-1 only (Table 3 row E).
  if model.max_len < config.max_length:
    raise errors.UserError(
        f'config.model.max_len: must be ≥ config.max_length ({config.max_length}) with '
        f'learned positions, or training sentences run out of positions, got {model.max_len}')
  if config.decode_extra_length >= model.max_len:
    raise errors.UserError(
        f'config.decode_extra_length: must be < config.model.max_len ({model.max_len}) with '
        f'learned positions: the decoder needs input + decode_extra_length positions, got '
        f'{config.decode_extra_length}')
