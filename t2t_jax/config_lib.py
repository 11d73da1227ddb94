"""Checks an experiment config before anything is built, naming the key that is wrong."""
from __future__ import annotations

import dataclasses

import ml_collections

from t2t_jax.model import ModelConfig

DATASETS = ('tfds', 'files', 'demo', 'synthetic')


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
  """ModelConfig straight from `config.model` (and the shared `config.vocab_size`)."""
  known = {f.name for f in dataclasses.fields(ModelConfig)} - {'vocab_size', 'deterministic',
                                                               'decode'}
  unknown = sorted(set(config.model.keys()) - known)
  if unknown:
    raise ValueError(f'config.model.{unknown[0]}: unknown key; known keys: {sorted(known)}')
  return ModelConfig(vocab_size=config.vocab_size, **config.model.to_dict())


def _positive_int(config: ml_collections.ConfigDict, key: str) -> None:
  value = config[key]
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f'config.{key}: must be a positive integer, got {value!r}')


def validate(config: ml_collections.ConfigDict) -> ModelConfig:
  """Raises ValueError naming the first bad key; returns the model's config."""
  model = model_config(config)
  for key in ('num_train_steps', 'warmup_steps', 'log_every_steps', 'eval_every_steps',
              'tokens_per_batch', 'max_length'):
    _positive_int(config, key)
  for key in ('keep_checkpoints', 'average_last'):
    _positive_int(config, key)
  for key in ('beam_size', 'decode_tokens_per_batch', 'max_decode_input_length'):
    _positive_int(config, key)
  for key in ('checkpoint_every_steps', 'checkpoint_every_minutes', 'eval_bleu_every_steps',
              'decode_extra_length', 'beam_alpha', 'train_minutes'):
    if not config[key] >= 0:
      raise ValueError(f'config.{key}: must be ≥ 0 (0 = off), got {config[key]!r}')
  if not config.label_smoothing >= 0.0 or not config.label_smoothing < 1.0:
    raise ValueError(f'config.label_smoothing: must be in [0, 1), got {config.label_smoothing!r}')
  for key, low, high in (('adam_beta1', 0.0, 1.0), ('adam_beta2', 0.0, 1.0)):
    if not low <= config[key] < high:
      raise ValueError(f'config.{key}: must be in [{low}, {high}), got {config[key]!r}')
  if not config.adam_eps > 0 or not config.learning_rate_scale > 0:
    key = 'adam_eps' if not config.adam_eps > 0 else 'learning_rate_scale'
    raise ValueError(f'config.{key}: must be positive, got {config[key]!r}')
  if config.dataset not in DATASETS:
    raise ValueError(f'config.dataset: must be one of {DATASETS}, got {config.dataset!r}')
  if model.positional == 'learned' and model.max_len < config.max_length:
    raise ValueError(f'config.model.max_len={model.max_len} is shorter than '
                     f'config.max_length={config.max_length}: learned positions would run out')
  return model
