"""The hardware forms (t2t_jax/model/kernels.py): each the same computation as its plain form
(NumPy references, float64), and on a CPU without the copies it exists to avoid."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
