"""The model against NumPy re-derivations of §3 and against its own invariants."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t_jax.model import transformer as model_lib
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import errors

TINY = ModelConfig(vocab_size=23, num_layers=2, d_model=16, d_ff=24, num_heads=2, d_k=5, d_v=7,
                   dropout_rate=0.0, deterministic=True)


def np_softmax(x, axis=-1):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def np_attention(q, k, v, mask):
  """softmax(Q Kᵀ / √d_k) V for one head: q [q, d_k], k [k, d_k], v [k, d_v], mask [q, k]."""
  logits = q @ k.T / np.sqrt(q.shape[-1])
  logits = np.where(mask, logits, -np.inf)
  return np_softmax(logits) @ v


def test_scaled_dot_product_attention_matches_numpy():
  rng = np.random.default_rng(0)
  b, lq, lk, h, d_k, d_v = 2, 3, 5, 2, 4, 6
  q, k = rng.normal(size=(b, lq, h, d_k)), rng.normal(size=(b, lk, h, d_k))
  v = rng.normal(size=(b, lk, h, d_v))
  mask = rng.random((b, 1, lq, lk)) > 0.3
  mask[..., 0] = True  # every query sees at least one key
  out, weights = model_lib.scaled_dot_product_attention(
      jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32), jnp.asarray(v, jnp.float32),
      jnp.asarray(mask))
  for bi in range(b):
    for hi in range(h):
      expected = np_attention(q[bi, :, hi], k[bi, :, hi], v[bi, :, hi], mask[bi, 0])
      np.testing.assert_allclose(out[bi, :, hi], expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-6)


def test_multi_head_attention_matches_numpy():
  """Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), §3.2.2."""
  c = TINY
  mha = model_lib.MultiHeadAttention(c)
  rng = np.random.default_rng(1)
  x_q = rng.normal(size=(2, 3, c.d_model)).astype(np.float32)
  x_kv = rng.normal(size=(2, 4, c.d_model)).astype(np.float32)
  mask = np.ones((2, 1, 3, 4), bool)
  mask[1, ..., 3] = False  # a padded key in the second example
  params = mha.init(jax.random.PRNGKey(0), x_q, x_kv, mask)['params']
  out = mha.apply({'params': params}, x_q, x_kv, mask)
  w_q, w_k = np.asarray(params['query']['kernel']), np.asarray(params['key']['kernel'])
  w_v, w_o = np.asarray(params['value']['kernel']), np.asarray(params['out']['kernel'])
  assert w_q.shape == (c.d_model, c.num_heads, c.d_k)
  assert w_v.shape == (c.d_model, c.num_heads, c.d_v)
  for b in range(2):
    heads = [np_attention(x_q[b] @ w_q[:, i], x_kv[b] @ w_k[:, i], x_kv[b] @ w_v[:, i], mask[b, 0])
             for i in range(c.num_heads)]
    expected = np.concatenate(heads, -1) @ w_o.reshape(c.num_heads * c.d_v, c.d_model)
    np.testing.assert_allclose(out[b], expected, rtol=1e-4, atol=1e-5)


def test_sinusoidal_positions_match_the_formula():
  d_model = 10
  pe = np.asarray(model_lib.sinusoidal_positions(jnp.arange(7), d_model))
  for pos in range(7):
    for i in range(d_model // 2):
      angle = pos / 10000 ** (2 * i / d_model)
      np.testing.assert_allclose(pe[pos, 2 * i], np.sin(angle), atol=1e-6)
      np.testing.assert_allclose(pe[pos, 2 * i + 1], np.cos(angle), atol=1e-6)


def _init(c, src, tgt):
  return Transformer(c).init(jax.random.PRNGKey(0), src, tgt)['params']


@pytest.mark.parametrize('positional', ['sinusoidal', 'learned'])
def test_causal_mask_later_targets_do_not_change_earlier_logits(positional):
  c = TINY.replace(positional=positional, max_len=16)
  rng = np.random.default_rng(2)
  src = rng.integers(3, c.vocab_size, (2, 6))
  tgt = rng.integers(3, c.vocab_size, (2, 8))
  params = _init(c, src, tgt)
  logits = Transformer(c).apply({'params': params}, src, tgt)
  for t in range(8):
    changed = tgt.copy()
    changed[:, t] = (changed[:, t] + 1 - 3) % (c.vocab_size - 3) + 3
    new = Transformer(c).apply({'params': params}, src, changed)
    # The logits at position i predict target i from targets < i: positions ≤ t keep theirs.
    np.testing.assert_allclose(new[:, :t + 1], logits[:, :t + 1], atol=1e-5)
    if t + 1 < 8:
      assert np.abs(new[:, t + 1:] - logits[:, t + 1:]).max() > 1e-4


def test_appended_padding_changes_no_real_logit():
  c = TINY
  rng = np.random.default_rng(3)
  src = rng.integers(3, c.vocab_size, (2, 5))
  tgt = rng.integers(3, c.vocab_size, (2, 6))
  params = _init(c, src, tgt)
  logits = Transformer(c).apply({'params': params}, src, tgt)
  padded_src = np.pad(src, ((0, 0), (0, 4)))
  padded_tgt = np.pad(tgt, ((0, 0), (0, 3)))
  for s, t in ((padded_src, tgt), (src, padded_tgt), (padded_src, padded_tgt)):
    new = Transformer(c).apply({'params': params}, s, t)
    np.testing.assert_allclose(new[:, :6], logits, rtol=1e-5, atol=1e-5)


def test_learned_positions_past_max_len_are_padding_and_never_nan():
  """Table 3 row E: a batch padded past max_len (its bucket rounds up) gives finite logits,
  and the real positions' logits are those of the batch padded only to max_len."""
  c = TINY.replace(positional='learned', max_len=6)
  rng = np.random.default_rng(4)
  src = rng.integers(3, c.vocab_size, (2, 6))
  tgt = rng.integers(3, c.vocab_size, (2, 6))
  params = _init(c, src, tgt)
  logits = Transformer(c).apply({'params': params}, src, tgt)
  padded = Transformer(c).apply({'params': params}, np.pad(src, ((0, 0), (0, 3))),
                                np.pad(tgt, ((0, 0), (0, 2))))
  assert np.isfinite(np.asarray(padded)).all()
  np.testing.assert_allclose(padded[:, :6], logits, rtol=1e-5, atol=1e-5)


def test_embedding_is_shared_and_scaled():
  """Source and target embeddings and the pre-softmax map are one matrix, §3.4."""
  c = TINY
  src = np.array([[5, 6, 1]])
  params = _init(c, src, src)
  assert 'embedding' in params['shared_embedding']
  emb = np.asarray(params['shared_embedding']['embedding'])
  bound = Transformer(c).bind({'params': params})
  np.testing.assert_allclose(bound.shared_embedding.embed(jnp.asarray(src))[0],
                             emb[src[0]] * np.sqrt(c.d_model), rtol=1e-6)
  x = np.random.default_rng(0).normal(size=(1, 2, c.d_model)).astype(np.float32)
  np.testing.assert_allclose(bound.shared_embedding.logits(jnp.asarray(x))[0], x[0] @ emb.T,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('forms', ['xla', 'cpu'])
def test_decode_with_cache_equals_full_decoding(forms):
  """Feeding the targets one position at a time through the cache gives the full logits, in
  either layout of the cache (cache.LAYOUTS), also with d_k ≠ d_v."""
  c = TINY.replace(num_layers=3, kernels=forms)
  rng = np.random.default_rng(4)
  src = rng.integers(3, c.vocab_size, (2, 7))
  src[1, 5:] = 0
  tgt = rng.integers(3, c.vocab_size, (2, 6))
  params = _init(c, src, tgt)
  full = Transformer(c).apply({'params': params}, src, tgt)
  dec = Transformer(c.replace(decode=True))
  encoded = dec.apply({'params': params}, src, method=Transformer.encode)
  inputs = np.asarray(model_lib.shift_right(tgt))
  _, cache = dec.apply({'params': params}, encoded, src, inputs[:, :1], cache_length=6,
                       method=Transformer.decode, mutable=['cache'])
  cache = cache['cache']
  for t in range(tgt.shape[1]):
    step, variables = dec.apply({'params': params, 'cache': cache}, encoded, src,
                                inputs[:, t:t + 1], method=Transformer.decode, mutable=['cache'])
    cache = variables['cache']
    np.testing.assert_allclose(step[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


def test_dropout_is_active_in_training_mode_only():
  c = TINY.replace(dropout_rate=0.5, deterministic=False)
  src = np.array([[5, 6, 7, 1]])
  params = _init(c.replace(deterministic=True), src, src)
  run = lambda cfg, seed: Transformer(cfg).apply(  # noqa: E731
      {'params': params}, src, src, rngs={'dropout': jax.random.PRNGKey(seed)})
  assert np.abs(run(c, 0) - run(c, 1)).max() > 1e-3
  np.testing.assert_array_equal(run(c.replace(deterministic=True), 0),
                                run(c.replace(deterministic=True), 1))


@pytest.mark.parametrize('field,value,message', [
    ('d_model', 100, 'config.model.d_k'),  # 100 / 8 heads with d_k unset
    ('d_model', 0, 'config.model.d_model'),
    ('dropout_rate', -0.1, 'config.model.dropout_rate'),
    ('positional', 'rotary', 'config.model.positional'),
    ('num_layers', 0, 'config.model.num_layers'),
    ('d_v', 0, 'config.model.d_v'),
    ('dtype', 'auto', 'config.model.dtype'),  # from_config resolves it; by hand, say which
    ('vocab_size', True, 'config.vocab_size'),
])
def test_bad_model_config_names_the_key(field, value, message):
  """A ModelConfig built by hand (the Python API) gets the validator's checks and messages
  (rules.check_model), as a UserError."""
  with pytest.raises(errors.UserError, match='^' + re.escape(message + ': ')):
    ModelConfig(**{'vocab_size': 100, field: value})


def test_model_config_accepts_numpy_integers():
  c = ModelConfig(vocab_size=np.int64(100), d_model=np.int32(16), num_heads=2)
  assert c.key_size == 8


