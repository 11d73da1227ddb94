"""The decoder's key/value cache: §3.1's auto-regressive decoder one position at a time, for
§6.1's beam search.

A decoding step runs the decoder on the newest position only; the keys and values of the
earlier ones come from the cache. Self-attention's cache holds slot (j, t), what hypothesis j
of a sentence wrote at step t, for all k hypotheses (beams) of the sentence together; re-ranking
beams never moves it: each hypothesis's ancestry (CacheState) says which slots its prefix was
written to, and masks the others (ancestry_mask). Cross-attention's holds the encoder output's
keys and values, projected once. The search grows the cache in segments (grow_cache).

Its layout is a hardware form, chosen by config.model.kernels (kernels.Kernels.cache):
  'plain'  keys and values [b, k, T, h, d], read as one sequence of n = k·T slots [b, n, h, d]
           as flax's [b, T, h, d] cache is; the encoder's [b, s, h, d] as projected. The step's
           key and value are written first, then attended as any others, by the model's own
           attention (`Attend`): what GPU and TPU compilers take as it is.
  'cpu'    keys [b, h, d, k, T] and values [b, h, k, T, d], the encoder's keys and values
           [b, h, d, s]: the layouts XLA:CPU's dots read fastest for a few queries. The cache is
           only read, the step's own position attended apart, so that XLA writes the new keys
           into it in place (xla.CPU_FLAGS). What each saves: docs/performance.md.
Both give the same numbers up to summation order.

Einsum letters as transformer.py's: b = batch, q = query (one a hypothesis), k = key position
(of the source), h = head, d = d_k or d_v; n = self-attention's cached slots. Elsewhere k is
the hypotheses a sentence, T the cache length, s the source length.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from t2t_jax.model import kernels

Array = jax.Array
Cache = Any  # the model's 'cache' collection, a nested dict of arrays
# The model's attention (§3.2.1): (query [b, q, h, d_k], key [b, n, h, d_k], value
# [b, n, h, d_v], mask broadcastable to [b, h, q, n]) -> ([b, q, h, d_v], weights or None).
Attend = Callable[[Array, Array, Array, Array | None], tuple[Array, Array | None]]


class Layout(NamedTuple):
  """One form of the cache (the module docstring): how it is stored and attended over."""
  cross: Callable[[Array], Array]  # the encoder's keys or values [b, s, h, d] -> as stored
  # (query, stored key, stored value, mask [b, 1, 1, s], attend) -> (out, weights)
  cross_attention: Callable[..., tuple[Array, Array | None]]
  shapes: Callable[..., tuple[tuple[int, ...], tuple[int, ...]]]  # (b, k, T, h, d_k, d_v)
  # (query, key, value [b, k, h, d], cached key, value, mask [., k, k, T], step, write, attend)
  # -> (out [b, k, h, d_v], weights, (cached key, value) with the step's written if `write`)
  self_attention: Callable[..., tuple[Array, Array | None, tuple[Array, Array]]]


def attend(module: nn.Module, layout: str, kind: str, query: Array,
           project: Callable[[], tuple[Array, Array]], mask: Array | None, attention: Attend, *,
           length: int | None) -> tuple[Array, Array | None]:
  """One decoding step of `module`'s attention ('self' or 'cross', §3.2.3) over its cache in
  `layout` (LAYOUTS), its variables in `module`'s 'cache' collection.

  query [b, k, h, d_k]; project() -> the step's keys and values [b, ., h, d] (cross: the
  encoder output's, computed once, when the cache is created). A call with `length` (T)
  creates the cache (self: zeros) and writes nothing. Self-attention's `mask` [b, k, k, T]:
  Transformer.decode's beam_mask (None: each hypothesis its own slots)."""
  form = LAYOUTS[layout]
  if kind == 'cross':
    creating = not module.has_variable('cache', 'cross_key')
    stored = [form.cross(x) for x in project()] if creating else [None, None]
    key = module.variable('cache', 'cross_key', lambda: stored[0]).value
    value = module.variable('cache', 'cross_value', lambda: stored[1]).value
    return form.cross_attention(query, key, value, mask, attention)
  key, value = project()  # [b, k, h, d_k], [b, k, h, d_v]
  (b, k, h, d_k), d_v = key.shape, value.shape[-1]
  key_shape, value_shape = form.shapes(b, k, length, h, d_k, d_v)
  creating = not module.has_variable('cache', 'cached_key')
  cached_key = module.variable('cache', 'cached_key', jnp.zeros, key_shape, key.dtype)
  cached_value = module.variable('cache', 'cached_value', jnp.zeros, value_shape, value.dtype)
  index = module.variable('cache', 'index', lambda: jnp.array(0, jnp.int32))
  if mask is None:
    mask = jnp.eye(k, dtype=bool)[None, :, :, None]  # [1, k, k, 1]
  out, weights, written = form.self_attention(
      query, key, value, cached_key.value, cached_value.value, mask, index.value,
      not creating, attention)
  if not creating:
    cached_key.value, cached_value.value = written
    index.value = index.value + 1
  return out, weights


# ---------------------------------------------------------------- 'plain': [b, k, T, h, d]

def plain_shapes(b: int, k: int, length: int, h: int, d_k: int, d_v: int,
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
  return (b, k, length, h, d_k), (b, k, length, h, d_v)


def plain_cross_attention(query: Array, key: Array, value: Array, mask: Array | None,
                          attention: Attend) -> tuple[Array, Array | None]:
  return attention(query, key, value, mask)  # key, value [b, s, h, d]


def plain_self_attention(query: Array, key: Array, value: Array, cached_key: Array,
                         cached_value: Array, mask: Array, step: Array, write: bool,
                         attention: Attend) -> tuple[Array, Array | None, tuple[Array, Array]]:
  """The step's keys and values written to slots (j, step), then all the slots each
  hypothesis descends from attended, its own newest among them."""
  b, k, length = cached_key.shape[:3]
  if write:
    cached_key = lax.dynamic_update_slice_in_dim(cached_key, key[:, :, None], step, axis=2)
    cached_value = lax.dynamic_update_slice_in_dim(cached_value, value[:, :, None], step, axis=2)
  visible = (mask & (jnp.arange(length) <= step)).reshape(-1, 1, k, k * length)  # [., 1, k, n]
  out, weights = attention(query, cached_key.reshape(b, k * length, *cached_key.shape[3:]),
                           cached_value.reshape(b, k * length, *cached_value.shape[3:]), visible)
  return out, weights, (cached_key, cached_value)


# ---------------------------------------------------------------- 'cpu': [b, h, d, k, T]

def cpu_shapes(b: int, k: int, length: int, h: int, d_k: int, d_v: int,
               ) -> tuple[tuple[int, ...], tuple[int, ...]]:
  return (b, h, d_k, k, length), (b, h, k, length, d_v)


@kernels.cpu_form
def cpu_cross(x: Array) -> Array:
  return jnp.transpose(x, (0, 2, 3, 1))  # [b, s, h, d] -> [b, h, d, s]


@kernels.cpu_form
def cpu_cross_attention(query: Array, key: Array, value: Array, mask: Array | None,
                        attention: Attend) -> tuple[Array, Array]:
  """Scaled dot-product attention (§3.2.1) over key and value [b, h, d, s]."""
  del attention  # the model's reads [b, s, h, d]
  scale = np.sqrt(query.shape[-1]).astype(np.float32)  # √d_k
  logits = kernels.einsum_f32('bqhd,bhdk->bhqk', query, key) / scale
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum('bhqk,bhdk->bqhd', weights.astype(value.dtype), value)  # [b, q, h, d_v]
  return out, weights


@kernels.cpu_form
def cpu_self_attention(query: Array, key: Array, value: Array, cached_key: Array,
                       cached_value: Array, mask: Array, step: Array, write: bool,
                       attention: Attend) -> tuple[Array, Array, tuple[Array, Array]]:
  """The slots written before this step, then the step's own keys and values, attended; those
  written to slots (j, step) after, so that the cache is only read before its update."""
  del attention  # the cache and the own position are attended apart (cpu_cached_attention)
  b, h, d_k, k, length = cached_key.shape
  d_v = cached_value.shape[-1]
  mask = jnp.broadcast_to(mask & (jnp.arange(length) < step), (b, k, k, length))
  out, weights = cpu_cached_attention(
      query, key, value, cached_key.reshape(b, h, d_k, k * length),
      cached_value.reshape(b, h, k * length, d_v), mask.reshape(b, 1, k, k * length))
  if write:
    new_key = jnp.transpose(key, (0, 2, 3, 1))[..., None]  # [b, h, d, k, 1]
    new_value = jnp.transpose(value, (0, 2, 1, 3))[:, :, :, None]  # [b, h, k, 1, d]
    cached_key = lax.dynamic_update_slice_in_dim(cached_key, new_key, step, axis=4)
    cached_value = lax.dynamic_update_slice_in_dim(cached_value, new_value, step, axis=3)
  return out, weights, (cached_key, cached_value)


def cpu_cached_attention(query: Array, key: Array, value: Array, cached_key: Array,
                         cached_value: Array, cache_mask: Array) -> tuple[Array, Array]:
  """Scaled dot-product attention (§3.2.1) of one decoding step over the n cached slots that
  cache_mask [b, 1, q, n] allows and the step's own position.

  query/key/value [b, q, h, d], one row per hypothesis; cached_key [b, h, d, n] and
  cached_value [b, h, n, d]. The cache is only read, never concatenated with the new key, so
  that XLA can write that into it in place. Returns ([b, q, h, d_v], weights [b, h, q, n + 1],
  own position last).
  """
  scale = 1 / np.sqrt(query.shape[-1]).astype(np.float32)
  old = kernels.einsum_f32('bqhd,bhdn->bhqn', query, cached_key) * scale  # [b, h, q, n]
  old = jnp.where(cache_mask, old, jnp.finfo(jnp.float32).min)
  own = kernels.einsum_f32('bqhd,bqhd->bhq', query, key)[..., None] * scale  # [b, h, q, 1]
  weights = jax.nn.softmax(jnp.concatenate([old, own], axis=-1), axis=-1).astype(value.dtype)
  # Written [b, h, q, d], then transposed: XLA:CPU's dot is much slower writing [b, q, h, d].
  from_cache = jnp.einsum('bhqn,bhnd->bhqd', weights[..., :-1], cached_value)  # [b, h, q, d_v]
  from_own = jnp.einsum('bhq,bqhd->bqhd', weights[..., -1], value)  # [b, q, h, d_v]
  out = jnp.transpose(from_cache, (0, 2, 1, 3)) + from_own  # [b, q, h, d_v]
  return out, weights


LAYOUTS = {
    'plain': Layout(lambda x: x, plain_cross_attention, plain_shapes, plain_self_attention),
    'cpu': Layout(cpu_cross, cpu_cross_attention, cpu_shapes, cpu_self_attention),
}


# ---------------------------------------------------------------- the search's side of it

class CacheState(NamedTuple):
  """The cached search's carry: the cache, never reordered, and `ancestry` [b, k, T], the
  beam slot j of each position t of each live prefix (cache slot (j, t): beam j's at t)."""
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
  return state._replace(ancestry=jnp.take_along_axis(state.ancestry, parents[:, :, None], axis=1))


def grow_cache(cache: Cache, shapes: Cache) -> Cache:
  """Zero-pads the self-attention keys/values at the end to their `shapes` (a longer cache of
  the same batch, from jax.eval_shape), in any layout; the model masks the slots not yet
  written."""
  def grow(path: tuple, x: Array, shape: jax.ShapeDtypeStruct) -> Array:
    name = getattr(path[-1], 'key', None)  # the leaf's key in the cache's dicts
    if name not in ('cached_key', 'cached_value') or x.shape == shape.shape:
      return x
    return jnp.pad(x, [(0, new - old) for old, new in zip(x.shape, shape.shape, strict=True)])
  return jax.tree_util.tree_map_with_path(grow, cache, shapes)
