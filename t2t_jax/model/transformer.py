"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), §3.

Einsum letter legend, used throughout this file:
  b = batch, q = query position, k = key position, h = head,
  d = d_k or d_v (per-head size), m = d_model, v = vocabulary.

Choices the paper leaves open (the first and third as in tensor2tensor):
  * the Q/K/V/output projections of attention have no bias; the FFN layers do;
  * token 0 is padding and the decoder's start symbol: the first decoder input is its learned
    embedding, where tensor2tensor's is a zero vector plus the position's sinusoid;
  * the shared embedding is initialised N(0, d_model^-1), so that after the ×√d_model
    of §3.4 token vectors have unit variance, like the sinusoids they are added to;
  * with a bfloat16 compute dtype, the pre-softmax logits and attention's Q·Kᵀ / √d_k are
    computed into float32 (kernels.einsum_f32) and every softmax runs in float32: a
    37000-way softmax over bf16-rounded logits is bf16's largest fidelity risk.

Hardware forms come from `kernels.get(config.kernels)`, the decoding cache (the keys and values
of earlier positions) from cache.py; with config.kernels='xla' this file is plain flax and einsum.
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

# Padding (0), defined with the vocabulary, is the decoder's start symbol too (§3.1, shift_right).
from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.model import cache as cache_lib
from t2t_jax.model import kernels

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of §3 and Table 3, plus two mode flags, set by `.replace(...)`."""
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
    # rules.MODEL_RULES, for one built by hand too: a bad value fails before anything compiles.
    rules.check_model({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, platform: str | None = None,
                  ) -> ModelConfig:
    """From config.model (§3, Table 3) and config.vocab_size (§5.1), after rules.validate(config,
    mode), with 'auto' dtype and kernels resolved for `platform` ('cpu', 'cuda', 'tpu'; None:
    this machine's). A key of config.model it has no field for is an errors.UserError."""
    rules.check_model_keys_known(config.model.keys())
    fields = config.model.to_dict()
    if fields.get('dtype') == 'auto':
      fields['dtype'] = rules.compute_dtype(platform)
    if fields.get('kernels', 'auto') == 'auto':
      fields['kernels'] = rules.kernel_forms(platform)
    return cls(vocab_size=config.vocab_size, **fields)

  @property
  def forms(self) -> kernels.Kernels:
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
  """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...), §3.5, interleaved
  as in the formula. positions: [...] integer -> [..., d_model] float32."""
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
  """Decoder inputs: the targets one position later, PAD_ID as start symbol, §3.1; in a
  packed row (`positions` within each pair) every pair starts with PAD_ID."""
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=PAD_ID)[:, :-1]
  return shifted if positions is None else jnp.where(positions == 0, PAD_ID, shifted)


def scaled_dot_product_attention(query: Array, key: Array, value: Array,
                                 mask: Array | None) -> tuple[Array, Array]:
  """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, §3.2.1, Figure 2 (left): query [b, q, h, d_k],
  key [b, k, h, d_k], value [b, k, h, d_v], mask broadcastable to [b, h, q, k] (True = may
  attend) -> ([b, q, h, d_v], float32 weights [b, h, q, k])."""
  scale = np.sqrt(query.shape[-1]).astype(np.float32)  # √d_k
  logits = kernels.einsum_f32('bqhd,bkhd->bhqk', query, key) / scale
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum('bhqk,bkhd->bqhd', weights.astype(value.dtype), value)
  return out, weights


class Dropout(nn.Module):
  """Dropout (Srivastava et al., 2014) of §5.4 as flax's nn.Dropout, its bits from `bits`."""
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
  of d_model / h (Table 3 rows A, B). With `config.decode`, see Transformer.decode.
  """
  config: ModelConfig
  cache: str | None = None  # None | 'self' | 'cross'
  cache_length: int | None = None  # T, when a decoding call creates the cache

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array, mask: Array | None) -> Array:
    c = self.config
    dense = lambda features, name, axis=-1: nn.DenseGeneral(  # noqa: E731
        features, axis=axis, use_bias=False, dtype=c.dtype,
        kernel_init=nn.initializers.xavier_uniform(), dot_general=c.forms.dot_general, name=name)
    query = dense((c.num_heads, c.key_size), 'query')(inputs_q)  # [b, q, h, d_k]
    key_proj = dense((c.num_heads, c.key_size), 'key')
    value_proj = dense((c.num_heads, c.value_size), 'value')
    project = lambda: (key_proj(inputs_kv), value_proj(inputs_kv))  # noqa: E731  [b, k, h, d]
    if c.decode and self.cache:  # one position a step, the earlier ones' from the cache
      out, weights = cache_lib.attend(self, c.forms.cache, self.cache, query, project, mask,
                                      self._attention, length=self.cache_length)
    else:
      out, weights = self._attention(query, *project(), mask)
    if weights is not None:
      self.sow('intermediates', 'attention_weights', weights)
    return dense(c.d_model, 'out', axis=(-2, -1))(out)

  def _attention(self, query: Array, key: Array, value: Array, mask: Array | None,
                 ) -> tuple[Array, Array | None]:
    """The forms' fused attention (weights None) where it serves and no attention maps (the
    'intermediates' collection) are asked for, else scaled_dot_product_attention."""
    fused = self.config.forms.attention
    if fused is not None and not self.is_mutable_collection('intermediates'):
      out = fused(query, key, value, mask)
      if out is not None:
        return out, None
    return scaled_dot_product_attention(query, key, value, mask)


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
  """LayerNorm(x + Dropout(Sublayer(x))): §3.1's residual connection, §5.4's dropout."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, sublayer_out: Array) -> Array:
    c = self.config
    y = Dropout(c.dropout_rate, c.forms.dropout_bits)(sublayer_out, deterministic=c.deterministic)
    return nn.LayerNorm(epsilon=1e-6, dtype=c.dtype, name='layer_norm')(x + y)


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
  def __call__(self, ids: Array, positions: Array | None) -> Array:
    c = self.config
    if positions is None:
      positions = jnp.arange(ids.shape[1])[None, :]  # [1, t]
    x = self.shared_embedding.embed(ids)  # [b, t, m]
    if c.positional == 'sinusoidal':
      pe = sinusoidal_positions(positions, c.d_model)
    else:
      # Table 3 row E. A bucket's padding may reach past max_len, where a lookup would read NaN
      # (jnp.take's fill) and spread it through attention: it reads the last row. Real tokens
      # never get there (pairs are filtered at max_len, inputs at max_len - extra length).
      # Each row looks its positions up ([b, t], not the rows' shared [1, t]): the table's
      # gradient is then the float32 scatter-add of packed rows, not a sum over rows in the
      # compute dtype (bfloat16's 8 bits).
      positions = jnp.broadcast_to(positions, ids.shape)
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
    """src [b, s] ids -> [b, s, m]; packed rows with `segments` and `positions` [b, s]."""
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
    """decoder_inputs [b, t] ids -> logits [b, t, v] (Transformer.decode). Target padding
    needs no mask: it only follows the real tokens, and the causal mask hides it from them."""
    c = self.config
    self_mask = causal_mask(decoder_inputs.shape[1])  # [1, 1, t, t]
    if segments is not None:
      self_mask = self_mask & segment_mask(segments, segments)  # [b, 1, t, t]
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
  """Encoder-decoder Transformer, Figure 1; `encode` and `decode` apart, for decoding."""
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

    Training: decoder_inputs = shift_right(targets), [b, t]. Decoding (`config.decode`,
    'cache' mutable): the previous tokens [b, k] of k hypotheses a sentence, at one position,
    -> [b, k, v]; a call with `cache_length` (T, the longest output) creates the cache, each
    later call is one step. `beam_mask` [b, k, k, T]: whose cached positions each hypothesis
    descends from (None: its own), so that re-ranking beams never moves the cache.
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
    (data/packing.py): each side's segments and positions; every pair's logits as alone."""
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
  target_length] targets: 3 × the forward pass's (a backward pass is two products of each
  size), 2 FLOPs a multiply-add, padding and the masked causal half of attention included."""
  m, h, d_k, d_v = c.d_model, c.num_heads, c.key_size, c.value_size
  s, t = source_length, target_length
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
