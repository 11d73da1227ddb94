"""Label-smoothed cross-entropy over the real (non-padding) target tokens, §5.4."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from t2t_jax.tokenizer import PAD_ID


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
  log_p = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [b, t, v]
  one_hot = targets[..., None] == jnp.arange(log_p.shape[-1])  # [b, t, v], fused, not stored
  nll = -jnp.sum(jnp.where(one_hot, log_p, 0.0), axis=-1)  # [b, t]
  uniform = -jnp.mean(log_p, axis=-1)  # [b, t]
  loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
  weights = (targets != PAD_ID).astype(jnp.float32)
  # The target scores highest (a tie counts as correct); cheaper than an argmax's index.
  correct = (-nll >= jnp.max(log_p, axis=-1)).astype(jnp.float32)
  return LossSums(loss=jnp.sum(loss * weights), nll=jnp.sum(nll * weights),
                  correct=jnp.sum(correct * weights), num_tokens=jnp.sum(weights))
