"""The training step (§5): the train state, the data-parallel train and eval steps (compiled by
`compile_steps`, driven by modes/train.py). Data parallelism is the pmap model written with
`jax.shard_map` under `jax.jit` (mesh.py): over the mesh's one axis, 'data', parameters and
optimizer state are replicated, batches split by rows, gradients and metrics summed."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import xla
from t2t_jax.platform.mesh import AXIS, replicated, shard_batch
from t2t_jax.training import losses

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
# A packed batch's segments and positions (data/packing.py), and the model's names for them.
PACKED_ARGUMENTS = {'inputs_segmentation': 'src_segments', 'inputs_position': 'src_positions',
                    'targets_segmentation': 'tgt_segments', 'targets_position': 'tgt_positions'}
# The arrays of a batch the steps read (an eval batch's 'index' is the host's).
MODEL_KEYS = ('inputs', 'targets', *PACKED_ARGUMENTS)


@flax.struct.dataclass
class TrainState:
  """Everything a training run needs to continue: the step, params, Adam state and RNG."""
  step: jax.Array  # int32 [], updates done so far
  params: Any
  opt_state: optax.OptState
  rng: jax.Array  # uint32 [2], the run's dropout key; step keys are fold_in(rng, step)


def create_train_state(model: Transformer, tx: optax.GradientTransformation, seed: int,
                       mesh: Mesh) -> TrainState:
  """Initialises the parameters and Adam state directly as replicated global arrays."""
  def init() -> TrainState:
    params_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
    dummy = jnp.ones((1, 1), jnp.int32)
    params = model.init(params_rng, dummy, dummy)['params']
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                      rng=dropout_rng)
  return jax.jit(init, out_shardings=replicated(mesh))()


def loss_sums(params: Any, batch: Batch, model: Transformer, label_smoothing: float,
               rngs: dict[str, jax.Array] | None) -> tuple[jax.Array, losses.LossSums]:
  packed = {name: batch[key] for key, name in PACKED_ARGUMENTS.items() if key in batch}
  logits = model.apply({'params': params}, batch['inputs'], batch['targets'], rngs=rngs, **packed)
  sums = losses.cross_entropy_sums(logits, batch['targets'], label_smoothing=label_smoothing,
                                   form=model.config.forms.loss)
  return sums.loss, sums


def _metric_sums(sums: losses.LossSums, batch: Batch) -> Metrics:
  """Summed over devices; the host divides by the token counts for means."""
  source_tokens = jnp.sum(batch['inputs'] != PAD_ID).astype(jnp.float32)
  return jax.lax.psum(dict(sums._asdict(), num_source_tokens=source_tokens), AXIS)


def _accumulated_grads(params: Any, batch: Batch, rng: jax.Array, model: Transformer,
                       label_smoothing: float, grad_accum_steps: int,
                       ) -> tuple[Any, losses.LossSums]:
  """The gradient of this device's loss sum, and its LossSums, over its rows cut into k =
  `grad_accum_steps` micro-batches taken in turn (`lax.scan`): one pass's gradient (to float
  rounding) in one micro-batch's memory, §5.1's ~25k tokens a side on smaller devices."""
  rows, k = batch['inputs'].shape[0], grad_accum_steps
  if rows % k:
    raise ValueError(f'{rows} rows a device cannot be cut into grad_accum_steps={k} micro-batches: '
                     f'pad to a multiple of devices × {k} rows (as pipeline.get_datasets does)')
  # [k, rows / k, length]: micro-batch i is the device's rows i·rows/k .. (i + 1)·rows/k - 1.
  micro_batches = jax.tree_util.tree_map(lambda x: x.reshape(k, rows // k, *x.shape[1:]), batch)
  grad_fn = jax.grad(functools.partial(loss_sums, model=model, label_smoothing=label_smoothing),
                     has_aux=True)

  def add_micro_batch(totals, i_and_batch):
    i, micro_batch = i_and_batch
    # A dropout mask of its own for each micro-batch: fold in its index.
    out = grad_fn(params, micro_batch, rngs={'dropout': jax.random.fold_in(rng, i)})
    return jax.tree_util.tree_map(jnp.add, totals, out), None

  first = jax.tree_util.tree_map(lambda x: x[0], micro_batches)
  zeros = jax.tree_util.tree_map(jnp.zeros_like,
                                 jax.eval_shape(grad_fn, params, first, rngs={'dropout': rng}))
  return jax.lax.scan(add_micro_batch, zeros, (jnp.arange(k), micro_batches))[0]


def train_step(state: TrainState, batch: Batch, *, model: Transformer,
               tx: optax.GradientTransformation, label_smoothing: float,
               grad_accum_steps: int = 1) -> tuple[TrainState, Metrics]:
  """One Adam update on this device's rows (under shard_map) by the gradient of the per-token
  mean over the whole batch, however it is split into devices and micro-batches."""
  rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), jax.lax.axis_index(AXIS))
  # Per-device params: else shard_map's autodiff sums their cotangent and the psum sums it again.
  local_params = jax.lax.pcast(state.params, AXIS, to='varying')
  if grad_accum_steps == 1:
    grads, sums = jax.grad(loss_sums, has_aux=True)(local_params, batch, model, label_smoothing,
                                                     {'dropout': rng})
  else:
    grads, sums = _accumulated_grads(local_params, batch, rng, model, label_smoothing,
                                     grad_accum_steps)
  metrics = _metric_sums(sums, batch)
  grads = jax.tree_util.tree_map(lambda g: jax.lax.psum(g, AXIS) / metrics['num_tokens'], grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics['grad_norm'] = optax.tree.norm(grads)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Batch, *, model: Transformer, label_smoothing: float) -> Metrics:
  """Loss sums of this device's rows, summed over devices; no dropout."""
  return _metric_sums(loss_sums(params, batch, model, label_smoothing, rngs=None)[1], batch)


def compile_steps(model_config: ModelConfig, tx: optax.GradientTransformation,
                  label_smoothing: float, mesh: Mesh, *, grad_accum_steps: int = 1,
                  ) -> tuple[Callable, Callable]:
  """The train and eval steps, jit(shard_map(...)) over `mesh`. The train step donates the old
  state (no second copy) and takes batches of rows a multiple of mesh.size × grad_accum_steps."""
  train = jax.shard_map(
      functools.partial(train_step, model=Transformer(model_config), tx=tx,
                        label_smoothing=label_smoothing, grad_accum_steps=grad_accum_steps),
      mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()))
  return (jax.jit(train, donate_argnums=0, compiler_options=xla.step_compiler_options()),
          compile_eval_step(model_config, label_smoothing, mesh))


def compile_eval_step(model_config: ModelConfig, label_smoothing: float, mesh: Mesh) -> Callable:
  """The eval step alone (for --mode=eval's loss), as compile_steps makes it."""
  evaluate = functools.partial(eval_step, label_smoothing=label_smoothing,
                               model=Transformer(model_config.replace(deterministic=True)))
  return jax.jit(jax.shard_map(evaluate, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P()))


def summarize(sums: dict[str, float]) -> dict[str, float]:
  """Means from summed metrics: per-token loss, perplexity of the unsmoothed loss, accuracy."""
  n = max(sums['num_tokens'], 1.0)
  return {'loss': sums['loss'] / n, 'nll': sums['nll'] / n,
          'perplexity': float(np.exp(min(sums['nll'] / n, 50.0))), 'accuracy': sums['correct'] / n}


def eval_metrics(eval_fn: Callable, params: Any, batches: Iterable[dict[str, np.ndarray]],
                 mesh: Mesh) -> dict[str, float]:
  """Loss, perplexity and accuracy over a whole eval set."""
  totals: dict[str, float] = {}
  for batch in batches:
    batch = {k: v for k, v in batch.items() if k in MODEL_KEYS}
    for k, v in jax.device_get(eval_fn(params, shard_batch(batch, mesh))).items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return summarize(totals)
