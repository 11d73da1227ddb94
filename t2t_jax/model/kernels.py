"""Hardware forms: the computations written differently for one backend's speed, in one place.

The model (transformer.py) and the beam search (decode.py) take each such form from the `Kernels`
that config.model.kernels names, resolved once for the platform
(rules.kernel_forms: 'auto' is 'cpu' on a CPU, 'xla' elsewhere):

  'xla'  the plain forms: flax's own dot_general, threefry dropout bits (jax.random.bits,
         as flax's nn.Dropout draws them), the tied logits as one einsum, jnp.max and
         lax.top_k. GPU and TPU compilers are given these and choose their own kernels.
  'cpu'  the same computations in the forms XLA:CPU runs fastest: dense layers as 2-D
         matmuls with the kernel gradient taken in another order (`flat_dot_general`),
         the tied logits' embedding gradient computed transposed (`cpu_tied_logits`),
         dropout bits from a counter hash (`hash_bits`), and a max and a top-k by block
         (`row_max`, `block_top_k`). The `optimization_barrier`s they hold keep XLA from
         undoing the chosen layouts. What each saves: docs/performance.md.

Both give the same numbers up to summation order, except dropout: 'cpu' draws its masks
from another random stream (the same Bernoulli(1 - P_drop) distribution). Everything here
is traced under `jax.named_scope(CPU_SCOPE)` when it is a CPU form, so that a program's
text shows where one is (tests/test_accelerator_programs.py asserts there is none in the
GPU and TPU programs).

Both choices keep the two numerically sensitive products' results in float32 whatever the
compute dtype: the pre-softmax logits [tokens, vocabulary] and attention's Q·Kᵀ
(`einsum_f32`); their gradients' products run in the compute dtype.
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

  Autodiff of an einsum with preferred_element_type=float32 would run its gradient's
  products in float32 (it converts both operands), the slow rate of a bf16 matrix unit;
  here the float32 cotangent is rounded to the operands' dtype first, as autodiff of a
  bf16 product followed by a cast to float32 does. For float32 operands the same program as
  autodiff's.
  """
  return jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_fwd(subscripts: str, a: Array, b: Array) -> tuple[Array, tuple[Array, Array]]:
  return einsum_f32(subscripts, a, b), (a, b)


def _einsum_f32_bwd(subscripts: str, res: tuple[Array, Array], g: Array
                    ) -> tuple[Array, Array]:
  a, b = res
  _, vjp = jax.vjp(lambda a, b: jnp.einsum(subscripts, a, b), a, b)
  return vjp(g.astype(jnp.result_type(a, b)))


einsum_f32.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)


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
  """uint32 [shape] random bits from XLA's RngBitGenerator (jax's 'unsafe_rbg' keys), seeded
  by the call's key words: the generator GPU and TPU recipes draw dropout masks from, one
  instruction where threefry is ~20 rounds of integer arithmetic a pair of words."""
  words = jax.random.key_data(key).reshape(-1) if jax.dtypes.issubdtype(
      key.dtype, jax.dtypes.prng_key) else key.reshape(-1)
  words = words.astype(jnp.uint32)[:2]
  seed = jnp.concatenate([words, words ^ np.uint32(0x9E3779B9)])
  return jax.random.bits(jax.random.wrap_key_data(seed, impl='unsafe_rbg'), shape, jnp.uint32)


# cuDNN's fused attention serves these: half-precision operands, one head size for keys and
# values, at most 128 and a multiple of 8.
FUSED_DTYPES = (jnp.bfloat16, jnp.float16)
FUSED_MAX_HEAD_SIZE = 128


def fused_attention(query: Array, key: Array, value: Array, mask: Array | None, *,
                    implementation: str | None = None) -> Array | None:
  """§3.2.1's attention by `jax.nn.dot_product_attention` (cuDNN's fused kernel on a GPU,
  `implementation` 'cudnn'; elsewhere XLA's, 'xla'), or None where that kernel does not
  serve (float32, Table 3 row (A)'s 512-wide heads, d_k ≠ d_v): the caller then computes
  it as before. query [b, q, h, d], key and value [b, k, h, d], mask broadcastable to
  [b, 1, q, k] (True = may attend: padding, causal or a packed row's pairs), passed whole.
  Its logits and softmax are float32 as the plain form's; no attention weights come out,
  so attention maps (which keep them) use the plain form."""
  d_k, d_v = query.shape[-1], value.shape[-1]
  served = (query.dtype in FUSED_DTYPES and d_k == d_v and d_k <= FUSED_MAX_HEAD_SIZE
            and d_k % 8 == 0)
  if not served:
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
  key's words and mix a bijective 32-bit avalanche hash (Wellons' lowbias32 constants).

  ~8 integer operations an element, where threefry takes ~20 rounds a pair of words: on a
  CPU threefry's bits were a noticeable share of the train step. Each call's key comes from
  flax's per-call fold_in (threefry on one key), so masks of different sites, steps and
  devices are independent streams; within a site, consecutive counters decorrelate
  through the hash.
  """
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

  A projection [b, t, m] · [m, h, d] (or [b, t, h, d] · [h, d, m]) contracts trailing
  axes of its input with leading axes of its kernel, so [b·t, m] · [m, h·d] is the same
  product with free reshapes. Autodiff then gives 2-D gradients too, dx = g Wᵀ and
  dW = xᵀ g, which XLA:CPU's dots take as they are; the 3-D/4-D forms made it copy the
  kernel transposed for dx and run dW on copies of the activations. A square or tall
  kernel gets its gradient from `cpu_matmul`. Other contractions (with batch axes) go to
  `lax.dot_general` unchanged.
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
  """x [rows, k] · w [k, n], k >= n, with the kernel gradient in the form XLA:CPU runs
  fastest (see _cpu_matmul_bwd)."""
  return lax.dot(x, w)


def _cpu_matmul_fwd(x: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
  return lax.dot(x, w), (x, w)


def _cpu_matmul_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  """The gradients autodiff would give; the kernel's, d_w = xᵀ g, by another route.

  Autodiff's xᵀ g contracts the rows, the major axis of both, which XLA:CPU runs as one
  Eigen dot, slower than YNNPACK's dot of a transposed copy. So:
    * a square kernel (the attention projections): x is copied transposed (XLA makes one
      copy for the projections that share an input, as the query, key and value do) and
      d_w = xᵀ · g as a plain product;
    * a tall kernel (the FFN's W_2): d_w = (gᵀ x)ᵀ, whose Eigen dot writes the wide [n, k].
  The outer barriers keep XLA from folding the transposes back into the dots; the inner
  one from fusing x's producer (a layer norm) into the transposed copy, which then runs
  many times slower. Gradients within ~1e-6 (relative) of autodiff's: YNNPACK sums in
  another order.
  """
  x, w = res
  d_x = lax.dot_general(g, w, (((1,), (1,)), ((), ())))  # [rows, k]: g wᵀ
  if w.shape[0] == w.shape[1]:
    x_t = lax.optimization_barrier(lax.optimization_barrier(x).T)  # [k, rows]
    return d_x, x_t @ g
  d_w_t = lax.optimization_barrier(lax.dot_general(g, x, _CONTRACT_ROWS))  # [n, k]
  return d_x, d_w_t.T


cpu_matmul.defvjp(_cpu_matmul_fwd, _cpu_matmul_bwd)


@jax.custom_vjp
def _cpu_logits(x: Array, embedding: Array) -> Array:
  return jnp.einsum('btm,vm->btv', x, embedding, preferred_element_type=jnp.float32)


def _cpu_logits_fwd(x: Array, embedding: Array) -> tuple[Array, tuple[Array, Array]]:
  return _cpu_logits(x, embedding), (x, embedding)


def _cpu_logits_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
  """The gradients autodiff would give, the embedding's computed as [m, v] then transposed.

  Autodiff's d_embedding [v, m] = gᵀ x contracts the tokens, the major axis of g [b·t, v]:
  XLA:CPU's YNNPACK dot then copies g whole into [v, b·t] first, the train step's largest
  copy. As (xᵀ g)ᵀ only x [b·t, m] is copied and the result [m, v] transposed; the barrier
  keeps XLA from folding that transpose back into the dot (it then used a slower
  transposing dot).
  """
  x, embedding = res
  g = g.astype(x.dtype)
  d_x = jnp.einsum('btv,vm->btm', g, embedding)  # [b, t, m]
  d_embedding_t = lax.optimization_barrier(jnp.einsum('btm,btv->mv', x, g))  # [m, v]
  return d_x, d_embedding_t.T


_cpu_logits.defvjp(_cpu_logits_fwd, _cpu_logits_bwd)
cpu_tied_logits = cpu_form(_cpu_logits)
cpu_tied_logits.__doc__ = """x [b, t, m] · embedding [v, m]ᵀ -> float32 logits [b, t, v], with
the embedding's gradient in the form XLA:CPU runs fastest (see _cpu_logits_bwd)."""


@cpu_form
def row_max(x: Array) -> Array:
  """The maximum over the last axis: jnp.max's values for x without NaN (a maximum is
  exact in any order), by a reduction whose step is a compare and a select.

  XLA:CPU's own max propagates NaN, and its reduction ran several times slower over the
  beam search's [b, k, 37000] log-probabilities. A NaN may not come out as the maximum; in
  the log-softmax a NaN logit still makes its whole row NaN, through the sum of
  exponentials.
  """
  select_max = lambda a, b: lax.select(a > b, a, b)  # noqa: E731
  return lax.reduce(x, jnp.array(-jnp.inf, x.dtype), select_max, (x.ndim - 1,))


@cpu_form
def block_top_k(x: Array, k: int) -> tuple[Array, Array]:
  """lax.top_k over the last axis of x [b, n] without NaN: the same values and indices,
  faster on a CPU for n ≫ k (beam 4 over a 37k vocabulary).

  The k largest entries lie in the k blocks (of `block` consecutive entries) with the
  largest maxima, so a max per block, a top-k of those maxima and a top-k within the chosen
  blocks finds them. Taking the chosen blocks in index order keeps lax.top_k's order for
  ties (lower index first).
  """
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
  # flax's `dot_general=` hook of the dense layers; None: flax's own (lax.dot_general).
  dot_general: Callable | None
  # (shape, key) -> uint32 bits [shape] for dropout masks.
  dropout_bits: Callable[[tuple[int, ...], Array], Array]
  # (x [b, t, m], embedding [v, m]) -> float32 logits [b, t, v], §3.4.
  tied_logits: Callable[[Array, Array], Array]
  # x [..., n] -> its maximum over the last axis (decoding's log-softmax).
  row_max: Callable[[Array], Array]
  # (x [b, n], k) -> (values, indices) [b, k], as lax.top_k.
  top_k: Callable[[Array, int], tuple[Array, Array]]
  # How §5.4's loss is computed and differentiated (training/losses.py LOSS_FORMS).
  loss: str = 'autodiff'
  # (query, key, value, mask) -> attention's output, or None where it does not serve (the
  # model's own softmax(QKᵀ/√d_k)V then); None: always the model's own.
  attention: Callable[..., Array | None] | None = None


KERNELS = {
    'xla': Kernels('xla', None, xla_bits, xla_tied_logits, xla_row_max, lax.top_k),
    'cpu': Kernels('cpu', flat_dot_general, hash_bits, cpu_tied_logits, row_max, block_top_k),
}


# Levers for accelerators (their price: benchmarks/accelerator.py --parts forms): each changes
# one form of the choice it is added to, `--config.model.kernels=xla+one_pass_loss`. Each
# computes the same numbers up to its dtype's rounding (tests/test_kernels.py), dropout
# from another random stream. None is the default of any choice until a GPU has measured it.
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
