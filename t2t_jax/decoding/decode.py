"""Beam search with a key/value cache, §6.1.

"We used beam search with a beam size of 4 and length penalty α = 0.6 [Wu et al. 2016] ...
We set the maximum output length during inference to input length + 50, but terminate early
when possible." (§6.1). Hypotheses Y are ranked by log P(Y|X) / lp(Y) with the GNMT penalty
lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the final EOS (as tensor2tensor and flax do).

The whole search is one `jax.jit`. Each step runs the decoder on the newest position of
the k beams of each sentence, takes the top 2·beam of the [batch, beam·vocab] extensions,
keeps the best `beam` that do not end in EOS as live, and merges those that do into the n
best finished hypotheses. The beams of a sentence share one cache, which re-ranking never
moves: each beam's ancestry is reordered instead, and masks its self-attention
(model/cache.py). Steps run in one `lax.while_loop` per cache length (16, 32, 64, ..., T),
since attending over a cache costs in proportion to its length.

Choices and deviations (the paper leaves them open):
  * the maximum output length is per sentence: |Y| ≤ (its non-padding source tokens) + 50
    (and ≤ max_len with learned positions); at that length only EOS may follow, and EOS's
    probability counts in the score;
  * a source row without words (all padding, or only EOS: an empty line) may only emit EOS;
  * token 0 (padding, the start symbol) is never emitted, since a 0 inside an output would
    read as its end; its probability is not renormalised away;
  * a sentence stops early once no live hypothesis can beat its n-th best finished one
    (t2t's `stop_early`, flax's worst finished score); the loop ends when all have stopped;
  * beam size 1 takes one candidate a step instead of two, so it is exactly greedy decoding;
  * only the n_best ≤ beam best finished hypotheses are kept, 1 by default (t2t/flax keep
    `beam`): a later finish that only ties the n-th best is not kept (a tie keeps the
    earlier, shorter hypothesis).

Ensembles (not in the paper): tuples of ModelConfigs and of their parameters decode as one
model whose next-token log-probabilities are the mean of the members' log P_m (Marian's, not
renormalised; with `weights`, config.ensemble_weights summing to 1: Σ_m w_m log P_m), so
beam search, n-best and sampling.py run over it unchanged. Members share the vocabulary;
each keeps its own encoder output and cache (ensemble_steps).

Shapes: b = batch, k = beam, v = vocabulary, T = cache length (the longest output allowed),
n = n_best, c = candidates a step (2k, or 1 when k = 1).
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.model import cache as cache_lib
from t2t_jax.model import kernels
from t2t_jax.model.transformer import ModelConfig, Transformer

Array = jax.Array
Cache = cache_lib.Cache
# (carry, live seqs [b, k, T+1], step, segment length) -> (float32 log P(next) [b, k, v], carry)
StepFn = Callable[[Any, Array, Array, int], tuple[Array, Any]]
Ensemble = tuple[ModelConfig, ...]  # several models decoded as one (the module docstring)

NEG_INF = -jnp.inf  # a true -inf: scores are only ever added, divided by lp > 0 and compared


class Beams(NamedTuple):
  """The while-loop state. Sequences start with the start symbol PAD_ID at position 0."""
  step: Array  # [] tokens generated so far
  live_seqs: Array  # [b, k, T+1]
  live_logprobs: Array  # [b, k] log P of each live prefix, sorted best first; -inf = empty
  finished_seq: Array  # [b, n, T+1] the n best finished hypotheses (EOS, then 0s), see search
  finished_score: Array  # [b, n] their log P / lp, best first; -inf (and 0s) until filled
  carry: Any  # the step function's state: a cache_lib.CacheState, or None


def length_penalty(length: Array | int, alpha: float | Array) -> Array:
  """lp(Y) = ((5 + |Y|) / 6)^α: GNMT (Wu et al. 2016, eq. 14), the penalty of §6.1."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def members(config: ModelConfig | Ensemble) -> Ensemble:
  """The models of an ensemble, or the one model as an ensemble of one."""
  return config if isinstance(config, tuple) else (config,)


def max_decode_length(src_len: int, config: ModelConfig | Ensemble, extra_length: int) -> int:
  """Cache length T: the padded source length + extra, within every learned embedding's."""
  return min([src_len + extra_length,
              *(m.max_len for m in members(config) if m.positional == 'learned')])


def output_limits(src: Array, extra_length: int, max_len: int, eos_id: int = EOS_ID) -> Array:
  """[b] each sentence's longest output |Y| (with EOS): its input length (non-padding tokens,
  EOS included) + extra, §6.1; 1 for a row without words, which may only emit EOS."""
  lengths = jnp.sum(src != PAD_ID, axis=1)  # [b]
  words = jnp.sum((src != PAD_ID) & (src != eos_id), axis=1)  # [b]
  return jnp.where(words == 0, 1, jnp.minimum(lengths + extra_length, max_len))


def init_cache(params: Any, encoded: Array, src: Array, max_len: int, *, beam_size: int = 1,
               config: ModelConfig) -> Cache:
  """The decoder's cache for `beam_size` hypotheses of each sentence of src [b, s] and outputs
  of up to `max_len` tokens: zero self-attention keys/values, the encoder output projected."""
  dec = Transformer(config.replace(decode=True, deterministic=True))
  ids = jnp.zeros((src.shape[0], beam_size), jnp.int32)  # [b, k]
  _, variables = dec.apply({'params': params}, encoded, src, ids, cache_length=max_len,
                           method=Transformer.decode, mutable=['cache'])
  return variables['cache']


def decode_step(params: Any, cache: Cache, encoded: Array, src: Array, ids: Array, *,
                beam_mask: Array | None = None, config: ModelConfig) -> tuple[Array, Cache]:
  """One incremental decoder step: ids [b, k] (each hypothesis's previous token) -> logits
  [b, k, v], cache. beam_mask [b, k, k, T]: cache_lib.ancestry_mask's (None: no re-ranking)."""
  dec = Transformer(config.replace(decode=True, deterministic=True))
  logits, variables = dec.apply({'params': params, 'cache': cache}, encoded, src, ids,
                                beam_mask=beam_mask, method=Transformer.decode, mutable=['cache'])
  return logits, variables['cache']


def segment_lengths(max_len: int, first: int = 16) -> list[int]:
  """Cache lengths of the successive loops: doubling from `first`, ending at max_len."""
  lengths = []
  while first < max_len:
    lengths, first = lengths + [first], 2 * first
  return lengths + [max_len]


def log_softmax(logits: Array, row_max: Callable[[Array], Array] = kernels.xla_row_max) -> Array:
  """log P(next token) [b, k, v] in float32 from logits [b, k, v]: jax.nn.log_softmax's
  arithmetic, with `row_max` (kernels.Kernels.row_max) for its jnp.max."""
  logits = logits.astype(jnp.float32)
  shifted = logits - row_max(logits)[..., None]  # [b, k, v]
  return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def ban_tokens(logp: Array, step: Array, limits: Array, eos_id: int,
               banned_ids: tuple[int, ...] = ()) -> Array:
  """logp [b, k, v] with PAD and `banned_ids` (the vocabulary's pieces that decode to no
  text) banned (-inf), and EOS forced at each sentence's limit [b]."""
  vocab = jnp.arange(logp.shape[-1])
  never = np.zeros(logp.shape[-1], bool)
  never[[i for i in (PAD_ID, *banned_ids) if i < len(never)]] = True  # a constant
  banned = never | ((step + 1 >= limits)[:, None, None] & (vocab != eos_id))
  return jnp.where(banned, NEG_INF, logp)


def keep_best(finished_seq: Array, finished_score: Array, seqs: Array, scores: Array,
              ) -> tuple[Array, Array]:
  """The n = 1 case of merge_n_best, as one argmax and a compare: the state [b, 1, T+1],
  [b, 1] and this step's candidates seqs [b, c, T+1], scores [b, c] -> the better of both."""
  best = jnp.argmax(scores, axis=1)  # [b] the first of equal scores, as lax.top_k
  best_score = jnp.take_along_axis(scores, best[:, None], axis=1)  # [b, 1]
  best_seq = jnp.take_along_axis(seqs, best[:, None, None], axis=1)  # [b, 1, T+1]
  better = best_score > finished_score  # a tie keeps the earlier, shorter hypothesis
  return (jnp.where(better[:, :, None], best_seq, finished_seq),
          jnp.where(better, best_score, finished_score))


def merge_n_best(finished_seq: Array, finished_score: Array, seqs: Array, scores: Array,
                 ) -> tuple[Array, Array]:
  """The n best of the finished hypotheses [b, n, T+1], [b, n] (sorted best first) and this
  step's candidates seqs [b, c, T+1], scores [b, c] (-inf: not finished), best first.

  lax.top_k puts the lower index first among equal values, and the kept come first: a tie
  keeps the earlier, shorter hypothesis, and an unfilled slot (-inf, 0s) a -inf candidate."""
  n = finished_score.shape[1]
  score, index = lax.top_k(jnp.concatenate([finished_score, scores], axis=1), n)  # [b, n]
  seqs = jnp.concatenate([finished_seq, seqs], axis=1)  # [b, n + c, T+1]
  return jnp.take_along_axis(seqs, index[:, :, None], axis=1), score


def _grow(beams: Beams, logp: Array, reorder: Callable[[Any, Array], Any], *,
          alpha: float | Array, eos_id: int,
          top_k: Callable[[Array, int], tuple[Array, Array]] = lax.top_k) -> Beams:
  """One step: extend every live prefix by every token; keep the best live and the n best
  finished (n = 1: keep_best, for less work). `top_k`: kernels.Kernels.top_k."""
  b, k, v = logp.shape
  t = beams.step
  candidates = (beams.live_logprobs[:, :, None] + logp).reshape(b, k * v)  # [b, k·v]
  # 2k candidates always leave k that do not end in EOS (each parent adds at most one EOS).
  top_logprobs, flat = top_k(candidates, 2 * k if k > 1 else 1)  # [b, c]
  parents, tokens = flat // v, flat % v  # [b, c]
  seqs = jnp.take_along_axis(beams.live_seqs, parents[:, :, None], axis=1)  # [b, c, T+1]
  seqs = lax.dynamic_update_index_in_dim(seqs, tokens[:, :, None], t + 1, axis=2)
  is_eos = tokens == eos_id
  live_logprobs, keep = lax.top_k(jnp.where(is_eos, NEG_INF, top_logprobs), k)  # [b, k]
  live_seqs = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)  # [b, k, T+1]
  carry = reorder(beams.carry, jnp.take_along_axis(parents, keep, axis=1))
  scores = jnp.where(is_eos, top_logprobs / length_penalty(t + 1, alpha), NEG_INF)  # [b, c]
  merge = keep_best if beams.finished_score.shape[1] == 1 else merge_n_best
  finished_seq, finished_score = merge(beams.finished_seq, beams.finished_score, seqs, scores)
  return Beams(step=t + 1, live_seqs=live_seqs, live_logprobs=live_logprobs,
               finished_seq=finished_seq, finished_score=finished_score, carry=carry)


def best_possible_score(live_logprobs: Array, step: Array, limits: Array,
                        alpha: float | Array) -> Array:
  """[b] the highest score any continuation of a live prefix [b] can still reach.

  A prefix of `step` tokens with log-prob p ≤ 0 finishes with log P ≤ p at a length |Y| in
  [step + 1, limit], so its score is at most p / max lp(|Y|), at an end since lp is
  monotonic: the sentence's limit when α ≥ 0 (t2t's and flax's bound), step + 1 when α < 0."""
  lp_max = jnp.maximum(length_penalty(step + 1, alpha), length_penalty(limits, alpha))
  return live_logprobs / lp_max


def _all_done(beams: Beams, limits: Array, alpha: float | Array) -> Array:
  """True once, in every sentence, no live hypothesis can beat the n-th best finished one
  (-inf until n have finished), or, with n > 1, none is left (bound -inf): an empty line,
  finished once, would else keep the batch to its longest limit."""
  bound = best_possible_score(beams.live_logprobs[:, 0], beams.step, limits, alpha)  # [b]
  done = beams.finished_score[:, -1] > bound  # [b]
  if beams.finished_score.shape[1] > 1:
    done = done | (bound == NEG_INF)
  return jnp.all(done)


def _initial_beams(batch: int, beam_size: int, n_best: int, max_len: int, carry: Any) -> Beams:
  """One live hypothesis a sentence, the empty prefix; the other beams and finished slots empty."""
  live_logprobs = jnp.full((batch, beam_size), NEG_INF).at[:, 0].set(0.0)  # [b, k]
  return Beams(step=jnp.array(0, jnp.int32),
               live_seqs=jnp.full((batch, beam_size, max_len + 1), PAD_ID, jnp.int32),
               live_logprobs=live_logprobs,
               finished_seq=jnp.full((batch, n_best, max_len + 1), PAD_ID, jnp.int32),
               finished_score=jnp.full((batch, n_best), NEG_INF), carry=carry)


class Steps(NamedTuple):
  """A decoder as the search loops use it: the step, its carry, how that grows and follows beams."""
  step: StepFn
  carry: Any
  grow: Callable[[Any, int], Any]
  reorder: Callable[[Any, Array], Any]


def _cached_steps(params: Any, encoded: Array, src: Array, lengths: list[int],
                  config: ModelConfig, beam_size: int) -> Steps:
  """Incremental decoding: the newest token of each beam through the cache all beams of a
  sentence share (cache_lib.CacheState), lengths[0] positions at first, grown whatever its
  layout."""
  new_cache = functools.partial(init_cache, beam_size=beam_size, config=config)

  def grow(state: cache_lib.CacheState, length: int) -> cache_lib.CacheState:
    shapes = jax.eval_shape(functools.partial(new_cache, max_len=length), params, encoded, src)
    return state._replace(cache=cache_lib.grow_cache(state.cache, shapes))

  def step(state: cache_lib.CacheState, seqs: Array, t: Array, length: int,
           ) -> tuple[Array, cache_lib.CacheState]:
    ancestry, mask = cache_lib.ancestry_mask(state.ancestry, t, length)
    ids = lax.dynamic_index_in_dim(seqs, t, axis=2, keepdims=False)  # [b, k]
    logits, cache = decode_step(params, state.cache, encoded, src, ids, beam_mask=mask,
                                config=config)  # [b, k, v]
    return log_softmax(logits, config.forms.row_max), cache_lib.CacheState(cache, ancestry)

  ancestry = jnp.zeros((src.shape[0], beam_size, lengths[-1]), jnp.int32)  # [b, k, T]
  state = cache_lib.CacheState(new_cache(params, encoded, src, lengths[0]), ancestry)
  return Steps(step, state, grow, cache_lib.reorder_ancestry)


def _uncached_steps(params: Any, encoded: Array, src: Array, lengths: list[int],
                    config: ModelConfig, beam_size: int) -> Steps:
  """The reference without a cache: each step re-runs the decoder on the whole segment
  (static shapes), the causal mask keeping positions after the prefix from mattering."""
  model = Transformer(config.replace(deterministic=True))
  encoded, src = (jnp.repeat(x, beam_size, axis=0) for x in (encoded, src))  # [b·k, ...]

  def step(carry: None, seqs: Array, t: Array, length: int) -> tuple[Array, None]:
    b, k = seqs.shape[:2]
    inputs = seqs[:, :, :length].reshape(b * k, length)  # [b·k, length]: start + prefix
    logits = model.apply({'params': params}, encoded, src, inputs, method=Transformer.decode)
    logits = lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False)  # [b·k, v]
    return log_softmax(logits.reshape(b, k, -1), config.forms.row_max), carry

  keep = lambda carry, _: carry  # noqa: E731  (the sequences are the whole state)
  return Steps(step, None, keep, keep)


def ensemble_steps(steps: Sequence[Steps], weights: Sequence[float] | None = None) -> Steps:
  """Several models' decoders as one: the mean of their log-probabilities (weighted by
  `weights`, summing to 1, if given), each model's carry its own."""
  def step(carry: tuple, seqs: Array, t: Array, length: int) -> tuple[Array, tuple]:
    outputs = [m.step(c, seqs, t, length) for m, c in zip(steps, carry, strict=True)]
    # Not renormalised, so that a hypothesis's log-prob is the mean of its members'.
    if weights is None:
      logp = functools.reduce(operator.add, [logp for logp, _ in outputs]) / len(steps)
    else:
      logp = functools.reduce(operator.add, [logp * w for (logp, _), w in
                                             zip(outputs, weights, strict=True)])
    return logp, tuple(c for _, c in outputs)

  def grow(carry: tuple, length: int) -> tuple:
    return tuple(m.grow(c, length) for m, c in zip(steps, carry, strict=True))

  def reorder(carry: tuple, parents: Array) -> tuple:
    return tuple(m.reorder(c, parents) for m, c in zip(steps, carry, strict=True))
  return Steps(step, tuple(m.carry for m in steps), grow, reorder)


def decoder_steps(params: Any, src: Array, lengths: list[int], *,
                  config: ModelConfig | Ensemble, beam_size: int, use_cache: bool = True,
                  weights: Sequence[float] | None = None) -> Steps:
  """The decoder of src [b, s] for `beam_size` hypotheses a sentence and cache `lengths`: one
  model's, or ensemble_steps of an ensemble's (params: a tuple)."""
  def steps(params: Any, config: ModelConfig) -> Steps:
    encoder = Transformer(config.replace(deterministic=True))
    encoded = encoder.apply({'params': params}, src, method=Transformer.encode)  # [b, s, m]
    make = _cached_steps if use_cache else _uncached_steps
    return make(params, encoded, src, lengths, config, beam_size)

  if not isinstance(config, tuple):
    return steps(params, config)
  if not config or len(params) != len(config):
    raise ValueError(f'an ensemble needs one parameter set per model, got {len(params)} for '
                     f'{len(config)}')
  return ensemble_steps([steps(p, c) for p, c in zip(params, config, strict=True)], weights)


def search(params: Any, src: Array, *, config: ModelConfig | Ensemble, beam_size: int = 4,
           alpha: float = 0.6, extra_length: int = 50, eos_id: int = EOS_ID,
           early_stop: bool = True, use_cache: bool = True, n_best: int | None = None,
           banned_ids: tuple[int, ...] = (), weights: Sequence[float] | None = None) -> Beams:
  """Beam search over src [b, s] (§6.1); returns the final loop state. Not jitted itself.

  `early_stop=False` (every sentence to the batch's longest limit) and `use_cache=False`
  (the decoder prefix recomputed each step) give the same result. `n_best=n` (1 ≤ n ≤
  beam_size): finished_seq [b, n, T+1] and finished_score [b, n], best first; None: [b, T+1]
  and [b]. config and params may be an ensemble's tuples, weighted by `weights` (the module
  docstring). banned_ids: never emitted, as PAD is not (ban_tokens).
  """
  if beam_size < 1 or extra_length < 0:
    raise ValueError(f'beam_size must be ≥ 1 and extra_length ≥ 0, got {beam_size}, {extra_length}')
  if n_best is not None and not 1 <= n_best <= beam_size:
    raise ValueError(f'n_best must be in [1, beam_size = {beam_size}], got {n_best}')
  src = jnp.asarray(src, jnp.int32)
  max_len = max_decode_length(src.shape[1], config, extra_length)  # T
  limits = output_limits(src, extra_length, max_len, eos_id)  # [b]
  lengths = segment_lengths(max_len)
  steps = decoder_steps(params, src, lengths, config=config, beam_size=beam_size,
                        use_cache=use_cache, weights=weights)
  beams = _initial_beams(src.shape[0], beam_size, n_best or 1, max_len, steps.carry)
  for length in lengths:  # one `lax.while_loop` per cache length, each stops at its length
    def cond(beams: Beams, length: int = length) -> Array:
      running = beams.step < jnp.minimum(length, jnp.max(limits))
      return running & ~_all_done(beams, limits, alpha) if early_stop else running

    def body(beams: Beams, length: int = length) -> Beams:
      logp, carry = steps.step(beams.carry, beams.live_seqs, beams.step, length)  # [b, k, v]
      logp = ban_tokens(logp, beams.step, limits, eos_id, banned_ids)
      return _grow(beams._replace(carry=carry), logp, steps.reorder, alpha=alpha,
                   eos_id=eos_id, top_k=members(config)[0].forms.top_k)

    beams = lax.while_loop(cond, body, beams._replace(carry=steps.grow(beams.carry, length)))
  if n_best is None:  # the single best, without the n axis
    beams = beams._replace(finished_seq=beams.finished_seq[:, 0],
                           finished_score=beams.finished_score[:, 0])
  return beams


# α is traced, not static: changing it needs no recompilation.
@functools.partial(jax.jit, static_argnames=('config', 'beam_size', 'extra_length', 'eos_id',
                                             'early_stop', 'use_cache', 'n_best', 'weights'))
def beam_search(params: Any, src: Array, *, config: ModelConfig | Ensemble, beam_size: int = 4,
                alpha: float = 0.6, extra_length: int = 50, eos_id: int = EOS_ID,
                early_stop: bool = True, use_cache: bool = True, n_best: int | None = None,
                weights: tuple[float, ...] | None = None) -> tuple[Array, Array]:
  """The best hypothesis of each sentence under beam search (§6.1), in one compiled call.

  src [b, s] ids, 0-padded. Returns ids [b, T] (without the start symbol, ending at EOS,
  then 0s; T = s + extra_length, within a learned embedding's max_len) and scores [b] =
  log P(Y|X) / lp(Y); with `n_best=n`, ids [b, n, T] and scores [b, n], best first, a slot
  no hypothesis finished into holding 0s and -inf. Compiled once per (b, s) and statics.
  """
  beams = search(params, src, config=config, beam_size=beam_size, alpha=alpha,
                 extra_length=extra_length, eos_id=eos_id, early_stop=early_stop,
                 use_cache=use_cache, n_best=n_best, weights=weights)
  return beams.finished_seq[..., 1:], beams.finished_score


def greedy_decode(params: Any, src: Array, *, config: ModelConfig, extra_length: int = 50,
                  eos_id: int = EOS_ID) -> tuple[Array, Array]:
  """Greedy decoding: beam search with one beam (its score still divides by lp(Y), α=0.6)."""
  return beam_search(params, src, config=config, beam_size=1, extra_length=extra_length,
                     eos_id=eos_id)
