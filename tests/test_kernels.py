"""The hardware forms (t2t_jax/model/kernels.py): each the same computation as its plain form
(NumPy references, float64), and on a CPU without the copies it exists to avoid."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import BF16_EPS
from t2t_jax.model import kernels
from t2t_jax.model import transformer as model_lib


def test_hash_bits_are_uniform_and_independent():
  """The dropout bits (kernels.hash_bits): each of the 32 bits fair, two keys and neighbouring
  counters uncorrelated, the same key the same bits; and Dropout keeps 1 - rate of the
  elements, scaled by 1 / (1 - rate), the others 0."""
  key = jax.random.PRNGKey(3)
  bits = np.asarray(kernels.hash_bits((500, 1000), key))
  per_bit = np.unpackbits(bits.view(np.uint8)).reshape(-1, 32).mean(axis=0)
  assert np.abs(per_bit - 0.5).max() < 0.005  # 5e5 draws: 3.5 standard deviations
  np.testing.assert_array_equal(bits, kernels.hash_bits((500, 1000), key))
  keep = bits < np.uint32(0.9 * 2 ** 32)
  other = np.asarray(kernels.hash_bits((500, 1000), jax.random.fold_in(key, 1))) < np.uint32(
      0.9 * 2 ** 32)
  assert abs(keep.mean() - 0.9) < 0.002
  assert abs((keep & other).mean() - 0.81) < 0.002  # independent of another key's mask
  flat = keep.ravel()
  assert abs((flat[1:] & flat[:-1]).mean() - 0.81) < 0.002  # and of its neighbour
  x = jnp.ones((400, 500))
  y = np.asarray(model_lib.Dropout(0.3, kernels.hash_bits).apply({}, x, deterministic=False,
                                                                 rngs={'dropout': key}))
  np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
  assert abs((y > 0).mean() - 0.7) < 0.005
  dropout = model_lib.Dropout(0.3, kernels.hash_bits)
  np.testing.assert_array_equal(dropout.apply({}, x, deterministic=True), x)


def test_cpu_tied_logits_gradients_match_numpy():
  """Its custom VJP gives autodiff's gradients: d_x = g E and d_E = gᵀ x (NumPy, float64)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 5, 8)).astype(np.float32)  # [b, t, m]
  emb = rng.normal(size=(11, 8)).astype(np.float32)  # [v, m]
  g = rng.normal(size=(3, 5, 11)).astype(np.float32)  # the cotangent of the logits

  def loss(x, emb):
    return jnp.sum(kernels.cpu_tied_logits(x, emb) * g)

  d_x, d_emb = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, emb)
  x64, emb64, g64 = (a.astype(np.float64) for a in (x, emb, g))
  np.testing.assert_allclose(kernels.cpu_tied_logits(x, emb), x64 @ emb64.T, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(d_x, g64 @ emb64, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_emb, np.einsum('btv,btm->vm', g64, x64), rtol=1e-5, atol=1e-5)


def test_the_embedding_gradient_does_not_copy_the_logits_gradient():
  """On a CPU the embedding's gradient contracts the tokens without a transposed copy of the
  [tokens, v] logits gradient (the train step's largest array): see kernels._cpu_logits_bwd."""
  b, t, m, v = 4, 64, 32, 4096
  x = jnp.ones((b, t, m))
  emb = jnp.ones((v, m))

  def loss(x, emb):
    return jnp.sum(jax.nn.logsumexp(kernels.cpu_tied_logits(x, emb), axis=-1))

  def copies(f):
    hlo = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, emb).compile().as_text()
    return re.findall(rf'= f32\[(?:{v},{b},{t}|{v},{b * t})\]\S* (?:copy|transpose|fusion)\(',
                      hlo)

  assert not copies(loss)
  plain = lambda x, emb: jnp.sum(jax.nn.logsumexp(jnp.einsum('btm,vm->btv', x, emb), axis=-1))  # noqa: E731
  assert copies(plain)  # the copy this avoids: without the custom VJP it is there


@pytest.mark.parametrize('lhs_shape, rhs_shape, n', [
    ((3, 5, 8), (8, 6), 1),  # nn.Dense: [b, t, m] · [m, f] (the FFN)
    ((3, 5, 8), (8, 2, 4), 1),  # queries, keys, values: [b, t, m] · [m, h, d]
    ((3, 5, 2, 4), (2, 4, 8), 2),  # the output projection: [b, t, h, d] · [h, d, m]
    ((3, 5, 12), (12, 4), 1),  # a kernel taller than wide (the FFN's W_2): kernels.cpu_matmul
])
def test_flat_dot_general_and_its_gradients_match_numpy(lhs_shape, rhs_shape, n):
  """The dense layers' 2-D matmul gives lax.dot_general's product and gradients (NumPy,
  float64): contracting the n trailing axes of x with the n leading axes of W."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=lhs_shape).astype(np.float32)
  w = rng.normal(size=rhs_shape).astype(np.float32)
  dims = ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ()))
  out_shape = lhs_shape[:-n] + rhs_shape[n:]
  g = rng.normal(size=out_shape).astype(np.float32)  # the cotangent of the output

  def loss(x, w):
    return jnp.sum(kernels.flat_dot_general(x, w, dims) * g)

  d_x, d_w = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
  k = int(np.prod(rhs_shape[:n]))
  x2, w2 = x.astype(np.float64).reshape(-1, k), w.astype(np.float64).reshape(k, -1)
  g2 = g.astype(np.float64).reshape(x2.shape[0], -1)
  out = kernels.flat_dot_general(x, w, dims)
  assert out.shape == out_shape
  np.testing.assert_allclose(out, (x2 @ w2).reshape(out_shape), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_x, (g2 @ w2.T).reshape(lhs_shape), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(d_w, (x2.T @ g2).reshape(rhs_shape), rtol=1e-5, atol=1e-5)


def test_flat_dot_general_leaves_other_contractions_to_lax():
  """Batch axes, or contracting axes that are not x's trailing and W's leading ones, go to
  lax.dot_general as they are."""
  rng = np.random.default_rng(1)
  a = rng.normal(size=(2, 3, 4)).astype(np.float32)
  b = rng.normal(size=(2, 4, 5)).astype(np.float32)
  batched = (((2,), (1,)), ((0,), (0,)))
  np.testing.assert_array_equal(kernels.flat_dot_general(a, b, batched),
                                jax.lax.dot_general(a, b, batched))
  c = rng.normal(size=(3, 6)).astype(np.float32)
  leading = (((1,), (0,)), ((), ()))  # a's middle axis against c's first
  np.testing.assert_array_equal(kernels.flat_dot_general(a, c, leading),
                                jax.lax.dot_general(a, c, leading))


def test_dense_gradients_copy_neither_kernel_nor_activations():
  """On a CPU the 2-D form's gradients read x and W as they are: the 3-D form
  [b, t, m] · [m, h, d] made XLA copy the kernel transposed ([m, h·d]) and the activations
  transposed ([m, b·t]) first (see kernels.flat_dot_general). A wide kernel (h·d > m) keeps
  autodiff's gradients; square and tall ones take other forms (the next test)."""
  b, t, m, h, d = 4, 64, 32, 4, 16
  x, w, g = jnp.ones((b, t, m)), jnp.ones((m, h, d)), jnp.ones((b, t, h, d))
  dims = (((2,), (0,)), ((), ()))

  def copies(dot_general):
    f = lambda x, w: jnp.sum(dot_general(x, w, dims) * g)  # noqa: E731
    hlo = jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, w).compile().as_text()
    entry = hlo[hlo.index('ENTRY'):]
    return re.findall(rf'= f32\[(?:{m},{b * t}|{h * d},{m})\]\S* (?:copy|transpose|fusion)\(',
                      entry)

  assert not copies(kernels.flat_dot_general)
  assert copies(jax.lax.dot_general)  # what it avoids: the copies are there without it


def test_square_and_tall_kernels_get_their_gradients_in_the_faster_forms():
  """On a CPU (kernels._cpu_matmul_bwd) a tall kernel's gradient [k, n] is made as the product
  [n, k] and transposed, not by a dot that writes [k, n] row-major; a square kernel's is a
  plain product of x copied transposed, not a dot that contracts the rows of both."""
  rows, k, n = 256, 64, 16
  dims = (((1,), (0,)), ((), ()))

  def compiled(dot_general, w):
    x, g = jnp.ones((rows, w.shape[0])), jnp.ones((rows, w.shape[1]))
    f = lambda x, w: jnp.sum(dot_general(x, w, dims) * g)  # noqa: E731
    return jax.jit(jax.grad(f, argnums=(0, 1))).lower(x, w).compile().as_text()

  def products(hlo):
    """The (rows, columns) that the dots write, as laid out in memory."""
    found = re.findall(r'= f32\[(\d+),(\d+)\]\{(\d),\d\} dot\(', hlo)
    return {(int(a), int(b)) if minor == '1' else (int(b), int(a)) for a, b, minor in found}

  def contracts_rows(hlo):  # a dot that contracts the major axis of its first operand
    return 'lhs_contracting_dims={0}' in hlo

  tall, plain_tall = (compiled(f, jnp.ones((k, n))) for f in (kernels.flat_dot_general,
                                                              jax.lax.dot_general))
  assert products(tall) == {(rows, k), (n, k)}
  assert (k, n) in products(plain_tall)  # what it replaces
  square, plain_square = (compiled(f, jnp.ones((n, n))) for f in (kernels.flat_dot_general,
                                                                  jax.lax.dot_general))
  assert not contracts_rows(square) and re.search(rf'= f32\[{n},{rows}\]\S* (?:fusion|copy)',
                                                  square)
  assert contracts_rows(plain_square)


# ---------------------------------------------------------------- levers for accelerators

def test_rbg_bits_are_uniform_keyed_and_drop_at_the_rate():
  """kernels.rbg_bits (lever 'rbg_dropout'): each of the 32 bits fair, the same key the same
  bits, another key other bits; and Dropout with them keeps 1 - rate of the elements."""
  key = jax.random.PRNGKey(3)
  bits = np.asarray(kernels.rbg_bits((500, 1000), key))
  per_bit = np.unpackbits(bits.view(np.uint8)).reshape(-1, 32).mean(axis=0)
  assert np.abs(per_bit - 0.5).max() < 0.005  # 5e5 draws: 3.5 standard deviations
  np.testing.assert_array_equal(bits, kernels.rbg_bits((500, 1000), key))
  other = np.asarray(kernels.rbg_bits((500, 1000), jax.random.fold_in(key, 1)))
  assert abs(((bits < 2 ** 31) & (other < 2 ** 31)).mean() - 0.25) < 0.002
  y = np.asarray(model_lib.Dropout(0.3, kernels.rbg_bits).apply(
      {}, jnp.ones((400, 500)), deterministic=False, rngs={'dropout': key}))
  np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.7], rtol=1e-6)
  assert abs((y > 0).mean() - 0.7) < 0.005


def _attention_inputs(dtype, heads=2, size=16, rows=3, length=7):
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(rows, length, heads, size)), dtype) for _ in range(3))
  ids = np.array([[5, 6, 7, 8, 9, 0, 0], [5, 6, 0, 0, 0, 0, 0], [5, 6, 7, 8, 9, 4, 3]])
  segments = jnp.asarray([[1, 1, 2, 2, 2, 0, 0], [1, 2, 3, 0, 0, 0, 0], [1, 1, 1, 1, 2, 2, 2]])
  masks = {'none': None, 'padding': model_lib.padding_mask(jnp.asarray(ids)),
           'causal': model_lib.causal_mask(length),
           'packed causal': model_lib.causal_mask(length) & model_lib.segment_mask(segments,
                                                                                   segments)}
  return q, k, v, masks


@pytest.mark.parametrize('mask', ['none', 'padding', 'causal', 'packed causal'])
def test_fused_attention_is_the_models_attention(mask):
  """Lever 'fused_attention': jax.nn.dot_product_attention with each mask the model makes
  gives scaled_dot_product_attention's output to bfloat16's rounding (XLA's implementation
  here; cuDNN's on a GPU, where the device script compares them), float32 logits both."""
  q, k, v, masks = _attention_inputs(jnp.bfloat16)
  fused = kernels.fused_attention(q, k, v, masks[mask], implementation='xla')
  plain, _ = model_lib.scaled_dot_product_attention(q, k, v, masks[mask])
  assert fused.dtype == plain.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(fused, np.float32), np.asarray(plain, np.float32),
                             rtol=2 * BF16_EPS, atol=2 * BF16_EPS)


def test_fused_attention_leaves_to_the_model_what_it_cannot_serve():
  """float32, heads wider than 128 (Table 3 row (A)), d_k ≠ d_v: None, the model's own form."""
  q, k, v, masks = _attention_inputs(jnp.float32)
  assert kernels.fused_attention(q, k, v, masks['causal']) is None
  wide = jnp.zeros((1, 4, 1, 256), jnp.bfloat16)
  assert kernels.fused_attention(wide, wide, wide, None) is None
  narrow_v = jnp.zeros((1, 4, 2, 8), jnp.bfloat16)
  assert kernels.fused_attention(jnp.zeros((1, 4, 2, 16), jnp.bfloat16),
                                 jnp.zeros((1, 4, 2, 16), jnp.bfloat16), narrow_v, None) is None


def test_a_model_with_the_fused_attention_gives_its_logits_and_keeps_its_maps():
  """The whole model with 'xla+fused_attention' in bfloat16: the logits of 'xla' to
  bfloat16's rounding; asked for attention maps, it computes them as before."""
  c = model_lib.ModelConfig(vocab_size=40, num_layers=1, d_model=32, d_ff=64, num_heads=2,
                            dtype='bfloat16', kernels='xla', deterministic=True)
  src = jnp.array([[5, 6, 7, 1, 0], [8, 9, 1, 0, 0]])
  tgt = jnp.array([[3, 4, 1, 0], [6, 1, 0, 0]])
  params = model_lib.Transformer(c).init(jax.random.PRNGKey(0), src, tgt)['params']
  plain = model_lib.Transformer(c).apply({'params': params}, src, tgt)
  lever = c.replace(kernels='xla+fused_attention')
  fused = model_lib.Transformer(lever).apply({'params': params}, src, tgt)
  np.testing.assert_allclose(fused, plain, rtol=0.02, atol=0.02 * float(jnp.abs(plain).max()))
  _, maps = model_lib.Transformer(lever).apply({'params': params}, src, tgt,
                                               mutable=['intermediates'])
  assert len(jax.tree_util.tree_leaves(maps)) == 3  # encoder self, decoder self and cross


def test_levers_join_a_choice_by_plus():
  forms = kernels.get('xla+one_pass_loss+rbg_dropout')
  assert forms.name == 'xla+one_pass_loss+rbg_dropout'
  assert (forms.loss, forms.dropout_bits, forms.tied_logits) == (
      'one_pass', kernels.rbg_bits, kernels.xla_tied_logits)
  assert kernels.get('cpu+fused_attention').dot_general is kernels.flat_dot_general
  assert kernels.get('xla') is kernels.KERNELS['xla']
