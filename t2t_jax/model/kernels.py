"""Hardware forms: the computations written differently for one backend's speed, in one place.

The model (transformer.py, cache.py) and the beam search (decode.py) take each form from the
`Kernels` that config.model.kernels names (rules.kernel_forms: 'auto' is 'cpu' on a CPU, else
'xla'):

  'xla'  the plain forms: flax's own dot_general, threefry dropout bits (as flax's
         nn.Dropout), the tied logits as one einsum, jnp.max and lax.top_k, the decoding
         cache as flax's ([b, T, h, d]); GPU and TPU compilers choose their own kernels and
         layouts for these.
  'cpu'  the forms XLA:CPU runs fastest (`flat_dot_general`, `cpu_tied_logits`, `hash_bits`,
         `row_max`, `block_top_k`, cache.py's 'cpu' layout); their `optimization_barrier`s
         keep XLA from undoing the chosen layouts. What each saves: docs/performance.md.

Both give the same numbers up to summation order, except dropout: 'cpu' draws its masks
from another random stream (the same Bernoulli(1 - P_drop) distribution). A CPU form is
traced under `jax.named_scope(CPU_SCOPE)`, so that a program's text shows where one is
(tests/test_accelerator_programs.py asserts there is none in the GPU and TPU programs).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array
CPU_SCOPE = 'cpu_form'  # the named scope every CPU form is traced in


# ---------------------------------------------------------------- backend-neutral products

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def einsum_f32(subscripts: str, a: Array, b: Array) -> Array:
  """jnp.einsum(subscripts, a, b) with a float32 result, the products in a and b's dtype.

  Autodiff would run the gradient's products in float32 (the slow rate of a bf16 matrix
  unit); here the cotangent is rounded to the operands' dtype first, as autodiff of a bf16
  product cast to float32 does. For float32 operands the same program as autodiff's.
  """
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_bwd(subscripts: str, res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  a, b = res
  _, vjp = jax.vjp(lambda a, b: jnp.einsum(subscripts, a, b), a, b)
  return vjp(g.astype(jnp.result_type(a, b)))


einsum_f32.defvjp(lambda subscripts, a, b: (einsum_f32(subscripts, a, b), (a, b)),
                  _einsum_f32_bwd)


def xla_tied_logits(x: Array, embedding: Array) -> Array:
  """x [b, t, m] · embedding [v, m]ᵀ -> float32 logits [b, t, v] (§3.4's shared weights)."""
  return einsum_f32('btm,vm->btv', x, embedding)


def xla_bits(shape: tuple[int, ...], key: Array) -> Array:
  """uint32 [shape] random bits: threefry, as flax's nn.Dropout draws its masks."""
  return jax.random.bits(key, shape, jnp.uint32)


def xla_row_max(x: Array) -> Array:
  return jnp.max(x, axis=-1)


# ---------------------------------------------------------------- levers for accelerators

def rbg_bits(shape: tuple[int, ...], key: Array) -> Array:
  """uint32 [shape] random bits from XLA's RngBitGenerator ('unsafe_rbg'), seeded by the key's
  words: GPU and TPU recipes' dropout generator, one instruction where threefry is ~20 rounds."""
  words = jax.random.key_data(key).reshape(-1) if jax.dtypes.issubdtype(
      key.dtype, jax.dtypes.prng_key) else key.reshape(-1)
  words = words.astype(jnp.uint32)[:2]
  seed = jnp.concatenate([words, words ^ np.uint32(0x9E3779B9)])
  return jax.random.bits(jax.random.wrap_key_data(seed, impl='unsafe_rbg'), shape, jnp.uint32)


# cuDNN's fused attention serves half precision, one head size of keys and values, ≤ 128, 8·n.
FUSED_DTYPES = (jnp.bfloat16, jnp.float16)
FUSED_MAX_HEAD_SIZE = 128


def fused_attention(query: Array, key: Array, value: Array, mask: Array | None, *,
                    implementation: str | None = None) -> Array | None:
  """§3.2.1's attention by `jax.nn.dot_product_attention` (`implementation` 'cudnn' on a GPU,
  else 'xla'), or None where cuDNN's kernel does not serve (float32, Table 3 row (A)'s
  512-wide heads, d_k ≠ d_v): the caller then uses its own. query [b, q, h, d], key and value
  [b, k, h, d], mask broadcastable to [b, 1, q, k] (True = may attend). Its logits and
  softmax are float32; no attention weights come out (attention maps use the plain form)."""
  d_k, d_v = query.shape[-1], value.shape[-1]
  if not (query.dtype in FUSED_DTYPES and d_k == d_v and d_k <= FUSED_MAX_HEAD_SIZE
          and d_k % 8 == 0):
    return None
  implementation = implementation or ('cudnn' if jax.default_backend() == 'gpu' else 'xla')
  if mask is not None:
    mask = jnp.broadcast_to(mask, (query.shape[0], 1, query.shape[1], key.shape[1]))
  return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                      implementation=implementation)


# ---------------------------------------------------------------- the CPU forms

def cpu_form(fn: Callable) -> Callable:
  """fn traced under the named scope CPU_SCOPE: its ops carry the name in a program."""
  @functools.wraps(fn)
  def scoped(*args, **kwargs):
    with jax.named_scope(CPU_SCOPE):
      return fn(*args, **kwargs)
  return scoped


@cpu_form
def hash_bits(shape: tuple[int, ...], key: Array) -> Array:
  """uint32 [shape] pseudo-random bits: element i gets mix(mix(i ^ k0) + k1), (k0, k1) the
  key's words and mix a bijective 32-bit avalanche hash (Wellons' lowbias32 constants), ~8
  integer operations an element where threefry takes ~20 rounds. Each call's key comes from
  flax's per-call fold_in, so masks of different sites, steps and devices are independent
  streams; within a site, consecutive counters decorrelate through the hash."""
  def mix(x: Array) -> Array:
    x = x ^ (x >> 16)
    x = x * np.uint32(0x21F0AAAD)
    x = x ^ (x >> 15)
    x = x * np.uint32(0xD35A2D97)
    return x ^ (x >> 15)
  words = jax.random.key_data(key).reshape(-1) if jax.dtypes.issubdtype(
      key.dtype, jax.dtypes.prng_key) else key.reshape(-1)
  words = words.astype(jnp.uint32)
  counter = lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  return mix(mix(counter ^ words[0]) + words[-1])


@cpu_form
def flat_dot_general(lhs: Array, rhs: Array, dimension_numbers: Any, precision: Any = None,
                     preferred_element_type: Any = None) -> Array:
  """`lax.dot_general` for the dense layers, as one 2-D matmul over the flattened rows.

  A projection [b, t, m] · [m, h, d] (or [b, t, h, d] · [h, d, m]) is [b·t, m] · [m, h·d]
  with free reshapes, whose 2-D gradients need none of the copies XLA:CPU makes for 3-D/4-D
  forms; a square or tall kernel's is cpu_matmul's. Other contractions (with batch axes) go
  to `lax.dot_general` unchanged.
  """
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  n = len(lhs_contract)
  trailing = tuple(range(lhs.ndim - n, lhs.ndim))
  if lhs_batch or rhs_batch or not n or tuple(lhs_contract) != trailing or tuple(
      rhs_contract) != tuple(range(n)):
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)
  k = math.prod(lhs.shape[lhs.ndim - n:])
  x, w = lhs.reshape(-1, k), rhs.reshape(k, -1)  # [rows, k], [k, features]
  if w.shape[0] >= w.shape[1] and precision is None and preferred_element_type is None:
    out = cpu_matmul(x, w)
  else:
    out = lax.dot(x, w, precision=precision, preferred_element_type=preferred_element_type)
  return out.reshape(*lhs.shape[:lhs.ndim - n], *rhs.shape[n:])  # from [rows, features]


_CONTRACT_ROWS = (((0,), (0,)), ((), ()))  # [rows, a] · [rows, c] -> [a, c]


@jax.custom_vjp
def cpu_matmul(x: Array, w: Array) -> Array:
  """x [rows, k] · w [k, n], k >= n, the kernel's gradient as XLA:CPU runs it fastest."""
  return lax.dot(x, w)


def _cpu_matmul_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  """The gradients autodiff would give; the kernel's, d_w = xᵀ g, by another route.

  Autodiff's xᵀ g contracts the rows, the major axis of both: one Eigen dot on XLA:CPU,
  slower than YNNPACK's dot of a transposed copy. A square kernel (attention's projections)
  gets xᵀ · g of x copied transposed (once for the query, key and value); a tall one (the
  FFN's W_2) (gᵀ x)ᵀ, whose Eigen dot writes the wide [n, k]. The outer barriers keep XLA
  from folding the transposes back into the dots; the inner one from fusing x's producer
  (a layer norm) into the copy, many times slower then. Within ~1e-6 (relative) of
  autodiff's: YNNPACK sums in another order.
  """
  x, w = res
  d_x = lax.dot_general(g, w, (((1,), (1,)), ((), ())))  # [rows, k]: g wᵀ
  if w.shape[0] == w.shape[1]:
    x_t = lax.optimization_barrier(lax.optimization_barrier(x).T)  # [k, rows]
    return d_x, x_t @ g
  d_w_t = lax.optimization_barrier(lax.dot_general(g, x, _CONTRACT_ROWS))  # [n, k]
  return d_x, d_w_t.T


cpu_matmul.defvjp(lambda x, w: (lax.dot(x, w), (x, w)), _cpu_matmul_bwd)


@jax.custom_vjp
def _cpu_logits(x: Array, embedding: Array) -> Array:
  """x [b, t, m] · embedding [v, m]ᵀ -> float32 logits [b, t, v], with the embedding's
  gradient in the form XLA:CPU runs fastest (see _cpu_logits_bwd)."""
  return jnp.einsum('btm,vm->btv', x, embedding, preferred_element_type=jnp.float32)


def _cpu_logits_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  """The gradients autodiff would give, the embedding's computed as [m, v] then transposed.

  Autodiff's d_embedding [v, m] = gᵀ x makes XLA:CPU's YNNPACK dot copy g [b·t, v] whole,
  the train step's largest copy; as (xᵀ g)ᵀ only x [b·t, m] is copied. The barrier keeps
  XLA from folding the transpose back into a slower transposing dot.
  """
  x, embedding = res
  g = g.astype(x.dtype)
  d_x = jnp.einsum('btv,vm->btm', g, embedding)  # [b, t, m]
  d_embedding_t = lax.optimization_barrier(jnp.einsum('btm,btv->mv', x, g))  # [m, v]
  return d_x, d_embedding_t.T


_cpu_logits.defvjp(lambda x, embedding: (_cpu_logits(x, embedding), (x, embedding)),
                   _cpu_logits_bwd)
cpu_tied_logits = cpu_form(_cpu_logits)


@cpu_form
def row_max(x: Array) -> Array:
  """The maximum over the last axis: jnp.max's values for x without NaN (exact in any order),
  by a compare-and-select reduction, several times faster on a CPU than XLA's NaN-propagating
  max. A NaN may not come out as the maximum; a NaN logit still makes its log-softmax row
  NaN, through the sum of exponentials."""
  select_max = lambda a, b: lax.select(a > b, a, b)  # noqa: E731
  return lax.reduce(x, jnp.array(-jnp.inf, x.dtype), select_max, (x.ndim - 1,))


@cpu_form
def block_top_k(x: Array, k: int) -> tuple[Array, Array]:
  """lax.top_k over the last axis of x [b, n] without NaN: the same values and indices, faster
  on a CPU for n ≫ k (beam 4 over a 37k vocabulary). The k largest lie in the k blocks of
  `block` entries with the largest maxima, taken in index order to keep lax.top_k's order
  for ties (lower index first)."""
  b, n = x.shape
  block = next((d for d in range(512, 63, -1) if n % d == 0), None)
  if block is None or n < 16 * k * block:
    return lax.top_k(x, k)
  blocks = x.reshape(b, n // block, block)
  _, chosen = lax.top_k(row_max(blocks), k)  # [b, k] block numbers
  chosen = jnp.sort(chosen, axis=-1)
  candidates = jnp.take_along_axis(blocks, chosen[:, :, None], axis=1).reshape(b, k * block)
  values, within = lax.top_k(candidates, k)  # [b, k]
  index = jnp.take_along_axis(chosen, within // block, axis=1) * block + within % block
  return values, index


# ---------------------------------------------------------------- the choice

@dataclasses.dataclass(frozen=True)
class Kernels:
  """The forms one choice hands the model and the beam search."""
  name: str
  dot_general: Callable | None  # the dense layers' `dot_general=` hook; None: flax's own
  dropout_bits: Callable[[tuple[int, ...], Array], Array]  # (shape, key) -> uint32 [shape]
  tied_logits: Callable[[Array, Array], Array]  # §3.4: (x [b, t, m], emb [v, m]) -> [b, t, v]
  row_max: Callable[[Array], Array]  # x [..., n] -> its maximum over the last axis
  top_k: Callable[[Array, int], tuple[Array, Array]]  # (x [b, n], k) -> as lax.top_k
  loss: str = 'autodiff'  # how §5.4's loss is computed (training/losses.py LOSS_FORMS)
  # (query, key, value, mask) -> attention's output, or None where it does not serve; None:
  # always the model's own softmax(QKᵀ/√d_k)V.
  attention: Callable[..., Array | None] | None = None
  cache: str = 'plain'  # the decoding key/value cache's layout (cache.py LAYOUTS)


KERNELS = {
    'xla': Kernels('xla', None, xla_bits, xla_tied_logits, xla_row_max, lax.top_k),
    'cpu': Kernels('cpu', flat_dot_general, hash_bits, cpu_tied_logits, row_max, block_top_k,
                   cache='cpu'),
}


# Levers for accelerators (benchmarks/accelerator.py --parts forms): each changes one form of
# the choice it is added to (`xla+one_pass_loss`), the same numbers up to its dtype's rounding,
# dropout from another stream. None is any choice's default until a GPU has measured it.
LEVERS = {
    'one_pass_loss': dict(loss='one_pass'),  # training/losses.py
    'rbg_dropout': dict(dropout_bits=rbg_bits),
    'hash_dropout': dict(dropout_bits=hash_bits),
    'fused_attention': dict(attention=fused_attention),
}


def get(name: str) -> Kernels:
  """The forms config.model.kernels names ('auto' resolved already: ModelConfig.from_config):
  a choice of KERNELS, then any LEVERS joined by '+' ('xla+one_pass_loss+rbg_dropout')."""
  base, *levers = name.split('+')
  forms = KERNELS[base]
  for lever in levers:
    forms = dataclasses.replace(forms, name=f'{forms.name}+{lever}', **LEVERS[lever])
  return forms
