"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), §3.

Einsum letter legend, used throughout this file:
  b = batch, q = query position, k = key position, h = head,
  d = d_k or d_v (per-head size), m = d_model, v = vocabulary.

Choices the paper leaves open (the first and third as in tensor2tensor):
  * the Q/K/V/output projections of attention have no bias; the FFN layers do;
  * token 0 is padding and doubles as the decoder's start symbol: the first decoder input
    is id 0's (learned) embedding. tensor2tensor differs here: it shifts the embedded
    targets, so its first decoder input is a zero vector (plus the position's sinusoid);
  * the shared embedding is initialised N(0, d_model^-1), so that after the ×√d_model
    of §3.4 token vectors have unit variance, like the sinusoids they are added to;
  * with a reduced compute dtype (bfloat16), the pre-softmax logits and attention's
    Q·Kᵀ / √d_k are still computed into float32 (kernels.einsum_f32), and every softmax
    runs in float32: a 37000-way softmax over bf16-rounded logits is the largest fidelity
    risk of bf16.

Hardware forms (a backend's faster way to compute the same thing: dense-layer products,
dropout bits, the tied logits) come from `kernels.get(config.kernels)` (kernels.py); with
config.kernels='xla' this file is plain flax and einsum.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from t2t_jax.config import rules

# Padding (0), defined once, with the vocabulary; it doubles as the decoder's start-of-
# sequence input (§3.1, shift_right). `from t2t_jax.model.transformer import PAD_ID` keeps working.
from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.model import kernels

POSITIONAL = rules.POSITIONAL  # the one list is the validator's (MODEL_RULES)

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of §3 and Table 3, plus two mode flags.

  Built straight from the experiment config: `ModelConfig.from_config(config)`; modes by
  `.replace(deterministic=True)` (no dropout) or `.replace(decode=True)` (incremental
  decoding with a key/value cache).
  """
  vocab_size: int
  num_layers: int = 6  # N
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8  # h
  d_k: int | None = None  # None: d_model / h (§3.2.2)
  d_v: int | None = None  # None: d_model / h (§3.2.2)
  dropout_rate: float = 0.1  # P_drop
  positional: str = 'sinusoidal'  # 'sinusoidal' (§3.5) | 'learned' (Table 3 row E)
  max_len: int = 512  # positions a learned embedding covers
  dtype: str = 'float32'  # compute dtype; parameters are always float32
  kernels: str = 'xla'  # hardware forms (kernels.py): 'xla' (plain) | 'cpu'
  deterministic: bool = False  # True: no dropout
  decode: bool = False  # True: the decoder runs one position at a time from a cache

  def __post_init__(self):
    # The validator's rules and messages (rules.MODEL_RULES), for a ModelConfig built
    # by hand as for one built from a config: a bad value fails before anything compiles.
    rules.check_model({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, platform: str | None = None,
                  ) -> ModelConfig:
    """The model's dataclass, built straight from config.model (§3, Table 3) and the shared
    config.vocab_size (§5.1), with dtype and kernels 'auto' resolved for `platform` ('cpu',
    'cuda', 'tpu', ...; None: this machine's backend): rules.compute_dtype and
    kernel_forms. A key of config.model it has no field for is an error (errors.UserError),
    not silently ignored; rules.validate(config, mode) comes first.
    """
    rules.check_model_keys_known(config.model.keys())
    fields = config.model.to_dict()
    if fields.get('dtype') == 'auto':
      fields['dtype'] = rules.compute_dtype(platform)
    if fields.get('kernels', 'auto') == 'auto':
      fields['kernels'] = rules.kernel_forms(platform)
    return cls(vocab_size=config.vocab_size, **fields)

  @property
  def forms(self) -> kernels.Kernels:
    """The hardware forms config.kernels names (kernels.py)."""
    return kernels.get(self.kernels)

  @property
  def key_size(self) -> int:
    return self.d_k if self.d_k is not None else self.d_model // self.num_heads

  @property
  def value_size(self) -> int:
    return self.d_v if self.d_v is not None else self.d_model // self.num_heads

  def replace(self, **changes: Any) -> ModelConfig:
    return dataclasses.replace(self, **changes)


def sinusoidal_positions(positions: Array, d_model: int) -> Array:
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...), §3.5.

  Sines on even and cosines on odd dimensions, interleaved as in the paper's formula.
  positions: [...] integer -> [..., d_model] float32.
  """
  two_i = np.arange(0, d_model, 2, dtype=np.float32)  # [d_model / 2]
  angles = positions[..., None].astype(jnp.float32) / (10000.0 ** (two_i / d_model))
  pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., d_model/2, 2]
  return pe.reshape(*positions.shape, -1)[..., :d_model]


def causal_mask(length: int) -> Array:
  """[1, 1, q, k] True where key k is not after query q (§3.2.3)."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def padding_mask(ids: Array) -> Array:
  """[b, 1, 1, k] True where the key is a real token."""
  return (ids != PAD_ID)[:, None, None, :]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
  """[b, 1, q, k] True where the key is a real token of the query's own pair: packed rows
  (data/packing.py) hold several pairs, numbered 1, 2, ... in each row, padding 0."""
  same = query_segments[:, :, None] == key_segments[:, None, :]
  return (same & (key_segments != 0)[:, None, :])[:, None]


def shift_right(targets: Array, positions: Array | None = None) -> Array:
  """Decoder inputs: the targets one position later, PAD_ID as start symbol, §3.1. In a
  packed row (`positions` within each pair) every pair starts with PAD_ID, not with the
  previous pair's last token."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  return shifted if positions is None else jnp.where(positions == 0, PAD_ID, shifted)


def scaled_dot_product_attention(query: Array, key: Array, value: Array, mask: Array | None,
                                 *, kv_layout: str = 'bkhd') -> tuple[Array, Array]:
  """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, §3.2.1, Figure 2 (left).

  query [b, q, h, d_k], key [b, k, h, d_k], value [b, k, h, d_v], mask broadcastable to
  [b, h, q, k] (True = may attend). Returns ([b, q, h, d_v], weights [b, h, q, k]).
  `kv_layout='bhdk'`: key [b, h, d_k, k] and value [b, h, d_v, k] instead, the layout of
  the decoding cache, which XLA's CPU dot reads fastest for a few queries over a long key
  axis (docs/performance.md).
  The logits and the softmax are float32 whatever the compute dtype.
  """
  d_k = query.shape[-1]
  logits = kernels.einsum_f32(f'bqhd,{kv_layout}->bhqk', query, key) / np.sqrt(
      d_k).astype(np.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum(f'bhqk,{kv_layout}->bqhd', weights.astype(value.dtype), value)
  return out, weights


def cached_attention(query: Array, key: Array, value: Array, cached_key: Array,
                     cached_value: Array, cache_mask: Array) -> tuple[Array, Array]:
  """Scaled dot-product attention (§3.2.1) of one decoding step: over a cache of earlier
  positions and the step's own position.

  query/key/value [b, q, h, d]: this step's, one row per hypothesis; cached_key [b, h, d, n]
  and cached_value [b, h, n, d], n cache slots: for the two einsums over the cache, the
  layouts XLA:CPU's dots read fastest (the scores Q·K and the weighted sum W·V as plain
  [q, d]·[d, n] and [q, n]·[n, d] products); cache_mask [b, 1, q, n] (True = may attend).
  Each query attends to the slots the mask allows and to its own new key. The cache is only
  read, never concatenated with the new key, so XLA can then write the new key into it in
  place (on a CPU it does so with region-based copy insertion, xla.CPU_FLAGS).
  Returns ([b, q, h, d_v], weights [b, h, q, n + 1]: the own position last).
  """
  scale = 1 / np.sqrt(query.shape[-1]).astype(np.float32)
  old = kernels.einsum_f32('bqhd,bhdn->bhqn', query, cached_key) * scale  # [b, h, q, n]
  old = jnp.where(cache_mask, old, jnp.finfo(jnp.float32).min)
  own = kernels.einsum_f32('bqhd,bqhd->bhq', query, key)[..., None] * scale  # [b, h, q, 1]
  weights = jax.nn.softmax(jnp.concatenate([old, own], axis=-1), axis=-1)
  weights = weights.astype(value.dtype)
  # The values as [b, h, n, d] rather than the keys' [b, h, d, n]: XLA:CPU's dot streams that
  # layout faster for the weighted sum over a long cache, which shortens every decoding step
  # (docs/performance.md; the same ids). Written [b, h, q, d], then transposed: XLA:CPU's dot
  # is much slower writing [b, q, h, d] itself (a [b, h, q, d] result is small).
  from_cache = jnp.einsum('bhqn,bhnd->bhqd', weights[..., :-1], cached_value)  # [b, h, q, d_v]
  from_own = jnp.einsum('bhq,bqhd->bqhd', weights[..., -1], value)  # [b, q, h, d_v]
  out = jnp.transpose(from_cache, (0, 2, 1, 3)) + from_own  # [b, q, h, d_v]
  return out, weights


class Dropout(nn.Module):
  """Dropout (Srivastava et al., 2014) as §5.4 applies it: each element kept with
  probability 1 - rate and scaled by 1 / (1 - rate), as flax's nn.Dropout, with the
  'dropout' RNG stream; the random bits from `bits` (config.forms.dropout_bits)."""
  rate: float
  bits: Callable[[tuple[int, ...], Array], Array]

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    keep_prob = 1.0 - self.rate
    # keep iff bits < keep_prob · 2^32: exact to 2^-32 (a rate of 0 returned above).
    threshold = np.uint32(min(round(keep_prob * 2.0 ** 32), 2 ** 32 - 1))
    keep = self.bits(x.shape, self.make_rng('dropout')) < threshold
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros_like(x))


class MultiHeadAttention(nn.Module):
  """Multi-head attention, §3.2.2, Figure 2 (right).

  MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K,
  V W_i^V); W^Q, W^K are d_model × h·d_k and W^V is d_model × h·d_v, with d_k and d_v free
  of d_model / h (Table 3 rows A, B).

  With `config.decode`, the queries are the k hypotheses (beams) of each sentence at one
  position, [b, k, m]. Self-attention (`cache='self'`) attends over every hypothesis's
  cached positions, as `mask` [b, k, k, T] allows, and its own new one, then writes that
  into the 'cache' collection (see `_cached_self_attention`). Encoder-decoder attention
  (`cache='cross'`) projects the encoder output once, per sentence, for all k hypotheses.
  """
  config: ModelConfig
  cache: str | None = None  # None | 'self' | 'cross'
  cache_length: int | None = None  # T, when a decoding call creates the cache

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Array | None) -> Array:
    c = self.config
    dense = lambda features, name: nn.DenseGeneral(  # noqa: E731
        features, use_bias=False, dtype=c.dtype, kernel_init=nn.initializers.xavier_uniform(),
        dot_general=c.forms.dot_general, name=name)
    query = dense((c.num_heads, c.key_size), 'query')(inputs_q)  # [b, q, h, d_k]
    if c.decode and self.cache == 'cross':
      key, value = self._cross_cache(dense, inputs_kv)  # [b, h, d, s]
      out, weights = scaled_dot_product_attention(query, key, value, mask, kv_layout='bhdk')
    else:
      key = dense((c.num_heads, c.key_size), 'key')(inputs_kv)  # [b, k, h, d_k]
      value = dense((c.num_heads, c.value_size), 'value')(inputs_kv)  # [b, k, h, d_v]
      if c.decode and self.cache == 'self':
        out, weights = self._cached_self_attention(query, key, value, mask)
      else:
        out, weights = self._attention(query, key, value, mask)
    if weights is not None:
      self.sow('intermediates', 'attention_weights', weights)
    return nn.DenseGeneral(c.d_model, axis=(-2, -1), use_bias=False, dtype=c.dtype,
                           kernel_init=nn.initializers.xavier_uniform(),
                           dot_general=c.forms.dot_general, name='out')(out)

  def _attention(self, query: Array, key: Array, value: Array, mask: Array | None,
                 ) -> tuple[Array, Array | None]:
    """(out, weights): the forms' attention (kernels.py) where it serves and no attention
    maps are asked for (the 'intermediates' collection, which needs the weights), else
    scaled_dot_product_attention."""
    fused = self.config.forms.attention
    if fused is not None and not self.is_mutable_collection('intermediates'):
      out = fused(query, key, value, mask)
      if out is not None:
        return out, None
    return scaled_dot_product_attention(query, key, value, mask)

  def _cached_self_attention(self, query: Array, key: Array, value: Array,
                             mask: Array | None) -> tuple[Array, Array]:
    """One decoding step of self-attention: query/key/value [b, k, h, d], k hypotheses.

    The cache holds keys [b, h, d, k, T] and values [b, h, k, T, d] (see cached_attention):
    slot (j, t) is what hypothesis j wrote at step t. `mask` [b, k, k, T] says which slots
    each hypothesis may read: beam search passes each hypothesis's ancestry (the slots of
    its prefix), so that re-ranking beams never moves the cache. None: each hypothesis
    reads its own slots. Slots from the index on are hidden either way. A call with
    `cache_length` creates the cache (zeros, index 0) and writes nothing; its result is a
    first step's.
    """
    (b, k, h, d_k), d_v = key.shape, value.shape[-1]
    T = self.cache_length  # None once the cache exists: only its creation reads it
    creating = not self.has_variable('cache', 'cached_key')
    cached_key = self.variable('cache', 'cached_key', jnp.zeros, (b, h, d_k, k, T), key.dtype)
    cached_value = self.variable('cache', 'cached_value', jnp.zeros, (b, h, k, T, d_v),
                                 value.dtype)
    index = self.variable('cache', 'index', lambda: jnp.array(0, jnp.int32))
    i, length = index.value, cached_key.value.shape[-1]  # T
    if mask is None:
      mask = jnp.eye(k, dtype=bool)[None, :, :, None]  # [1, k, k, 1]
    mask = jnp.broadcast_to(mask & (jnp.arange(length) < i), (b, k, k, length))
    out, weights = cached_attention(
        query, key, value, cached_key.value.reshape(b, h, d_k, k * length),
        cached_value.value.reshape(b, h, k * length, d_v), mask.reshape(b, 1, k, k * length))
    if not creating:
      new_key = jnp.transpose(key, (0, 2, 3, 1))[..., None]  # [b, h, d, k, 1]
      new_value = jnp.transpose(value, (0, 2, 1, 3))[:, :, :, None]  # [b, h, k, 1, d]
      cached_key.value = jax.lax.dynamic_update_slice_in_dim(cached_key.value, new_key, i, axis=4)
      cached_value.value = jax.lax.dynamic_update_slice_in_dim(cached_value.value, new_value, i,
                                                               axis=3)
      index.value = i + 1
    return out, weights

  def _cross_cache(self, dense, encoded: Array) -> tuple[Array, Array]:
    """Keys/values of the encoder output, [b, h, d, s], computed when the cache is created."""
    c = self.config
    key_proj = dense((c.num_heads, c.key_size), 'key')
    value_proj = dense((c.num_heads, c.value_size), 'value')
    to_bhds = lambda x: jnp.transpose(x, (0, 2, 3, 1))  # noqa: E731  [b, s, h, d] -> [b, h, d, s]
    key = self.variable('cache', 'cross_key', lambda: to_bhds(key_proj(encoded)))
    value = self.variable('cache', 'cross_value', lambda: to_bhds(value_proj(encoded)))
    return key.value, value.value


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, §3.3."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    dense = lambda features, name: nn.Dense(  # noqa: E731
        features, dtype=c.dtype, kernel_init=nn.initializers.xavier_uniform(),
        dot_general=c.forms.dot_general, name=name)
    h = nn.relu(dense(c.d_ff, 'w_1')(x))  # [b, t, d_ff]
    return dense(c.d_model, 'w_2')(h)  # [b, t, m]


class SubLayer(nn.Module):
  """LayerNorm(x + Dropout(Sublayer(x))): the residual connection of §3.1 (post-LN)
  with the residual dropout of §5.4."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, sublayer_out: Array) -> Array:
    c = self.config
    y = Dropout(c.dropout_rate, c.forms.dropout_bits)(sublayer_out, deterministic=c.deterministic)
    return nn.LayerNorm(epsilon=1e-6, dtype=self.config.dtype, name='layer_norm')(x + y)


class EncoderLayer(nn.Module):
  """Self-attention then FFN, each wrapped in a residual + LayerNorm sub-layer, §3.1."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, src_mask: Array) -> Array:
    x = SubLayer(self.config, name='attention_sublayer')(
        x, MultiHeadAttention(self.config, name='self_attention')(x, x, src_mask))
    return SubLayer(self.config, name='ffn_sublayer')(x, FeedForward(self.config, name='ffn')(x))


class DecoderLayer(nn.Module):
  """Masked self-attention, encoder-decoder attention, FFN; each a sub-layer, §3.1."""
  config: ModelConfig
  cache_length: int | None = None  # T, when a decoding call creates the cache

  @nn.compact
  def __call__(self, y: Array, encoded: Array, self_mask: Array | None, src_mask: Array) -> Array:
    c = self.config
    y = SubLayer(c, name='self_attention_sublayer')(
        y, MultiHeadAttention(c, cache='self', cache_length=self.cache_length,
                              name='self_attention')(y, y, self_mask))
    y = SubLayer(c, name='cross_attention_sublayer')(
        y, MultiHeadAttention(c, cache='cross', name='cross_attention')(y, encoded, src_mask))
    return SubLayer(c, name='ffn_sublayer')(y, FeedForward(c, name='ffn')(y))


class SharedEmbedding(nn.Module):
  """One matrix for source embedding, target embedding and pre-softmax projection, §3.4."""
  config: ModelConfig

  def setup(self):
    c = self.config
    self.embedding = self.param('embedding', nn.initializers.normal(stddev=c.d_model ** -0.5),
                                (c.vocab_size, c.d_model))  # [v, m]

  def embed(self, ids: Array) -> Array:
    """[b, t] -> [b, t, m], multiplied by √d_model (§3.4)."""
    x = jnp.take(self.embedding, ids, axis=0) * math.sqrt(self.config.d_model)
    return x.astype(self.config.dtype)

  def logits(self, x: Array) -> Array:
    """[b, t, m] -> [b, t, v] float32: the shared weights as the pre-softmax linear map."""
    return self.config.forms.tied_logits(x, self.embedding.astype(x.dtype))


class InputEmbedding(nn.Module):
  """Dropout(Embedding × √d_model + positional encoding), §3.4, §3.5, §5.4."""
  config: ModelConfig
  shared_embedding: SharedEmbedding

  @nn.compact
  def __call__(self, ids: Array, positions: Array) -> Array:
    c = self.config
    x = self.shared_embedding.embed(ids)  # [b, t, m]
    if c.positional == 'sinusoidal':
      pe = sinusoidal_positions(positions, c.d_model)
    else:
      # Positions 0..max_len-1 only (Table 3 row E). Out-of-range lookups would read NaN
      # (jnp.take's fill) and, through attention, spread it to every position; a padded
      # batch can reach past max_len with padding alone (its length is rounded up to a
      # bucket), so those positions read the last row instead. Real tokens never get
      # there: training pairs are filtered at config.max_length ≤ max_len, dev-loss pairs at
      # max_len (batching.make_eval_set), decoding inputs at max_len - decode_extra_length.
      pe = nn.Embed(c.max_len, c.d_model, embedding_init=nn.initializers.normal(0.5 ** 0.5),
                    name='learned_positions')(jnp.minimum(positions, c.max_len - 1))
    x = x + pe.astype(x.dtype)
    return Dropout(c.dropout_rate, c.forms.dropout_bits)(x, deterministic=c.deterministic)


class Encoder(nn.Module):
  """A stack of N identical layers over the embedded source, §3.1."""
  config: ModelConfig
  shared_embedding: SharedEmbedding

  @nn.compact
  def __call__(self, src: Array, segments: Array | None = None,
               positions: Array | None = None) -> Array:
    """src [b, s] ids -> [b, s, m]. Packed rows: `segments` and `positions` [b, s], each
    pair attending to itself alone, its positions its own (segment_mask)."""
    if positions is None:
      positions = jnp.arange(src.shape[1])[None, :]
    x = InputEmbedding(self.config, self.shared_embedding, name='input_embedding')(src, positions)
    # [b, 1, 1, s], or [b, 1, s, s] for packed rows
    src_mask = padding_mask(src) if segments is None else segment_mask(segments, segments)
    for i in range(self.config.num_layers):
      x = EncoderLayer(self.config, name=f'layer_{i}')(x, src_mask)
    return x


class Decoder(nn.Module):
  """A stack of N identical layers over the shifted, embedded target, §3.1."""
  config: ModelConfig
  shared_embedding: SharedEmbedding

  @nn.compact
  def __call__(self, decoder_inputs: Array, encoded: Array, src_mask: Array, *,
               beam_mask: Array | None = None, cache_length: int | None = None,
               segments: Array | None = None, positions: Array | None = None) -> Array:
    """decoder_inputs [b, t] ids -> logits [b, t, v].

    Training: t target positions. Target padding needs no mask of its own: it only ever
    follows the real tokens, and the causal mask already hides later positions from them.
    Packed rows: `segments` and `positions` [b, t] of the targets; each pair attends to its
    own earlier positions alone (src_mask then masks the source to the pair too).
    Decoding (`config.decode`): t = k hypotheses of each sentence, all at the cache's
    position; `beam_mask` and `cache_length` as in `Transformer.decode`.
    """
    c = self.config
    self_mask = causal_mask(decoder_inputs.shape[1])  # [1, 1, t, t]
    if segments is not None:
      self_mask = self_mask & segment_mask(segments, segments)  # [b, 1, t, t]
    if positions is None:
      positions = jnp.arange(decoder_inputs.shape[1])[None, :]  # [1, t]
    if c.decode:
      creating = not self.has_variable('cache', 'position')
      position = self.variable('cache', 'position', lambda: jnp.array(0, jnp.int32))
      positions, self_mask = position.value[None, None], beam_mask  # [1, 1]: one position
      if not creating:
        position.value = position.value + 1
    y = InputEmbedding(c, self.shared_embedding, name='input_embedding')(decoder_inputs, positions)
    for i in range(c.num_layers):
      y = DecoderLayer(c, cache_length, name=f'layer_{i}')(y, encoded, self_mask, src_mask)
    return self.shared_embedding.logits(y)


class Transformer(nn.Module):
  """Encoder-decoder Transformer, Figure 1. `encode` and `decode` are separate entry points
  so that decoding can run the encoder once and the decoder step by step."""
  config: ModelConfig

  def setup(self):
    self.shared_embedding = SharedEmbedding(self.config)
    self.encoder = Encoder(self.config, self.shared_embedding)
    self.decoder = Decoder(self.config, self.shared_embedding)

  def encode(self, src: Array, src_segments: Array | None = None,
             src_positions: Array | None = None) -> Array:
    """src [b, s] -> encoded [b, s, m]; packed rows with their segments and positions."""
    return self.encoder(src, src_segments, src_positions)

  def decode(self, encoded: Array, src: Array, decoder_inputs: Array, *,
             beam_mask: Array | None = None, cache_length: int | None = None,
             src_segments: Array | None = None, tgt_segments: Array | None = None,
             tgt_positions: Array | None = None) -> Array:
    """Logits [b, t, v] of the next token at each decoder input position.

    Training: decoder_inputs = shift_right(targets), [b, t].

    Decoding (`config.decode`, 'cache' collection mutable): decoder_inputs [b, k] are the
    previous tokens of k hypotheses (beams) of each sentence, all at the same position, and
    the logits [b, k, v] are their next-token distributions. One call with `cache_length`
    (T, the longest output) creates the cache; each later call is one step. `beam_mask`
    [b, k, k, T]: which hypotheses' cached positions each hypothesis descends from (None:
    its own), so that beams can be re-ranked without moving the cache.
    """
    src_mask = (padding_mask(src) if src_segments is None  # [b, 1, 1, s] or [b, 1, t, s]
                else segment_mask(tgt_segments, src_segments))
    return self.decoder(decoder_inputs, encoded, src_mask, beam_mask=beam_mask,
                        cache_length=cache_length, segments=tgt_segments,
                        positions=tgt_positions)

  def __call__(self, src: Array, targets: Array, *, src_segments: Array | None = None,
               src_positions: Array | None = None, tgt_segments: Array | None = None,
               tgt_positions: Array | None = None) -> Array:
    """Teacher-forced logits [b, t, v] for targets [b, t] given src [b, s]. Packed rows
    (data/packing.py): each side's segments and positions [b, s] and [b, t]; every pair's
    logits are then what they are alone."""
    encoded = self.encode(src, src_segments, src_positions)
    return self.decode(encoded, src, shift_right(targets, tgt_positions),
                       src_segments=src_segments, tgt_segments=tgt_segments,
                       tgt_positions=tgt_positions)


def count_params(params: Any) -> int:
  """The exact number of scalars in a parameter tree."""
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def init_param_count(config: ModelConfig) -> int:
  """The exact parameter count of the model, from shapes alone (nothing is allocated)."""
  dummy = jnp.ones((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(config).init(jax.random.PRNGKey(0), dummy, dummy))
  return count_params(shapes['params'])


def closed_form_param_count(c: ModelConfig) -> int:
  """Parameter count from the architecture alone, to check the model against (Table 3)."""
  d, d_k, d_v, h = c.d_model, c.key_size, c.value_size, c.num_heads
  attention = d * h * d_k * 2 + d * h * d_v + h * d_v * d  # W^Q, W^K, W^V, W^O (no biases)
  ffn = d * c.d_ff + c.d_ff + c.d_ff * d + d  # W_1, b_1, W_2, b_2
  layer_norm = 2 * d  # gain and bias
  encoder_layer = attention + ffn + 2 * layer_norm
  decoder_layer = 2 * attention + ffn + 3 * layer_norm
  positions = 2 * c.max_len * d if c.positional == 'learned' else 0
  return c.vocab_size * d + c.num_layers * (encoder_layer + decoder_layer) + positions


def train_step_flops(c: ModelConfig, rows: int, source_length: int, target_length: int) -> int:
  """The matmul FLOPs of one training step on [rows, source_length] sources and [rows,
  target_length] targets, from the architecture alone: 3 × the forward pass's (a product's
  backward pass is two products of its size), 2 FLOPs a multiply-add, padding counted as
  computed. Forward: every token through the weights it meets (2 × weights a token), plus
  attention's Q·Kᵀ and weights·V over every key, the causal half included (it is computed,
  then masked).
  """
  m, h, d_k, d_v, s, t = c.d_model, c.num_heads, c.key_size, c.value_size, source_length, \
      target_length
  projections = 2 * m * h * (2 * d_k + d_v) + 2 * h * d_v * m  # W^Q, W^K, W^V, W^O
  ffn = 4 * m * c.d_ff  # W_1, W_2
  attend = lambda keys: 2 * keys * h * (d_k + d_v)  # noqa: E731  Q·Kᵀ and weights·V, a query
  encoder_token = projections + ffn + attend(s)
  # Self-attention, then cross-attention's W^Q and W^O (its W^K, W^V run on the source).
  decoder_token = projections + attend(t) + 2 * m * h * d_k + 2 * h * d_v * m + attend(s) + ffn
  cross_kv_source_token = 2 * m * h * (d_k + d_v)
  forward = rows * (c.num_layers * (s * (encoder_token + cross_kv_source_token)
                                    + t * decoder_token) + t * 2 * m * c.vocab_size)
  return 3 * forward
