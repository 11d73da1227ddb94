"""Label-smoothed cross-entropy over the real (non-padding) target tokens, §5.4."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from t2t_jax.data.tokenizer import PAD_ID

# How the loss is computed (the model's forms, kernels.py), the same numbers either way:
# 'autodiff' reads z_y by a gather that JAX differentiates (a scatter into a [b, t, v] buffer);
# 'one_pass' reads it by a one-hot select and writes the gradient by hand (_one_pass_bwd): one
# elementwise pass over [b, t, v], softmax(z) recomputed from z and the log-sum-exp.
LOSS_FORMS = ('autodiff', 'one_pass')


class LossSums(NamedTuple):
  """Per-batch sums; divide by `num_tokens` (after summing over devices) for means."""
  loss: jax.Array  # label-smoothed cross-entropy, the training objective
  nll: jax.Array  # unsmoothed cross-entropy: exp(nll / num_tokens) is the perplexity
  correct: jax.Array  # tokens whose target has the highest probability (ties count)
  num_tokens: jax.Array  # real target tokens


class _Terms(NamedTuple):
  """Per-token terms [b, t] of the loss, float32."""
  loss: jax.Array  # (1 - ε_ls)·(-log p_y) + ε_ls·mean_k(-log p_k)
  nll: jax.Array  # -log p_y
  target: jax.Array  # z_y
  max_logit: jax.Array  # max_k z_k (no gradient)


def cross_entropy_sums(logits: jax.Array, targets: jax.Array, *, label_smoothing: float,
                       form: str = 'autodiff') -> LossSums:
  """Cross-entropy against q = (1 - ε_ls)·one_hot(y) + ε_ls / V (Szegedy et al., 2016):
  logits [b, t, v], targets [b, t] (PAD_ID weighs nothing), `form` one of LOSS_FORMS."""
  logits = logits.astype(jnp.float32)
  if form == 'one_pass':
    terms = _one_pass_terms(logits, targets, label_smoothing)
  else:
    terms = _terms(logits, targets, label_smoothing, gather=True)[0]
  weights = (targets != PAD_ID).astype(jnp.float32)
  # The target scores highest (a tie counts as correct); cheaper than an argmax's index.
  correct = (terms.target >= terms.max_logit).astype(jnp.float32)
  return LossSums(loss=jnp.sum(terms.loss * weights), nll=jnp.sum(terms.nll * weights),
                  correct=jnp.sum(correct * weights), num_tokens=jnp.sum(weights))


def _terms(logits: jax.Array, targets: jax.Array, label_smoothing: float, *, gather: bool,
           ) -> tuple[_Terms, jax.Array]:
  """The terms, and log Σ_k exp z_k [b, t], without storing log p: every pass over the
  [b, t, v] logits costs more than its arithmetic."""
  max_logit = lax.stop_gradient(jnp.max(logits, axis=-1))  # for stability only
  lse = max_logit + jnp.log(jnp.sum(jnp.exp(logits - max_logit[..., None]), axis=-1))
  if gather:
    # Not a sum of where(one_hot, logits, 0), which a CPU's YNNPACK reductions
    # (xla.step_compiler_options) cannot fuse: XLA would write it out whole (docs/performance.md).
    target = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  else:
    target = jnp.sum(jnp.where(_is_target(logits, targets), logits, 0.0), axis=-1)
  uniform = lse - jnp.mean(logits, axis=-1)  # mean_k(-log p_k)
  nll = lse - target  # -log p_y
  loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  return _Terms(loss, nll, target, max_logit), lse


def _is_target(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """[b, t, v] True at each token's target: a compare with an iota, no gather."""
  vocabulary = lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1)
  return vocabulary == targets[..., None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _one_pass_terms(logits: jax.Array, targets: jax.Array, label_smoothing: float) -> _Terms:
  return _terms(logits, targets, label_smoothing, gather=False)[0]


def _one_pass_fwd(logits: jax.Array, targets: jax.Array, label_smoothing: float,
                  ) -> tuple[_Terms, tuple[jax.Array, jax.Array, jax.Array]]:
  terms, lse = _terms(logits, targets, label_smoothing, gather=False)
  return terms, (logits, targets, lse)


def _one_pass_bwd(label_smoothing: float, residuals: tuple[jax.Array, jax.Array, jax.Array],
                  g: _Terms) -> tuple[jax.Array, None]:
  """The logits' cotangent from the terms', per token with p = softmax(z), δ = one_hot(y):
    d loss / dz = p - (1 - ε_ls)·δ - ε_ls / V,  d nll / dz = p - δ,  d z_y / dz = δ
  (the maximum has none: it only steadies the log-sum-exp, and `correct` is a count)."""
  logits, targets, lse = residuals
  p = jnp.exp(logits - lse[..., None])
  on_target = (1.0 - label_smoothing) * g.loss + g.nll - g.target  # [b, t]
  uniform = label_smoothing / logits.shape[-1] * g.loss
  d_logits = ((g.loss + g.nll)[..., None] * p
              - jnp.where(_is_target(logits, targets), on_target[..., None], 0.0)
              - uniform[..., None])
  return d_logits, None


_one_pass_terms.defvjp(_one_pass_fwd, _one_pass_bwd)
