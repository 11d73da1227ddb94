"""Sampling: each output token drawn from the model's distribution (not in the paper, which
decodes by beam search, §6.1; back-translation samples its synthetic sources so).

Token t is drawn from softmax(log P(· | y_<t, X) / T), T the temperature, over the top_k
likeliest tokens (0: all), then, with top_p < 1, over the fewest of those whose tempered
probabilities add up to top_p (nucleus sampling, Holtzman et al. 2020), renormalised. log P
is the model's or an ensemble's (decode.ensemble_steps), and beam search's rules hold: PAD
is never drawn, only EOS may follow at the sentence's limit, an output ends at its EOS.

Reproducible: draw t of sample j of a sentence is keyed
fold_in(fold_in(fold_in(PRNGKey(seed), index), j), t), `index` its number in the input (its
line, from 0), so that an output does not depend on its batch (whose shape may round the
arithmetic otherwise, which changes a draw only if it moves a variate across a boundary).

Score: log P(Y|X) of the drawn tokens (EOS included) under the untempered model over the
whole vocabulary, without the length penalty. n samples of a sentence (`n_samples`,
--n_best): its row repeated n times, sample j keyed by j, returned best first by score,
duplicates kept (each an independent draw).

Shapes: b = batch, n = samples a sentence, r = b·n rows, v = vocabulary, T = the longest
output allowed.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.decoding import decode
from t2t_jax.model.transformer import ModelConfig

Array = jax.Array


class Draws(NamedTuple):
  """The while-loop state. Sequences start with the start symbol PAD_ID at position 0."""
  step: Array  # [] tokens drawn so far
  seqs: Array  # [r, T+1] the tokens drawn, then 0s after EOS
  logprob: Array  # [r] log P of each output so far (untempered)
  done: Array  # [r] whether it has drawn its EOS
  carry: Any  # the step function's state (decode.Steps)


def row_keys(key: Array, index: Array, n_samples: int) -> Array:
  """[b·n] keys: sample j of the sentence numbered index[i] (row i·n + j) gets
  fold_in(fold_in(key, index[i]), j), whatever batch it is in."""
  def sentence_keys(i: Array) -> Array:
    sentence = jax.random.fold_in(key, i)
    return jax.vmap(lambda j: jax.random.fold_in(sentence, j))(jnp.arange(n_samples))
  keys = jax.vmap(sentence_keys)(index)  # [b, n, ...]
  return keys.reshape(-1, *keys.shape[2:])


def choose(keys: Array, logp: Array, temperature: float | Array, top_k: int,
           top_k_fn: Any = lax.top_k, top_p: float = 1.0) -> Array:
  """[r] tokens, each drawn from softmax(logp / T) over its row's top_k (0: all) of logp
  [r, v], then over the nucleus of mass top_p of those (1.0: all). `top_k_fn`: as lax.top_k."""
  if not top_k:
    return jax.vmap(jax.random.categorical)(keys, nucleus(logp / temperature, top_p))
  # Drawing among the k largest alone: exactly k candidates, ties taken as lax.top_k does.
  values, tokens = top_k_fn(logp, top_k)  # [r, k]
  chosen = jax.vmap(jax.random.categorical)(keys, nucleus(values / temperature, top_p))  # [r]
  return jnp.take_along_axis(tokens, chosen[:, None], axis=1)[:, 0]


def nucleus(logits: Array, top_p: float) -> Array:
  """logits [r, n] with -inf outside each row's nucleus: the fewest largest whose
  probabilities (softmax of the row) add up to top_p (the largest always; 1.0: all)."""
  if top_p >= 1.0:
    return logits
  order = jnp.argsort(-logits, axis=-1, stable=True)  # [r, n] largest first
  ranked = jnp.take_along_axis(logits, order, axis=-1)
  probs = jax.nn.softmax(ranked, axis=-1)
  inside = jnp.cumsum(probs, axis=-1) - probs < top_p  # the mass before it: short of top_p
  keep = jnp.zeros_like(inside).at[jnp.arange(logits.shape[0])[:, None], order].set(inside)
  return jnp.where(keep, logits, -jnp.inf)


def _run(draws: Draws, steps: decode.Steps, limits: Array, lengths: list[int], keys: Array, *,
         temperature: float | Array, top_k: int, top_k_fn: Any, top_p: float, eos_id: int,
         banned_ids: tuple[int, ...]) -> Draws:
  """The sampling loop, as decode.search's, until every row has drawn its EOS: each step,
  every unfinished row draws its next token; a finished one adds PAD and nothing to its score."""
  def body(draws: Draws, length: int) -> Draws:
    t = draws.step
    logp, carry = steps.step(draws.carry, draws.seqs[:, None], t, length)  # [r, 1, v]: 1 beam
    logp = decode.ban_tokens(logp, t, limits, eos_id, banned_ids)[:, 0]  # [r, v]
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, t)  # [r]
    tokens = choose(step_keys, logp, temperature, top_k, top_k_fn, top_p)  # [r]
    tokens = jnp.where(draws.done, PAD_ID, tokens)
    token_logp = jnp.take_along_axis(logp, tokens[:, None], axis=1)[:, 0]  # [r]
    seqs = lax.dynamic_update_index_in_dim(draws.seqs, tokens[:, None], t + 1, axis=1)
    return Draws(step=t + 1, seqs=seqs,
                 logprob=draws.logprob + jnp.where(draws.done, 0.0, token_logp),
                 done=draws.done | (tokens == eos_id), carry=carry)

  for length in lengths:
    def cond(draws: Draws, length: int = length) -> Array:
      return (draws.step < jnp.minimum(length, jnp.max(limits))) & ~jnp.all(draws.done)
    draws = lax.while_loop(cond, functools.partial(body, length=length),
                           draws._replace(carry=steps.grow(draws.carry, length)))
  return draws


def draw(params: Any, src: Array, index: Array, key: Array, *,
         config: ModelConfig | decode.Ensemble, temperature: float | Array = 1.0,
         top_k: int = 0, n_samples: int | None = None, extra_length: int = 50,
         eos_id: int = EOS_ID, use_cache: bool = True, banned_ids: tuple[int, ...] = (),
         top_p: float = 1.0, weights: Sequence[float] | None = None) -> tuple[Array, Array]:
  """Samples of each sentence of src [b, s] (0-padded), the module docstring's; not jitted.

  index [b]: each sentence's number in the input (its keys'); key: PRNGKey(seed). Returns
  ids [b, T] (without the start symbol, ending at EOS, then 0s) and scores [b] = log P(Y|X);
  with n_samples=n, ids [b, n, T] and scores [b, n], best first. config, params and
  `weights` as decode.search's; banned_ids: never drawn (the vocabulary's, sampling=True)."""
  vocab_size = decode.members(config)[0].vocab_size
  if (not 0 <= top_k <= vocab_size or extra_length < 0 or not 0 < top_p <= 1
      or (n_samples is not None and n_samples < 1)):
    raise ValueError(f'top_k must be in [0, vocab_size = {vocab_size}], extra_length ≥ 0, '
                     f'n_samples ≥ 1 and top_p in (0, 1], got {top_k}, {extra_length}, '
                     f'{n_samples}, {top_p}')
  n = n_samples or 1
  b = src.shape[0]
  src = jnp.repeat(jnp.asarray(src, jnp.int32), n, axis=0)  # [r, s]: row i·n + j
  max_len = decode.max_decode_length(src.shape[1], config, extra_length)  # T
  limits = decode.output_limits(src, extra_length, max_len, eos_id)  # [r]
  lengths = decode.segment_lengths(max_len)
  steps = decode.decoder_steps(params, src, lengths, config=config, beam_size=1,
                               use_cache=use_cache, weights=weights)
  draws = Draws(step=jnp.array(0, jnp.int32),
                seqs=jnp.full((b * n, max_len + 1), PAD_ID, jnp.int32),
                logprob=jnp.zeros(b * n, jnp.float32), done=jnp.zeros(b * n, bool),
                carry=steps.carry)
  draws = _run(draws, steps, limits, lengths, row_keys(key, index, n), temperature=temperature,
               top_k=top_k, top_k_fn=decode.members(config)[0].forms.top_k, top_p=top_p,
               eos_id=eos_id, banned_ids=banned_ids)
  ids, scores = draws.seqs[:, 1:].reshape(b, n, max_len), draws.logprob.reshape(b, n)
  if n_samples is None:
    return ids[:, 0], scores[:, 0]
  order = jnp.argsort(-scores, axis=1, stable=True)  # [b, n] best first
  return jnp.take_along_axis(ids, order[:, :, None], axis=1), jnp.take_along_axis(
      scores, order, axis=1)


# `draw` in one compiled call, once per (b, s) and set of static arguments; the temperature
# and key are traced, so that another temperature or seed needs no recompilation.
sample = jax.jit(draw, static_argnames=('config', 'top_k', 'n_samples', 'extra_length', 'eos_id',
                                        'use_cache', 'banned_ids', 'top_p', 'weights'))
