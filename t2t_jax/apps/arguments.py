"""The arguments of a search, as the Python API (translator.py) and the command line
(translate_command.py) take them: checked (errors.UserError naming the argument), described."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from t2t_jax.config import rules
from t2t_jax.decoding.batch_plan import MAX_SAMPLES, Sampling
from t2t_jax.platform import errors


def flat(overrides: Mapping[str, Any], prefix: str = '') -> Iterator[tuple[str, Any]]:
  """('model.dtype', value) pairs of nested overrides, as --config.model.dtype names them."""
  for key, value in overrides.items():
    if isinstance(value, Mapping):
      yield from flat(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def describe_method(config: ml_collections.ConfigDict) -> str:
  """config's decoding in words, for logs: 'beam 4, alpha 0.60', 'greedy (beam 1), alpha 0.60'
  or 'sampling, temperature 1, top-k all, top-p 1, seed 0'."""
  if config.decode_method == 'sample':
    return (f'sampling, temperature {config.sample_temperature:g}, top-k '
            f'{config.sample_top_k or "all"}, top-p {config.sample_top_p:g}, seed '
            f'{config.sample_seed}')
  if config.decode_method == 'greedy':
    return f'greedy (beam 1), alpha {config.beam_alpha:.2f}'
  return f'beam {config.beam_size}, alpha {config.beam_alpha:.2f}'


def check_sentences(sentences: Any, name: str = 'sentences') -> None:
  """A str or a sequence of str (errors.UserError naming what was given)."""
  if isinstance(sentences, (bytes, bytearray)) or not isinstance(sentences, Sequence):
    raise errors.UserError(f'{name}: a str or a list of str, got {type(sentences).__name__}')
  for i, sentence in enumerate(sentences):
    if not isinstance(sentence, str):
      raise errors.UserError(f'{name}[{i}]: a str, got {type(sentence).__name__}')


def check_settings(method: str, *, alpha: Any = None, temperature: Any = None, top_k: Any = None,
                   top_p: Any = None, seed: Any = None, max_rows: Any = 0) -> None:
  """The Python API's search settings: alpha a number ≥ 0 (as config.beam_alpha), sampling's
  settings only when sampling (never silently ignored), max_rows ≥ 0 (0: no cap)."""
  if alpha is not None and not rules.RULES['beam_alpha'].test(alpha):
    raise errors.UserError(f'alpha={alpha!r}: must be {rules.RULES["beam_alpha"].allowed} '
                           '(as config.beam_alpha)')
  if method != 'sample':
    for name, value in dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed).items():
      if value is not None:
        raise errors.UserError(f"{name}={value!r}: only sampling (method='sample') has it; "
                               f'method={method!r} would ignore it')
  if not rules.int_at_least(0).test(max_rows):
    raise errors.UserError(f'max_rows={max_rows!r}: must be an integer ≥ 0 (0: no cap)')


def check_search(method: Any, beam_size: Any, n_best: Any,
                 config: ml_collections.ConfigDict) -> None:
  """The Python API's method, beam_size and n_best (errors.UserError naming the argument)."""
  if method not in rules.DECODE_METHODS:
    raise errors.UserError(f'method={method!r}: must be one of {rules.DECODE_METHODS}')
  for name, value in (('beam_size', beam_size), ('n_best', n_best)):
    if value is not None and not rules.POSITIVE_INT.test(value):
      raise errors.UserError(f'{name}={value!r}: must be a positive integer (or None)')
  if method == 'greedy' and beam_size not in (None, 1):
    raise errors.UserError(f'beam_size={beam_size}: greedy decoding is beam search with one '
                           "beam; use method='beam' for a wider one")
  if n_best is not None and n_best > n_best_bound(method, beam_size, config):
    raise errors.UserError(f'n_best={n_best}: {n_best_limit(method, beam_size, config)}')


def n_best_bound(method: str, beam_size: int | None, config: ml_collections.ConfigDict) -> int:
  """The most hypotheses a search gives a sentence for n-best: its beam (greedy: one), or
  MAX_SAMPLES samples."""
  if method == 'sample':
    return MAX_SAMPLES
  return 1 if method == 'greedy' else beam_size or config.beam_size


def n_best_limit(method: str, beam_size: int | None, config: ml_collections.ConfigDict) -> str:
  """The bound on n-best in words, for an error message."""
  if method == 'greedy':
    return 'must be 1: greedy decoding keeps one hypothesis (beam search with one beam)'
  most = n_best_bound(method, beam_size, config)
  if method == 'sample':
    return f'must be between 1 and {most} samples a sentence (each is a row of its decoding batch)'
  return f'must be between 1 and the beam size ({most}; config.beam_size)'


def sampling_settings(config: ml_collections.ConfigDict, numbers: list[int],
                      temperature: float | None, top_k: int | None, seed: int | None,
                      top_p: float | None = None) -> Sampling:
  """The settings of a sampling decoder for inputs of these `numbers`, each argument checked
  as its config key is (None: the config's)."""
  temperature = config.sample_temperature if temperature is None else temperature
  seed = config.sample_seed if seed is None else seed
  for name, value in dict(temperature=temperature, top_k=top_k, seed=seed, top_p=top_p).items():
    rule = rules.RULES[f'sample_{name}']
    if value is not None and not rule.test(value):
      raise errors.UserError(f'{name}={value!r}: must be {rule.allowed} (as config.sample_{name})')
  if top_k is not None and top_k > config.vocab_size:
    raise errors.UserError(f'top_k={top_k}: must be ≤ config.vocab_size ({config.vocab_size})')
  # Host arrays, as α is: every process of a multi-host run passes the same values.
  return Sampling(index=np.asarray(numbers, np.int32), temperature=np.float32(temperature),
                  key=np.asarray(jax.random.PRNGKey(seed)))
