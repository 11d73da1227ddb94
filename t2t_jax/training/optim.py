"""Adam with the warm-up then inverse-square-root learning rate of §5.3, and two schedules
without warm-up for fine-tuning (not in the paper): config.lr_schedule."""
from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax


def rsqrt_warmup(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
  """lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5), §5.3 eq. (3),
  step_num counting from 1 (the first update) as in the paper, times `scale` (1 in the paper)."""
  def schedule(step_num):
    step = jnp.maximum(jnp.asarray(step_num, jnp.float32), 1.0)
    return scale * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
  return schedule


def learning_rate_schedule(config: ml_collections.ConfigDict) -> optax.Schedule:
  """The schedule as a function of optax's update count, which starts at 0 for update 1.

  config.lr_schedule: 'warmup_rsqrt' (§5.3); 'rsqrt', §5.3's decay without its warm-up,
  peak · (warmup_steps / (warmup_steps + step_num - 1))^0.5 from config.learning_rate (where
  that is 0, §5.3's peak d_model^-0.5 · warmup_steps^-0.5 · scale); or 'constant'
  (config.learning_rate). The last two suit fine-tuning (config.init_from): no warm-up.
  """
  d_model, warmup, scale = config.model.d_model, config.warmup_steps, config.learning_rate_scale
  kind = config.get('lr_schedule', 'warmup_rsqrt')
  if kind == 'constant':
    return optax.constant_schedule(config.learning_rate)
  if kind == 'rsqrt':
    peak = config.learning_rate or scale * d_model ** -0.5 * warmup ** -0.5
    def decay(count):
      step = jnp.maximum(jnp.asarray(count + 1, jnp.float32), 1.0)  # step_num
      return peak * (warmup / (warmup + step - 1.0)) ** 0.5
    return decay
  paper = rsqrt_warmup(d_model, warmup, scale)
  return lambda count: paper(count + 1)


def make_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adam(β1, β2, ε) = (0.9, 0.98, 1e-9) from the config (§5.3) with the §5.3 schedule."""
  return optax.adam(learning_rate_schedule(config), b1=config.adam_beta1, b2=config.adam_beta2,
                    eps=config.adam_eps)
