"""Label-smoothed cross-entropy over the real (non-padding) target tokens, §5.4."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from t2t_jax.data.tokenizer import PAD_ID


class LossSums(NamedTuple):
  """Per-batch sums; divide by `num_tokens` (after summing over devices) for means."""
  loss: jax.Array  # label-smoothed cross-entropy, the training objective
  nll: jax.Array  # unsmoothed cross-entropy: exp(nll / num_tokens) is the perplexity
  correct: jax.Array  # tokens whose target has the highest probability (ties count)
  num_tokens: jax.Array  # real target tokens


def cross_entropy_sums(logits: jax.Array, targets: jax.Array, *,
                       label_smoothing: float) -> LossSums:
  """Cross-entropy against q = (1 - ε_ls)·one_hot(y) + ε_ls / V (Szegedy et al., 2016).

  logits [b, t, v] and targets [b, t]; PAD_ID targets weigh nothing. Per token:
    loss = (1 - ε_ls)·(-log p_y) + ε_ls·mean_k(-log p_k).
  """
  # From the logits and their log-sum-exp, without storing log p: every pass over the
  # [b, t, v] array costs more than its arithmetic on a CPU (the base step's 37k-wide logits
  # are 300 MB), and log_softmax wrote log p whole before three more reads of it.
  logits = logits.astype(jnp.float32)
  max_logit = jax.lax.stop_gradient(jnp.max(logits, axis=-1))  # [b, t], for stability only
  lse = max_logit + jnp.log(jnp.sum(jnp.exp(logits - max_logit[..., None]), axis=-1))  # [b, t]
  # A gather, not a sum of where(one_hot, logits, 0): on a CPU the train step's reductions
  # are YNNPACK's (xla.step_compiler_options), which cannot fuse the select, so XLA wrote
  # it out whole (another 300 MB written and read); the gather saves that pass
  # (docs/performance.md).
  target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [b, t]
  nll = lse - target_logit  # -log p_y
  uniform = lse - jnp.mean(logits, axis=-1)  # mean_k(-log p_k)
  loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  weights = (targets != PAD_ID).astype(jnp.float32)
  # The target scores highest (a tie counts as correct); cheaper than an argmax's index.
  correct = (target_logit >= max_logit).astype(jnp.float32)
  return LossSums(loss=jnp.sum(loss * weights), nll=jnp.sum(nll * weights),
                  correct=jnp.sum(correct * weights), num_tokens=jnp.sum(weights))
