"""Beam search with a key/value cache, §6.1.

"We used beam search with a beam size of 4 and length penalty α = 0.6 [Wu et al. 2016] ...
We set the maximum output length during inference to input length + 50, but terminate early
when possible." (§6.1). Hypotheses Y are ranked by log P(Y|X) / lp(Y) with the GNMT penalty
lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the final EOS (as tensor2tensor and flax do).

The whole search is one `jax.jit`. Each step runs the decoder on the newest position of
the k beams of each sentence (the cache of transformer.py), takes the top 2·beam of the
[batch, beam·vocab] extensions, keeps the best `beam` that do not end in EOS as live, and
merges those that do into the n best finished hypotheses of each sentence (n_best, 1 unless
asked). The beams of a sentence share one cache, and the encoder output is not copied per
beam. Re-ranking beams does not move the cache: each beam's ancestry (which beam slot
holds each position of its prefix) is reordered instead, and masks its self-attention
(CacheState). Steps run in `lax.while_loop`s, one per cache length (16, 32, 64, ..., T):
the cost of attending over the cache grows with its length, and a short cache serves the
early steps.

Choices and deviations (the paper leaves them open):
  * the maximum output length is per sentence: |Y| ≤ (its non-padding source tokens) + 50
    (and ≤ max_len with learned positions); at that length only EOS may follow, and EOS's
    probability counts in the score;
  * a source row without words (all padding, or only EOS: an empty line) may only emit
    EOS: its output is empty;
  * token 0 (padding, the start symbol) is never emitted, since a 0 inside an output would
    read as its end; its probability is not renormalised away;
  * a sentence stops early once no live hypothesis can beat its n-th best finished one
    (t2t's `stop_early`, flax's worst finished score); the loop ends when every sentence has
    stopped;
  * beam size 1 takes one candidate a step instead of two, so it is exactly greedy decoding;
  * only the n_best ≤ beam best finished hypotheses are kept, 1 by default (t2t/flax keep
    `beam` of them): a later finish that only ties the n-th best is not kept, since a tie
    keeps the earlier, shorter hypothesis.

n-best (`n_best=n`, static): search's finished_seq/finished_score and beam_search's outputs
gain an axis of n, best first, for every int n, 1 included, so that `--n_best=K` code needs
no special case for K = 1; the default `n_best=None` keeps the single best without that
axis, as callers (evaluate.py) expect. With n = 1 the merge is the single-best update, and
the results of n_best=None and n_best=1 are the same numbers.

Ensembles (not in the paper): `config` a tuple of ModelConfigs and `params` a tuple of their
parameters decode as one model whose next-token log-probabilities are the mean of the
members' log P_m (Marian's ensembles, unweighted; not renormalised), so a hypothesis's
log-prob is the mean of its log P_m(Y|X), and beam search, n-best and sampling.py run over
it unchanged. With `weights` (config.ensemble_weights, summing to 1) the mean is weighted:
Σ_m w_m log P_m. Members share the vocabulary; their sizes may differ, and each keeps its own
encoder output and cache (ensemble_steps).

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
from t2t_jax.model import kernels
from t2t_jax.model.transformer import ModelConfig, Transformer

Array = jax.Array
Cache = Any  # the model's 'cache' collection, a nested dict of arrays
# (carry, live sequences [b, k, T+1], step, segment length) -> (log P(next token) [b, k, v],
# float32, carry)
StepFn = Callable[[Any, Array, Array, int], tuple[Array, Any]]
# Several trained models decoded as one (the module docstring), with a tuple of parameters.
Ensemble = tuple[ModelConfig, ...]

NEG_INF = -jnp.inf  # a true -inf: scores are only ever added, divided by lp > 0 and compared


class Beams(NamedTuple):
  """The while-loop state. Sequences start with the start symbol PAD_ID at position 0."""
  step: Array  # [] tokens generated so far
  live_seqs: Array  # [b, k, T+1]
  live_logprobs: Array  # [b, k] log P of each live prefix, sorted best first; -inf = empty
  finished_seq: Array  # [b, n, T+1] the n best finished hypotheses (EOS, then 0s), see search
  finished_score: Array  # [b, n] their log P / lp, best first; -inf (and 0s) until filled
  carry: Any  # the step function's state: a CacheState (cache and ancestry), or None


def length_penalty(length: Array | int, alpha: float | Array) -> Array:
  """lp(Y) = ((5 + |Y|) / 6)^α: GNMT (Wu et al. 2016, eq. 14), the penalty of §6.1."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def members(config: ModelConfig | Ensemble) -> Ensemble:
  """The models of an ensemble, or the one model as an ensemble of one."""
  return config if isinstance(config, tuple) else (config,)


def max_decode_length(src_len: int, config: ModelConfig | Ensemble, extra_length: int) -> int:
  """Cache length T: the padded source length + extra, within every learned embedding's
  range."""
  length = src_len + extra_length
  for member in members(config):
    if member.positional == 'learned':
      length = min(length, member.max_len)
  return length


def output_limits(src: Array, extra_length: int, max_len: int, eos_id: int = EOS_ID) -> Array:
  """[b] each sentence's longest output |Y| (with EOS): its own input length + extra, §6.1.

  The input length counts every non-padding token, EOS included. A row without words (all
  padding, or only EOS: an empty line) gets 1, so that it can only emit EOS.
  """
  lengths = jnp.sum(src != PAD_ID, axis=1)  # [b]
  words = jnp.sum((src != PAD_ID) & (src != eos_id), axis=1)  # [b]
  return jnp.where(words == 0, 1, jnp.minimum(lengths + extra_length, max_len))


def init_cache(params: Any, encoded: Array, src: Array, max_len: int, *, beam_size: int = 1,
               config: ModelConfig) -> Cache:
  """The decoder's cache for `beam_size` hypotheses of each sentence of src [b, s], with
  outputs of up to `max_len` tokens: zero self-attention keys/values and the encoder output
  projected to cross-attention keys/values (once per sentence, not per hypothesis)."""
  dec = Transformer(config.replace(decode=True, deterministic=True))
  ids = jnp.zeros((src.shape[0], beam_size), jnp.int32)  # [b, k]
  _, variables = dec.apply({'params': params}, encoded, src, ids, cache_length=max_len,
                           method=Transformer.decode, mutable=['cache'])
  return variables['cache']


def decode_step(params: Any, cache: Cache, encoded: Array, src: Array, ids: Array, *,
                beam_mask: Array | None = None, config: ModelConfig) -> tuple[Array, Cache]:
  """One incremental decoder step: ids [b, k] (each hypothesis's previous token) -> logits
  [b, k, v], cache. beam_mask [b, k, k, T]: see `ancestry_mask` (None: no re-ranking)."""
  dec = Transformer(config.replace(decode=True, deterministic=True))
  logits, variables = dec.apply({'params': params, 'cache': cache}, encoded, src, ids,
                                beam_mask=beam_mask, method=Transformer.decode,
                                mutable=['cache'])
  return logits, variables['cache']


class CacheState(NamedTuple):
  """The cached search's carry. The cache is never reordered: re-ranking beams only
  reorders `ancestry`, [b, k, T]: the beam slot that holds each position of each live
  hypothesis's prefix (a cache slot (j, t) is what beam j wrote at step t)."""
  cache: Cache
  ancestry: Array


def ancestry_mask(ancestry: Array, step: Array, length: int) -> tuple[Array, Array]:
  """Marks that this step's keys/values go to each beam's own slot; returns the updated
  ancestry [b, k, T] and the mask [b, k, k, length] of the slots each hypothesis reads."""
  b, k, _ = ancestry.shape
  own = jnp.broadcast_to(jnp.arange(k, dtype=ancestry.dtype)[None, :, None], (b, k, 1))
  ancestry = lax.dynamic_update_slice_in_dim(ancestry, own, step, axis=2)
  mask = ancestry[:, :, None, :length] == jnp.arange(k)[None, None, :, None]  # [b, k, k, T]
  return ancestry, mask


def reorder_ancestry(state: CacheState, parents: Array) -> CacheState:
  """parents [b, k]: the old beam of each new beam; each inherits its parent's prefix."""
  return state._replace(
      ancestry=jnp.take_along_axis(state.ancestry, parents[:, :, None], axis=1))


def _leaf_name(path: tuple) -> str | None:
  return getattr(path[-1], 'key', None)


def grow_cache(cache: Cache, shapes: Cache) -> Cache:
  """Zero-pads the self-attention keys/values at the end to their `shapes` (a longer cache of
  the same batch, from jax.eval_shape); the model masks the positions not yet written."""
  def grow(path: tuple, x: Array, shape: jax.ShapeDtypeStruct) -> Array:
    if _leaf_name(path) not in ('cached_key', 'cached_value') or x.shape == shape.shape:
      return x
    return jnp.pad(x, [(0, new - old) for old, new in zip(x.shape, shape.shape, strict=True)])
  return jax.tree_util.tree_map_with_path(grow, cache, shapes)


def segment_lengths(max_len: int, first: int = 16) -> list[int]:
  """Cache lengths of the successive loops: doubling from `first`, ending at max_len.

  Attending over the whole cache costs time in proportion to its length, so early steps
  run on a short cache; each length is a loop of its own (static shapes).
  """
  lengths = []
  while first < max_len:
    lengths, first = lengths + [first], 2 * first
  return lengths + [max_len]


def log_softmax(logits: Array, row_max: Callable[[Array], Array] = kernels.xla_row_max,
                ) -> Array:
  """log P(next token) [b, k, v] in float32 from logits [b, k, v]. `row_max`: the hardware
  form of jnp.max over the last axis (kernels.Kernels.row_max)."""
  # jax.nn.log_softmax's arithmetic, with row_max for its jnp.max: the same values.
  logits = logits.astype(jnp.float32)
  shifted = logits - row_max(logits)[..., None]  # [b, k, v]
  return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))


def ban_tokens(logp: Array, step: Array, limits: Array, eos_id: int,
               banned_ids: tuple[int, ...] = ()) -> Array:
  """logp [b, k, v] with PAD and `banned_ids` banned (-inf), and EOS forced at each
  sentence's limit [b]. banned_ids: pieces that decode to no text (the vocabulary's
  banned_ids)."""
  vocab = jnp.arange(logp.shape[-1])
  never = np.zeros(logp.shape[-1], bool)
  never[[i for i in (PAD_ID, *banned_ids) if i < len(never)]] = True  # a constant
  banned = never | ((step + 1 >= limits)[:, None, None] & (vocab != eos_id))
  return jnp.where(banned, NEG_INF, logp)


def _next_log_probs(logits: Array, step: Array, limits: Array, eos_id: int,
                    row_max: Callable[[Array], Array] = kernels.xla_row_max) -> Array:
  """log P(next token) [b, k, v] in float32, with PAD banned and EOS forced at the limit."""
  return ban_tokens(log_softmax(logits, row_max), step, limits, eos_id)


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

  lax.top_k puts the lower index first among equal values, and the kept hypotheses come
  before the candidates: a tie keeps the earlier, shorter hypothesis, and among this
  step's the one ranked first by top_k. Unfilled slots (-inf, 0s) come before -inf
  candidates, so a slot holds a sequence only once it holds a finite score.
  """
  n = finished_score.shape[1]
  score, index = lax.top_k(jnp.concatenate([finished_score, scores], axis=1), n)  # [b, n]
  seqs = jnp.concatenate([finished_seq, seqs], axis=1)  # [b, n + c, T+1]
  return jnp.take_along_axis(seqs, index[:, :, None], axis=1), score


def _grow(beams: Beams, logp: Array, reorder: Callable[[Any, Array], Any], *,
          alpha: float | Array, eos_id: int,
          top_k: Callable[[Array, int], tuple[Array, Array]] = lax.top_k) -> Beams:
  """One step: extend every live prefix by every token; keep the best live and the n best
  finished (n = 1: keep_best, the same update for less work than a top-n). `top_k`: the
  hardware form of lax.top_k over the candidates (kernels.Kernels.top_k)."""
  b, k, v = logp.shape
  t = beams.step
  candidates = (beams.live_logprobs[:, :, None] + logp).reshape(b, k * v)  # [b, k·v]
  # 2k candidates always leave k that do not end in EOS (each parent adds at most one EOS);
  # with k = 1, a single candidate makes the search exactly greedy.
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

  A live prefix of `step` tokens with log-prob p ≤ 0 finishes with log P ≤ p at a length
  |Y| in [step + 1, limit], so its score is at most p / max lp(|Y|). lp is monotonic in
  |Y|, so the max is at an end: at the sentence's own limit when α ≥ 0 (the bound of
  tensor2tensor and flax, here per sentence), at step + 1 when α < 0.
  """
  lp_max = jnp.maximum(length_penalty(step + 1, alpha), length_penalty(limits, alpha))
  return live_logprobs / lp_max


def _all_done(beams: Beams, limits: Array, alpha: float | Array) -> Array:
  """True once, in every sentence, no live hypothesis can beat the n-th best finished one:
  no later finish can enter the n best (a tie would not either).

  The n-th is -inf until n have finished. A sentence with no live hypothesis left (bound
  -inf: past its limit) is done even so: an empty line finishes once, and with n > 1 it
  would otherwise keep the whole batch to its longest limit. With n = 1 that test is left
  out (the same compiled loop as before n-best): the forced EOS at the limit fills the slot.
  """
  bound = best_possible_score(beams.live_logprobs[:, 0], beams.step, limits, alpha)  # [b]
  done = beams.finished_score[:, -1] > bound  # [b]
  if beams.finished_score.shape[1] > 1:
    done = done | (bound == NEG_INF)
  return jnp.all(done)


def _initial_beams(batch: int, beam_size: int, n_best: int, max_len: int, carry: Any,
                   ) -> Beams:
  """One live hypothesis per sentence, the empty prefix; the other beams empty (-inf), and
  no finished one yet (-inf, 0s)."""
  live_logprobs = jnp.full((batch, beam_size), NEG_INF).at[:, 0].set(0.0)  # [b, k]
  return Beams(step=jnp.array(0, jnp.int32),
               live_seqs=jnp.full((batch, beam_size, max_len + 1), PAD_ID, jnp.int32),
               live_logprobs=live_logprobs,
               finished_seq=jnp.full((batch, n_best, max_len + 1), PAD_ID, jnp.int32),
               finished_score=jnp.full((batch, n_best), NEG_INF), carry=carry)


class Steps(NamedTuple):
  """A decoder as the search loops use it: the step, its initial carry, and how the carry
  grows to a longer cache and follows re-ranked beams."""
  step: StepFn
  carry: Any
  grow: Callable[[Any, int], Any]
  reorder: Callable[[Any, Array], Any]


def _cached_step(params: Any, encoded: Array, src: Array, lengths: list[int],
                 config: ModelConfig, beam_size: int,
                 ) -> tuple[StepFn, CacheState, Callable[[CacheState, int], CacheState]]:
  """Incremental decoding: each step feeds only the newest token of each beam through the
  cache, which all beams of a sentence share (see CacheState).

  Returns the step, the initial state (a cache of lengths[0] positions) and a function that
  grows the cache to a given length, whatever the model's layout of it.
  """
  def new_cache(params: Any, encoded: Array, src: Array, length: int) -> Cache:
    return init_cache(params, encoded, src, length, beam_size=beam_size, config=config)

  def grow(state: CacheState, length: int) -> CacheState:
    shapes = jax.eval_shape(functools.partial(new_cache, length=length), params, encoded, src)
    return state._replace(cache=grow_cache(state.cache, shapes))

  def step(state: CacheState, seqs: Array, t: Array, length: int) -> tuple[Array, CacheState]:
    ancestry, mask = ancestry_mask(state.ancestry, t, length)
    ids = lax.dynamic_index_in_dim(seqs, t, axis=2, keepdims=False)  # [b, k]
    logits, cache = decode_step(params, state.cache, encoded, src, ids, beam_mask=mask,
                                config=config)  # [b, k, v]
    return log_softmax(logits, config.forms.row_max), CacheState(cache, ancestry)

  ancestry = jnp.zeros((src.shape[0], beam_size, lengths[-1]), jnp.int32)  # [b, k, T]
  return step, CacheState(new_cache(params, encoded, src, lengths[0]), ancestry), grow


def _uncached_step(params: Any, encoded: Array, src: Array, config: ModelConfig,
                   beam_size: int) -> StepFn:
  """The reference without a cache: each step re-runs the decoder on the whole prefix.

  Static shapes inside a loop mean the whole segment (see segment_lengths), not just the
  prefix, is recomputed; the causal mask keeps later positions from mattering.
  """
  model = Transformer(config.replace(deterministic=True))
  encoded, src = (jnp.repeat(x, beam_size, axis=0) for x in (encoded, src))  # [b·k, ...]

  def step(carry: None, seqs: Array, t: Array, length: int) -> tuple[Array, None]:
    b, k = seqs.shape[:2]
    inputs = seqs[:, :, :length].reshape(b * k, length)  # [b·k, length]: start + prefix
    logits = model.apply({'params': params}, encoded, src, inputs, method=Transformer.decode)
    logits = lax.dynamic_index_in_dim(logits, t, axis=1, keepdims=False)  # [b·k, v]
    return log_softmax(logits.reshape(b, k, -1), config.forms.row_max), carry
  return step


def model_steps(params: Any, src: Array, lengths: list[int], *, config: ModelConfig,
                beam_size: int, use_cache: bool = True) -> Steps:
  """One model's decoder for src [b, s] and `beam_size` hypotheses a sentence: the encoder
  output, then cached steps (or the uncached reference) over cache `lengths`."""
  encoder = Transformer(config.replace(deterministic=True))
  encoded = encoder.apply({'params': params}, src, method=Transformer.encode)  # [b, s, m]
  if use_cache:
    step, carry, grow = _cached_step(params, encoded, src, lengths, config, beam_size)
    return Steps(step, carry, grow, reorder_ancestry)
  keep = lambda carry, _: carry  # noqa: E731  (the sequences are the whole state)
  return Steps(_uncached_step(params, encoded, src, config, beam_size), None, keep, keep)


def ensemble_steps(steps: Sequence[Steps], weights: Sequence[float] | None = None) -> Steps:
  """Several models' decoders as one: its log-probabilities are the mean of theirs (weighted
  by `weights`, which sum to 1, if given), and each keeps its own carry (cache and ancestry),
  grown and reordered with the others."""
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
  """model_steps of one model, or ensemble_steps of an ensemble's (params: a tuple), the
  models weighted by `weights` if given."""
  if not isinstance(config, tuple):
    return model_steps(params, src, lengths, config=config, beam_size=beam_size,
                       use_cache=use_cache)
  if not config or len(params) != len(config):
    raise ValueError(f'an ensemble needs one parameter set per model, got {len(params)} for '
                     f'{len(config)}')
  return ensemble_steps([model_steps(p, src, lengths, config=c, beam_size=beam_size,
                                     use_cache=use_cache)
                         for p, c in zip(params, config, strict=True)], weights)


def _run(beams: Beams, steps: Steps, limits: Array, lengths: list[int], *,
         alpha: float | Array, eos_id: int, early_stop: bool,
         top_k: Callable[[Array, int], tuple[Array, Array]],
         banned_ids: tuple[int, ...] = ()) -> Beams:
  """The search loop, one `lax.while_loop` per cache length; each stops at its length."""
  for length in lengths:
    def cond(beams: Beams, length: int = length) -> Array:
      running = beams.step < jnp.minimum(length, jnp.max(limits))
      return running & ~_all_done(beams, limits, alpha) if early_stop else running

    def body(beams: Beams, length: int = length) -> Beams:
      logp, carry = steps.step(beams.carry, beams.live_seqs, beams.step, length)  # [b, k, v]
      logp = ban_tokens(logp, beams.step, limits, eos_id, banned_ids)
      return _grow(beams._replace(carry=carry), logp, steps.reorder, alpha=alpha,
                   eos_id=eos_id, top_k=top_k)

    beams = lax.while_loop(cond, body, beams._replace(carry=steps.grow(beams.carry, length)))
  return beams


def search(params: Any, src: Array, *, config: ModelConfig | Ensemble, beam_size: int = 4,
           alpha: float = 0.6, extra_length: int = 50, eos_id: int = EOS_ID,
           early_stop: bool = True, use_cache: bool = True, n_best: int | None = None,
           banned_ids: tuple[int, ...] = (), weights: Sequence[float] | None = None) -> Beams:
  """Beam search over src [b, s] (§6.1); returns the final loop state. Not jitted itself.

  `early_stop=False` runs every sentence to the longest limit in the batch, with the same
  result; `use_cache=False` recomputes the decoder prefix each step, with the same result.
  `n_best=n` (1 ≤ n ≤ beam_size) keeps the n best finished hypotheses: finished_seq
  [b, n, T+1] and finished_score [b, n], best first; None keeps the best, as [b, T+1], [b].
  An ensemble (config a tuple of ModelConfigs, params a tuple of theirs) is searched as one
  model (the module docstring), its models weighted by `weights` if given. banned_ids:
  never emitted, as PAD is not (ban_tokens).
  """
  if beam_size < 1 or extra_length < 0:
    raise ValueError(f'beam_size must be ≥ 1 and extra_length ≥ 0, got {beam_size}, '
                     f'{extra_length}')
  if n_best is not None and not 1 <= n_best <= beam_size:
    raise ValueError(f'n_best must be in [1, beam_size = {beam_size}], got {n_best}')
  src = jnp.asarray(src, jnp.int32)
  max_len = max_decode_length(src.shape[1], config, extra_length)  # T
  limits = output_limits(src, extra_length, max_len, eos_id)  # [b]
  lengths = segment_lengths(max_len)
  steps = decoder_steps(params, src, lengths, config=config, beam_size=beam_size,
                        use_cache=use_cache, weights=weights)
  beams = _initial_beams(src.shape[0], beam_size, n_best or 1, max_len, steps.carry)
  beams = _run(beams, steps, limits, lengths, alpha=alpha, eos_id=eos_id,
               early_stop=early_stop, top_k=members(config)[0].forms.top_k,
               banned_ids=banned_ids)
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
  then 0s; T = s + extra_length, within a learned embedding's max_len) and their scores
  [b] = log P(Y|X) / lp(Y). Compiled once per (b, s) and set of static keyword arguments.
  `n_best=n` (≤ beam_size) returns the n best of each sentence instead: ids [b, n, T] and
  scores [b, n], best first; a slot no hypothesis finished into holds 0s and -inf.
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
