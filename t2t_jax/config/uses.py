"""Which mode, dataset and batching use each config key, so that a --config.KEY override that
the command at hand would ignore is an error naming the key and what would use it, not a
silent no-op (`--config.pack_length=128` with §5.1's buckets, `--config.demo_num_train=10`
with `dataset='files'`, `--config.warmup_steps=8000` with `--mode=eval`).

Only overrides are checked: a config file is written for several commands (demo.py sets
pack_length for the GPUs that pack), and the modes that read a trained run get its whole
recorded config. The mode is checked only where no --config is given: a training command
line is reused whole for its other modes (`$RUN --mode=average && $RUN --mode=eval`), its
training keys then meaning nothing, but a key added to a trained run's own command
(`--workdir=DIR --mode=eval --config.warmup_steps=8000`) was meant to do something.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import ml_collections

from t2t_jax.config.modes import MODES
from t2t_jax.platform import errors

TRAINING = frozenset({'train', 'study'})
EVALUATING = frozenset({'eval', 'study', 'average'})  # average: its dev loss
TRAIN_OR_EVAL = TRAINING | EVALUATING
# Beam search or sampling: eval, translate and attention; training's dev BLEU; export's
# generation config.
SEARCHING = frozenset({'eval', 'translate', 'serve', 'attention', 'train', 'study', 'export'})
DECODING_PARAMS = frozenset({'eval', 'translate', 'score', 'serve', 'attention', 'export'})
EVERY_MODE = frozenset(MODES) - {'help', 'plot'}  # those two read no key


@dataclasses.dataclass(frozen=True)
class Use:
  """Where a key is read: the modes (any), and only with these datasets, batchings (as
  resolved for the platform) or decoding methods (None: any)."""
  modes: frozenset[str] = EVERY_MODE
  datasets: frozenset[str] | None = None
  batchings: frozenset[str] | None = None
  methods: frozenset[str] | None = None


def _use(modes: Iterable[str] = EVERY_MODE, datasets: str = '', batchings: str = '',
         methods: str = '') -> Use:
  as_set = lambda names: frozenset(names.split()) or None  # noqa: E731
  return Use(frozenset(modes), as_set(datasets), as_set(batchings), as_set(methods))


_EVERYWHERE = _use()
_TRAINING = _use(TRAINING)
_SEARCH = _use(SEARCHING)
_SAMPLING = _use(SEARCHING, methods='sample')
USES: dict[str, Use] = {
    # Data (§5.1).
    'dataset': _EVERYWHERE, 'source_lang': _EVERYWHERE, 'target_lang': _EVERYWHERE,
    'vocab_size': _EVERYWHERE, 'max_length': _EVERYWHERE,
    'tfds_name': _use(TRAIN_OR_EVAL, 'tfds'), 'tfds_data_dir': _use(TRAIN_OR_EVAL, 'tfds'),
    'tfds_manual_dir': _use(TRAINING, 'tfds'), 'train_split': _use(TRAINING, 'tfds'),
    'dev_split': _use(TRAIN_OR_EVAL, 'tfds'), 'test_split': _use({'eval'}, 'tfds'),
    'train_files': _use(TRAINING, 'files'), 'dev_files': _use(TRAIN_OR_EVAL, 'files'),
    'test_files': _use({'eval'}, 'files'),
    'demo_num_train': _use(TRAIN_OR_EVAL, 'demo'), 'demo_num_eval': _use(TRAIN_OR_EVAL, 'demo'),
    'demo_seed': _use(TRAIN_OR_EVAL, 'demo'),
    'vocab_sample_sentences': _TRAINING, 'tokens_per_batch': _TRAINING,
    'eval_tokens_per_batch': _use(TRAIN_OR_EVAL), 'batching': _use(TRAIN_OR_EVAL),
    'bucket_growth': _use(TRAIN_OR_EVAL, batchings='buckets'),
    'bucket_band': _use(TRAIN_OR_EVAL, batchings='buckets'),
    'pack_length': _use(TRAIN_OR_EVAL, batchings='packed'),
    # The model (§3): every mode builds it, or checks it against the trained run.
    **{f'model.{key}': _EVERYWHERE for key in (
        'num_layers', 'd_model', 'd_ff', 'num_heads', 'd_k', 'd_v', 'dropout_rate', 'positional',
        'max_len', 'dtype', 'kernels')},
    # Training (§5).
    'label_smoothing': _use(TRAIN_OR_EVAL), 'seed': _use(TRAIN_OR_EVAL),
    **{key: _TRAINING for key in (
        'num_train_steps', 'train_minutes', 'warmup_steps', 'adam_beta1', 'adam_beta2',
        'adam_eps', 'learning_rate_scale', 'lr_schedule', 'learning_rate', 'grad_accum_steps',
        'log_every_steps', 'eval_every_steps', 'eval_bleu_every_steps', 'checkpoint_every_steps',
        'checkpoint_every_minutes', 'keep_checkpoints', 'keep_best', 'early_stopping_patience',
        'early_stopping_metric', 'restart', 'init_from')},
    # Averaging and which parameters decode (§6.1).
    'average_last': _use({'average'}), 'average_allow_fewer': _use({'average'}),
    'average_select': _use({'average'}), 'decode_params': _use(DECODING_PARAMS),
    'restore_step': _use(DECODING_PARAMS | {'train', 'average'}),
    # Decoding (§6.1).
    'beam_size': _SEARCH, 'beam_alpha': _use(SEARCHING | {'score'}),
    'decode_extra_length': _SEARCH, 'max_decode_input_length': _use(SEARCHING | {'score'}),
    'export_format': _use({'export'}),
    'decode_method': _SEARCH, 'sample_temperature': _SAMPLING, 'sample_top_k': _SAMPLING,
    'sample_top_p': _SAMPLING, 'sample_seed': _SAMPLING,
    'ensemble': _use({'eval', 'translate', 'score', 'serve'}),
    'ensemble_weights': _use({'eval', 'translate', 'score', 'serve'}),
    'decode_tokens_per_batch': _use(SEARCHING | {'score'}),
    'decode_bucket_growth': _use(SEARCHING | {'score'}), 'eval_split': _use({'eval'}),
    'eval_metrics': _use({'eval'}),
    # The machine.
    'compilation_cache_dir': _use(EVERY_MODE - {'params'}),
    'compile_ahead': _use({'train', 'study', 'eval', 'translate', 'serve'}),
}


def check_overrides_used(config: ml_collections.ConfigDict, mode: str,
                         overridden: Iterable[str], batching: str, *,
                         check_mode: bool = True) -> None:
  """A UserError naming the first of the `overridden` keys ('beam_size', 'model.d_ff') that
  `mode` with this config would not read, and what would. `batching` is config.batching
  resolved for the platform (rules.batching_of); `check_mode` False: any mode may have them
  (a --config file's command line, reused for the run's other modes)."""
  for key in overridden:
    use = USES.get(key)
    if use is None:  # a key of a config file of the user's own: its use is theirs to know
      continue
    reasons = []
    if check_mode and mode not in use.modes:
      reasons.append(f'--mode={"|".join(m for m in MODES if m in use.modes)}')
    if use.datasets and config.dataset not in use.datasets:
      reasons.append(f"config.dataset={'|'.join(sorted(use.datasets))}")
    if use.batchings and batching not in use.batchings:
      resolved = f" ('auto' is {batching!r} here)" if config.batching == 'auto' else ''
      reasons.append(f"config.batching={'|'.join(sorted(use.batchings))}{resolved}")
    if use.methods and config.decode_method not in use.methods:
      reasons.append(f"config.decode_method={'|'.join(sorted(use.methods))}")
    if reasons:
      raise errors.UserError(
          f'--config.{key}: this command would ignore it; it is read with '
          f'{" and ".join(reasons)} (this is --mode={mode}, dataset {config.dataset!r}, '
          f'batching {batching!r}, decode_method {config.decode_method!r}); drop it')
