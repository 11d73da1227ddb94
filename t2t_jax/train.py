"""Training (§5): the train state, the data-parallel train and eval steps, and the loop.

Data parallelism is the pmap model written with `jax.shard_map` under `jax.jit`: the step
is a per-device function over a 1-D mesh of all devices (axis 'data'); parameters and
optimizer state are replicated, each batch is split along its rows, and gradients and
metrics are summed over the axis. The same code runs on one CPU, 8 GPUs, a TPU slice or
several hosts: batches enter as process-local numpy arrays and become one global array.
"""
from __future__ import annotations

import functools
import json
import math
import os
import signal
import sys
import time
import types
from typing import Any, Callable, Iterable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t2t_jax import checkpoints, config_lib, distributed, losses, optim
from t2t_jax import workdir as workdir_lib
from t2t_jax.model import ModelConfig, Transformer

AXIS = 'data'  # the mesh axis the batch is split over

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  """Everything a training run needs to continue: the step, params, Adam state and RNG."""
  step: jax.Array  # int32 [], updates done so far
  params: Any
  opt_state: optax.OptState
  rng: jax.Array  # uint32 [2], the run's dropout key; step keys are fold_in(rng, step)


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh of all devices (of every process), named 'data'."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (AXIS,))


def create_train_state(model: Transformer, tx: optax.GradientTransformation, seed: int,
                       mesh: Mesh) -> TrainState:
  """Initialises the parameters and Adam state directly as replicated global arrays."""
  def init() -> TrainState:
    params_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
    dummy = jnp.ones((1, 1), jnp.int32)
    params = model.init(params_rng, dummy, dummy)['params']
    return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                      rng=dropout_rng)
  return jax.jit(init, out_shardings=NamedSharding(mesh, P()))()


def _loss_sums(params: Any, batch: Batch, model: Transformer, label_smoothing: float,
               rngs: dict[str, jax.Array] | None) -> tuple[jax.Array, losses.LossSums]:
  logits = model.apply({'params': params}, batch['inputs'], batch['targets'], rngs=rngs)
  sums = losses.cross_entropy_sums(logits, batch['targets'], label_smoothing=label_smoothing)
  return sums.loss, sums


def _metric_sums(sums: losses.LossSums, batch: Batch) -> Metrics:
  """Summed over devices; the host divides by the token counts for means."""
  local = dict(sums._asdict(), num_source_tokens=jnp.sum(batch['inputs'] != 0).astype(jnp.float32))
  return jax.lax.psum(local, AXIS)


def _accumulated_grads(params: Any, batch: Batch, rng: jax.Array, model: Transformer,
                       label_smoothing: float, grad_accum_steps: int,
                       ) -> tuple[Any, losses.LossSums]:
  """The gradient of this device's loss sum, and its LossSums, over its rows cut into
  `grad_accum_steps` micro-batches taken one after another (`lax.scan`): memory holds one
  micro-batch's activations plus the running sums. Sums of sums, so the same gradient as
  one pass over the rows (to float rounding): the paper's 25k-token update (§5.1) on
  fewer or smaller accelerators."""
  rows = batch['inputs'].shape[0]
  if rows % grad_accum_steps:
    raise ValueError(f'{rows} rows a device cannot be cut into grad_accum_steps='
                     f'{grad_accum_steps} micro-batches: pad the global batch to a multiple '
                     'of devices × grad_accum_steps (data.get_datasets(grad_accum_steps=...))')
  # [k, rows / k, length]: micro-batch i is the device's rows i·rows/k .. (i + 1)·rows/k - 1.
  micro_batches = jax.tree_util.tree_map(
      lambda x: x.reshape(grad_accum_steps, rows // grad_accum_steps, *x.shape[1:]), batch)
  grad_fn = jax.grad(functools.partial(_loss_sums, model=model, label_smoothing=label_smoothing),
                     has_aux=True)

  def add_micro_batch(totals, i_and_batch):
    i, micro_batch = i_and_batch
    # A dropout mask of its own for each micro-batch: fold in its index.
    out = grad_fn(params, micro_batch, rngs={'dropout': jax.random.fold_in(rng, i)})
    return jax.tree_util.tree_map(jnp.add, totals, out), None

  first = jax.tree_util.tree_map(lambda x: x[0], micro_batches)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, jax.eval_shape(
      grad_fn, params, first, rngs={'dropout': rng}))
  (grads, sums), _ = jax.lax.scan(add_micro_batch, zeros,
                                  (jnp.arange(grad_accum_steps), micro_batches))
  return grads, sums


def train_step(state: TrainState, batch: Batch, *, model: Transformer,
               tx: optax.GradientTransformation, label_smoothing: float,
               grad_accum_steps: int = 1) -> tuple[TrainState, Metrics]:
  """One Adam update on this device's rows of the global batch (run under shard_map).

  The loss is the sum over the device's real target tokens; the summed gradients are
  divided by the global token count (psum over devices), so the update is the gradient of
  the per-token mean over the whole batch, however the batch is split across devices, and
  with `grad_accum_steps` > 1 however each device's rows are split into micro-batches.
  """
  rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), jax.lax.axis_index(AXIS))
  # Differentiate w.r.t. a per-device copy of the params: otherwise shard_map's autodiff
  # already sums the cotangent of a replicated input over the axis, and the psum below
  # would count every device's gradient `mesh.size` times.
  local_params = jax.lax.pcast(state.params, AXIS, to='varying')
  if grad_accum_steps == 1:  # one pass over the rows
    grad_fn = jax.grad(_loss_sums, has_aux=True)
    grads, sums = grad_fn(local_params, batch, model, label_smoothing, {'dropout': rng})
  else:
    grads, sums = _accumulated_grads(local_params, batch, rng, model, label_smoothing,
                                     grad_accum_steps)
  metrics = _metric_sums(sums, batch)
  grads = jax.tree_util.tree_map(lambda g: jax.lax.psum(g, AXIS) / metrics['num_tokens'], grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics['grad_norm'] = optax.tree.norm(grads)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params: Any, batch: Batch, *, model: Transformer, label_smoothing: float,
              ) -> Metrics:
  """Loss sums of this device's rows, summed over devices; no dropout."""
  _, sums = _loss_sums(params, batch, model, label_smoothing, rngs=None)
  return _metric_sums(sums, batch)


def compile_steps(model_config: ModelConfig, tx: optax.GradientTransformation,
                  label_smoothing: float, mesh: Mesh, *, grad_accum_steps: int = 1,
                  ) -> tuple[Callable, Callable]:
  """The train and eval steps as jit(shard_map(...)) over `mesh`: the one place they compile.

  The train step donates the old state: no second copy of params and Adam moments. With
  `grad_accum_steps` = k (config.grad_accum_steps) it takes each device's rows in k
  micro-batches; batches then need rows divisible by mesh.size × k.
  """
  train_model = Transformer(model_config)
  eval_model = Transformer(model_config.replace(deterministic=True))
  train = jax.shard_map(
      functools.partial(train_step, model=train_model, tx=tx, label_smoothing=label_smoothing,
                        grad_accum_steps=grad_accum_steps),
      mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=(P(), P()))
  evaluate = jax.shard_map(
      functools.partial(eval_step, model=eval_model, label_smoothing=label_smoothing),
      mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P())
  return jax.jit(train, donate_argnums=0), jax.jit(evaluate)


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> Batch:
  """Process-local rows -> one global array per key, split over the 'data' axis."""
  sharding = NamedSharding(mesh, P(AXIS))
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def summarize(sums: dict[str, float]) -> dict[str, float]:
  """Means from summed metrics: per-token loss, perplexity of the unsmoothed loss, accuracy."""
  n = max(sums['num_tokens'], 1.0)
  return {'loss': sums['loss'] / n, 'nll': sums['nll'] / n,
          'perplexity': float(np.exp(min(sums['nll'] / n, 50.0))), 'accuracy': sums['correct'] / n}


def evaluate(eval_fn: Callable, params: Any, batches: Iterable[dict[str, np.ndarray]],
             mesh: Mesh) -> dict[str, float]:
  """Loss, perplexity and accuracy over a whole eval set."""
  totals: dict[str, float] = {}
  for batch in batches:
    batch = {k: v for k, v in batch.items() if k in ('inputs', 'targets')}
    for k, v in jax.device_get(eval_fn(params, shard_batch(batch, mesh))).items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return summarize(totals)


class MetricWriter:
  """Appends one JSON object per call to DIR/metrics.jsonl and writes TensorBoard events.

  Only process 0 writes, so several hosts don't write the same file.
  """

  def __init__(self, workdir: str):
    self._active = jax.process_index() == 0
    if not self._active:
      return
    # TensorBoard's event writer imports TensorFlow (~6 s) unless its 'notf' marker module
    # exists; without it, it uses its own stub, which is all a scalar writer needs.
    sys.modules.setdefault('tensorboard.compat.notf', types.ModuleType('tensorboard.compat.notf'))
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    os.makedirs(workdir, exist_ok=True)
    self._jsonl = open(os.path.join(workdir, 'metrics.jsonl'), 'a', encoding='utf-8')
    self._events = EventFileWriter(os.path.join(workdir, 'tensorboard'))

  def write(self, step: int, metrics: dict[str, float], prefix: str = '') -> None:
    if not self._active:
      return
    from tensorboard.compat.proto import event_pb2, summary_pb2
    record = {'step': step, **{prefix + k: float(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v)
              for k, v in record.items() if k != 'step']
    self._events.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                           summary=summary_pb2.Summary(value=values)))
    self._events.flush()

  def close(self) -> None:
    if self._active:
      self._jsonl.close()
      self._events.close()


class Throughput:
  """Tokens/s, steps/s and ETA between two log points; syncs only when asked."""

  def __init__(self, start_step: int, total_steps: int):
    self._total, self._step, self._time = total_steps, start_step, time.perf_counter()

  def measure(self, step: int, tokens: float) -> dict[str, float]:
    now = time.perf_counter()
    seconds = max(now - self._time, 1e-9)
    steps_per_s = (step - self._step) / seconds
    self._step, self._time = step, now
    return {'tokens_per_s': tokens / seconds, 'steps_per_s': steps_per_s,
            'eta_minutes': (self._total - step) / max(steps_per_s, 1e-9) / 60}


class TrainingDiverged(FloatingPointError):
  """The loss or gradient became NaN or infinite; the latest checkpoint is the last good one."""


class StoppedBySignal(Exception):
  """SIGTERM or SIGINT stopped training after a checkpoint was saved.

  Not a success: the command line exits with `exit_status` (128 + signal, as a shell reports
  a process killed by that signal), so schedulers, `until` loops and make see an unfinished
  run.
  """

  def __init__(self, signum: int, step: int):
    self.signum, self.step, self.exit_status = signum, step, 128 + signum
    super().__init__(f'stopped by {signal.Signals(signum).name} at step {step}, after saving '
                     f'checkpoint {step}; run the same command to resume')


def _check_finite(pending: list[Metrics], step: int, checkpointer: checkpoints.Checkpointer,
                  ) -> None:
  """Before anything is logged or saved: every pending step's loss and gradient norm are
  finite. A step can have a finite loss and a non-finite gradient (overflow in bf16/fp16);
  its update has already made the parameters NaN, so the gradient norm is checked too."""
  seen = np.asarray(jax.device_get([(m['loss'], m['grad_norm']) for m in pending]),
                    np.float64).reshape(-1, 2)
  finite = np.isfinite(seen)
  if finite.all():
    return
  first = int(np.argmin(finite.all(axis=1)))
  bad = step - len(pending) + 1 + first
  what = 'loss' if not finite[first, 0] else 'gradient (its norm; the loss was finite)'
  raise TrainingDiverged(
      f'The training {what} became non-finite at step {bad}. Nothing after it was saved: '
      f'the latest checkpoint (step {checkpointer.latest_step()}) is the last good one. '
      'Lower the learning rate (config.learning_rate_scale), lengthen config.warmup_steps '
      'or use float32 (config.model.dtype) before resuming.')


def _log_train(writer: MetricWriter, throughput: Throughput, step: int,
               pending: list[Metrics], lr_fn: Callable[[int], Any]) -> dict[str, float]:
  """Sums the steps since the last log (one device sync), then writes and prints them."""
  totals = jax.tree_util.tree_map(lambda *x: float(np.sum(x)), *jax.device_get(pending))
  metrics = summarize(totals)
  metrics['grad_norm'] = totals['grad_norm'] / len(pending)
  metrics['learning_rate'] = float(lr_fn(step - 1))  # the rate of the last update
  metrics.update(throughput.measure(step, totals['num_tokens'] + totals['num_source_tokens']))
  writer.write(step, metrics)
  logging.info('step %d  loss %.4f  ppl %.2f  lr %.2e  %.0f tokens/s  %.2f steps/s  ETA %.1f min',
               step, metrics['loss'], metrics['perplexity'], metrics['learning_rate'],
               metrics['tokens_per_s'], metrics['steps_per_s'], metrics['eta_minutes'])
  return metrics


class StopSignals:
  """SIGTERM and SIGINT ask the loop to save a checkpoint and exit; a second SIGINT exits now."""

  def __enter__(self) -> StopSignals:
    self.requested = None
    self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    return self

  def _handle(self, signum, frame) -> None:
    if self.requested == signal.SIGINT and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested = signum
    logging.warning('Received %s: saving a checkpoint, then exiting.', signal.Signals(signum).name)

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _is_due(step: int, every: int, last: int) -> bool:
  return (every > 0 and step % every == 0) or step == last


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainState:
  """Trains in `workdir`, which one trainer at a time may hold (see workdir.training_lock).

  Raises StoppedBySignal after saving, when SIGTERM or SIGINT stopped the run.
  """
  model_config = config_lib.validate(config)
  workdir_lib.check_local(workdir)
  with workdir_lib.training_lock(workdir):
    return _train(config, model_config, workdir)


def _train(config: ml_collections.ConfigDict, model_config: ModelConfig, workdir: str,
           ) -> TrainState:
  """Set up, restore, loop {step, log, evaluate, checkpoint}, finish."""
  if config.restart:
    workdir_lib.move_aside(workdir, list(workdir_lib.RUN_OUTPUTS), 'config.restart=True')
  mesh = make_mesh()
  datasets = _load_data(config, workdir, mesh)
  tx = optim.make_optimizer(config)
  state = create_train_state(Transformer(model_config), tx, config.seed, mesh)
  checkpointer = checkpoints.Checkpointer(workdir, keep=config.keep_checkpoints,
                                          every_steps=config.checkpoint_every_steps,
                                          every_minutes=config.checkpoint_every_minutes)
  state = _restore(config, model_config, workdir, checkpointer, state, datasets.train)
  train_fn, eval_fn = compile_steps(model_config, tx, config.label_smoothing, mesh,
                                    grad_accum_steps=config.grad_accum_steps)
  writer, lr_fn = MetricWriter(workdir), optim.learning_rate_schedule(config)
  step, last = int(state.step), config.num_train_steps
  throughput, pending, summary = Throughput(step, last), [], {}
  deadline = _deadline(config.train_minutes)
  logging.info('Training steps %d..%d on %d devices.', step + 1, last, mesh.size)
  signum = None
  with StopSignals() as stop:
    while step < last and signum is None:
      state, metrics = train_fn(state, shard_batch(next(datasets.train), mesh))
      step += 1
      signum, out_of_time, save_due = _agree_on_step(stop, deadline, checkpointer, step)
      if out_of_time:  # the time budget is spent: log, evaluate and save
        last = step  # this step as the last one
        logging.info('config.train_minutes=%g reached at step %d.', config.train_minutes, step)
      pending.append(metrics)
      if len(pending) > 1:  # stay one step ahead of the device, not hundreds: a signal
        jax.block_until_ready(pending[-2]['loss'])  # then stops the run within a step
      if _is_due(step, config.log_every_steps, last):
        _check_finite(pending, step, checkpointer)
        summary.update(_log_train(writer, throughput, step, pending, lr_fn))
        pending = []
      if datasets.dev is not None and _is_due(step, config.eval_every_steps, last):
        summary.update(_evaluate_dev(eval_fn, state.params, datasets.dev, mesh, writer, step))
      if datasets.dev is not None and config.eval_bleu_every_steps > 0 and _is_due(
          step, config.eval_bleu_every_steps, last):
        summary.update(_dev_bleu(config, model_config, state.params, datasets, mesh, writer, step))
      if save_due or step == last or signum is not None:
        _check_finite(pending, step, checkpointer)
        checkpointer.save(state, datasets.train.get_state())
  checkpointer.close()
  writer.close()
  _log_summary(summary, step, config.num_train_steps, checkpointer, signum)
  if signum is not None:
    raise StoppedBySignal(signum, step)
  return state


def _load_data(config: ml_collections.ConfigDict, workdir: str, mesh: Mesh) -> Any:
  """data.Datasets of this process; in a multi-process run, process 0 builds what goes to
  disk first, and every process must end with the same config, vocabulary and data."""
  from t2t_jax import data  # the pipeline imports TensorFlow lazily; keep `params` mode light
  datasets = data.get_datasets(config, workdir, num_devices=mesh.size,
                               process_index=jax.process_index(),
                               process_count=jax.process_count(),
                               once=distributed.first_then_others,
                               grad_accum_steps=config.grad_accum_steps)
  distributed.check_same({
      'config': json.dumps(workdir_lib.config_dict(config), sort_keys=True),
      'vocabulary': getattr(datasets.tokenizer, 'fingerprint', ''),
      'data': str(datasets.train.get_state().get('fingerprint', ''))})
  return datasets


def _agree_on_step(stop: StopSignals, deadline: float, checkpointer: checkpoints.Checkpointer,
                   step: int) -> tuple[int | None, bool, bool]:
  """(signal to stop on, time budget spent, periodic save due) after `step`, the same on
  every host: a signal or clock that reaches one host at step s stops all of them at s,
  so no host saves while another waits in the next step's psum. One small collective a
  step in a multi-process run; nothing in a single process."""
  local = np.array([stop.requested or 0, time.monotonic() >= deadline,
                    checkpointer.is_due(step)], np.int64)
  signum, out_of_time, save_due = (int(x) for x in distributed.agree(local))
  return signum or None, bool(out_of_time), bool(save_due)


def _deadline(minutes: float) -> float:
  """time.monotonic() at which a run with a budget of `minutes` (0: none) stops."""
  return time.monotonic() + 60 * minutes if minutes > 0 else math.inf


def _restore(config: ml_collections.ConfigDict, model_config: ModelConfig, workdir: str,
             checkpointer: checkpoints.Checkpointer, state: TrainState, train_iter: Any,
             ) -> TrainState:
  """The newest checkpoint (or config.restore_step's), else the fresh state of a new run.

  Never a silent fresh start: a checkpoint of another model is an error naming the
  parameter and the config keys behind it, and unreadable ones are an error unless an
  older one can be read (Checkpointer.restore).
  """
  # Hosts that see different checkpoints (a workdir that is not shared) would restore
  # different states, or wait forever in orbax's barriers: stop them here, clearly.
  distributed.check_same({'checkpoints': f'{checkpointer.steps()} {checkpointer.set_aside()}'})
  resuming = bool(checkpointer.steps() or checkpointer.set_aside())
  differences = workdir_lib.compare_config(workdir, config) if resuming else {}
  try:
    restored = checkpointer.restore(state, step=config.restore_step)
  except checkpoints.CheckpointMismatch as e:
    raise ValueError(
        f'{checkpoints.mismatch_message(e, model_config, differences)} Train with the config '
        'the run was started with, use another --workdir, or set --config.restart=True to '
        'train this one from step 0 (its checkpoints are moved aside).') from None
  if restored is None or workdir_lib.load_config(workdir) is None:
    workdir_lib.save_config(workdir, config)
  if restored is None:
    return state
  state, data_state = restored
  train_iter.set_state(data_state)
  step = int(state.step)
  newer = [s for s in checkpointer.steps() if s > step]
  averaged_newer = [s for s in checkpoints.checkpoint_steps(workdir, checkpoints.AVERAGED)
                    if s > step]
  if newer or averaged_newer:  # orbax would refuse to save below them; keep them elsewhere
    workdir_lib.move_aside(workdir, [f'{checkpoints.CHECKPOINTS}/{s}' for s in newer] +
                           [f'{checkpoints.AVERAGED}/{s}' for s in averaged_newer],
                           f'config.restore_step={step}')
    checkpointer.reload()
  logging.info('Resuming at step %d.', step)
  return state


def _evaluate_dev(eval_fn: Callable, params: Any, dev: Any, mesh: Mesh, writer: MetricWriter,
                  step: int) -> dict[str, float]:
  metrics = evaluate(eval_fn, params, dev.batches(), mesh)
  writer.write(step, metrics, prefix='dev_')
  logging.info('step %d  dev loss %.4f  dev ppl %.2f  dev accuracy %.3f', step, metrics['loss'],
               metrics['perplexity'], metrics['accuracy'])
  return {f'dev_{k}': v for k, v in metrics.items()}


def _dev_bleu(config: ml_collections.ConfigDict, model_config: ModelConfig, params: Any,
              datasets: Any, mesh: Mesh, writer: MetricWriter, step: int) -> dict[str, float]:
  """Beam-search the dev set with the current parameters; sacreBLEU as `dev_bleu`."""
  from t2t_jax import bleu, evaluate  # decoding sits below training in the data flow
  decoder = evaluate.make_sharded_decoder(model_config, config, mesh)
  hypotheses = evaluate.translate(decoder, params, datasets.dev.sources, datasets.tokenizer,
                                  config, mesh, max_input_length=config.max_decode_input_length)
  scores = bleu.bleu_scores(hypotheses, datasets.dev.references, target_lang=config.target_lang)
  metrics = {'bleu': scores['sacrebleu'], 'tok_bleu': scores['tok_bleu']}
  writer.write(step, metrics, prefix='dev_')
  logging.info('step %d  dev sacreBLEU %.2f  tokenized BLEU %.2f', step, scores['sacrebleu'],
               scores['tok_bleu'])
  return {'dev_bleu': scores['sacrebleu']}


def _log_summary(summary: dict[str, float], step: int, last: int,
                 checkpointer: checkpoints.Checkpointer, signum: int | None) -> None:
  how = (f'stopped by {signal.Signals(signum).name} at step {step}' if signum is not None
         else f'finished {step} steps')
  shown = ', '.join(f'{k} {v:.4g}' for k, v in summary.items()
                    if k in ('loss', 'perplexity', 'dev_loss', 'dev_perplexity', 'dev_accuracy',
                             'dev_bleu'))
  logging.info('Training %s (of %d); %s; latest checkpoint: %s/%s', how, last, shown or 'no metrics',
               checkpointer.directory, checkpointer.latest_step())
