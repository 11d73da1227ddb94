"""Train a model (§5.2), or resume the run in --workdir: needs --config.

The loop that drives every stage of a run: data (§5.1) -> the compiled train step
(train_step.py) -> logs and dev metrics -> checkpoints (checkpoints.py) -> dev BLEU with beam
search (batch_plan.py), until num_train_steps, config.train_minutes, early stopping on the dev
set (early_stopping.py), or SIGTERM/SIGINT (after a clean save).
"""
from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import Mesh

from t2t_jax.config import rules
from t2t_jax.data import batching, pipeline
from t2t_jax.decoding import batch_plan, bleu
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import ahead, distributed, errors
from t2t_jax.platform import metrics as metrics_lib
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.platform.mesh import make_mesh, shard_batch
from t2t_jax.platform.metrics import MetricWriter, Throughput
from t2t_jax.run import init_from, recorded, vocabulary
from t2t_jax.run import params as params_lib
from t2t_jax.training import checkpoints, early_stopping, optim, train_step
from t2t_jax.training.train_step import Metrics, TrainState


class TrainingDiverged(errors.UserError, FloatingPointError):
  """The loss or gradient became NaN or infinite; the latest checkpoint is the last good one."""


class StoppedBySignal(Exception):
  """SIGTERM or SIGINT stopped training after a checkpoint was saved: not a success, so the
  command line exits with `exit_status`, 128 + signal, as a shell reports a process killed by
  it (schedulers, `until` loops and make see an unfinished run)."""

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
  metrics = train_step.summarize(totals)
  metrics['grad_norm'] = totals['grad_norm'] / len(pending)
  metrics['learning_rate'] = float(lr_fn(step - 1))  # the rate of the last update
  metrics.update(throughput.measure(step, totals['num_tokens'] + totals['num_source_tokens']))
  writer.write(step, metrics)
  logging.info('step %d  loss %.4f  ppl %.2f  lr %.2e  %.0f tokens/s  %.2f steps/s  ETA %.1f min',
               step, metrics['loss'], metrics['perplexity'], metrics['learning_rate'],
               metrics['tokens_per_s'], metrics['steps_per_s'], metrics['eta_minutes'])
  return metrics


class StopSignals:
  """SIGTERM and SIGINT ask the loop to save a checkpoint and exit; a second SIGINT exits now.

  Beside orbax's preemption policy (Checkpointer.reached_preemption), not instead: that
  reads JAX's preemption sync point, which only a jax.distributed run has, and a one-process
  run, most of ours, would die at SIGTERM without its last steps."""

  def __enter__(self) -> StopSignals:
    self.requested = None
    signals = (signal.SIGTERM, signal.SIGINT)
    self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}
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


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  return train_and_evaluate(config, workdir)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> str:
  """Trains in `workdir`, which one trainer at a time may hold (workdir.training_lock), and
  returns the line that sums it up (steps, last metrics, latest checkpoint); raises
  StoppedBySignal after saving, when SIGTERM or SIGINT stopped the run."""
  rules.validate(config, 'train')
  model_config = ModelConfig.from_config(config)
  workdir_lib.check_local(workdir)
  with workdir_lib.training_lock(workdir):
    return _train(config, model_config, workdir)


def _train(config: ml_collections.ConfigDict, model_config: ModelConfig, workdir: str) -> str:
  """Set up, restore, loop {step, log, evaluate, checkpoint}, finish."""
  if config.restart:
    workdir_lib.move_aside(workdir, list(workdir_lib.RUN_OUTPUTS), 'config.restart=True')
  mesh = make_mesh()
  vocabulary.check_kept(config, workdir)
  if config.init_from and not checkpoints.checkpoint_steps(workdir):  # a fine-tuning's start
    init_from.check_source(config, config.init_from)
    distributed.first_then_others(
        't2t_jax_init_from_vocabulary',
        lambda: init_from.adopt_vocabulary(config, config.init_from, workdir))
  datasets = _load_data(config, workdir, mesh)
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, config.seed, mesh)
  with checkpoints.Checkpointer(workdir, keep=config.keep_checkpoints, keep_best=config.keep_best,
                                every_steps=config.checkpoint_every_steps,
                                every_minutes=config.checkpoint_every_minutes) as checkpointer:
    state, trained_s = _restore(config, model_config, workdir, checkpointer, state, datasets)
    workdir_lib.record_invocation(workdir, int(state.step))
    early, stopped = _early_stopping(config, workdir, int(state.step))
    if stopped is not None:  # a run that stopped early, resumed with the same settings
      return stopped
    train_fn, eval_fn = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh,
                                                 grad_accum_steps=config.grad_accum_steps)
    train_fn, eval_fn, search, pool = _compile_ahead(config, model_config, train_fn, eval_fn,
                                                     state, datasets, mesh)
    writer, lr_fn = MetricWriter(workdir), optim.learning_rate_schedule(config)
    step, last = int(state.step), config.num_train_steps
    throughput, pending, summary = Throughput(step, last), [], {}
    clock = TrainingClock(config.train_minutes, trained_s)
    if clock.spent_before() and step < last:  # a resumed run whose budget was already spent
      logging.info('config.train_minutes=%g already spent (%.1f minutes trained) at step %d.',
                   config.train_minutes, trained_s / 60, step)
      last = step
    logging.info('Training steps %d..%d on %d device%s.', step + 1, last, mesh.size,
                 's' if mesh.size > 1 else '')
    signum, stopped_early = None, None
    with StopSignals() as stop, ahead.cancelled_on_exit(pool):
      while step < last and signum is None:
        state, metrics = train_fn(state, shard_batch(next(datasets.train), mesh))
        step += 1
        signum, out_of_time, clock_due = _agree_on_step(stop, clock, checkpointer, step)
        if signum is None and checkpointer.reached_preemption(step):
          signum = signal.SIGTERM  # every process reached JAX's sync point at this step
        save_due = clock_due or checkpointer.should_save(step)
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
        evaluated = {}
        if datasets.dev is not None and _is_due(step, config.eval_every_steps, last):
          evaluated.update(_evaluate_dev(eval_fn, state.params, datasets.dev, mesh, writer, step))
        if search is not None and _is_due(step, config.eval_bleu_every_steps, last):
          evaluated.update(_dev_bleu(config, model_config, search, state.params, datasets, mesh,
                                     writer, step))
        summary.update(evaluated)
        if early is not None and early.observe(step, evaluated) and step < last:
          last, stopped_early = step, early.record(step, config.num_train_steps)
          logging.info('Stopping early at step %d: %s.', step, stopped_early['why'])
          if pending:  # this step's line, as at the last step
            _check_finite(pending, step, checkpointer)
            summary.update(_log_train(writer, throughput, step, pending, lr_fn))
            pending = []
        if save_due or step == last or signum is not None:
          _check_finite(pending, step, checkpointer)
          checkpointer.save(state, {**datasets.train.get_state(), TRAIN_SECONDS: clock.seconds(),
                                    vocabulary.VOCABULARY: vocabulary.fingerprint(
                                        datasets.tokenizer)},
                            metrics={k: evaluated[k] for k in ('dev_loss', 'dev_bleu')
                                     if k in evaluated})
    if stopped_early is not None:  # after the save: a record of a stop has its checkpoint
      writer.note(step, early_stopping.STOPPED, stopped_early)
  writer.close()
  compiled = [f for f in (train_fn, eval_fn, search) if f is not None]
  logging.info('Stepping waited %.1f s for compilations (%d times).',
               sum(f.blocked_s for f in compiled), sum(f.waits for f in compiled))
  line = _summary_line(summary, step, config.num_train_steps, checkpointer, signum,
                       stopped_early)
  if signum is not None:
    logging.info('%s', line)
    raise StoppedBySignal(signum, step)
  return line


def _compile_ahead(config: ml_collections.ConfigDict, model_config: ModelConfig,
                   train_fn: Callable, eval_fn: Callable, state: TrainState,
                   datasets: pipeline.Datasets, mesh: Mesh,
                   ) -> tuple[ahead.Precompiled, ahead.Precompiled, ahead.Precompiled | None, Any]:
  """The train step, the eval step and dev BLEU's beam search (None without dev BLEU) as
  ahead.Precompiled: with config.compile_ahead, every train shape the epoch plan holds, then
  every dev-loss shape, then every dev decoding batch's, compiled in background threads from
  now on; and the pool they compile on."""
  pool = ahead.make_pool(ahead.default_threads() if config.compile_ahead else 0)
  train_fn = ahead.steps(train_fn, state, datasets.train.batch_shapes(), mesh, pool=pool,
                         name='train step', packed=datasets.train.packed)
  dev_shapes = datasets.dev.batch_shapes() if datasets.dev is not None else []
  eval_fn = ahead.steps(eval_fn, state.params, dev_shapes, mesh, pool=pool, name='eval step',
                        packed=datasets.dev is not None and datasets.dev.packed)
  if datasets.dev is None or config.eval_bleu_every_steps <= 0:
    return train_fn, eval_fn, None, pool
  _, inputs = batch_plan.encode_inputs(datasets.dev.sources, datasets.tokenizer,
                                       batch_plan.max_input_length(model_config, config))
  search = ahead.searches(batch_plan.make_sharded_decoder(model_config, config, mesh,
                                                          vocabulary=datasets.tokenizer),
                          state.params, batch_plan.batch_shapes(inputs, config, mesh.size),
                          mesh, pool=pool, name='dev BLEU beam search')
  return train_fn, eval_fn, search, pool


def _load_data(config: ml_collections.ConfigDict, workdir: str, mesh: Mesh) -> pipeline.Datasets:
  """data.Datasets of this process; in a multi-process run, process 0 builds what goes to
  disk first, and every process must end with the same config, vocabulary and data."""
  datasets = pipeline.get_datasets(config, workdir, num_devices=mesh.size,
                                   process_index=jax.process_index(),
                                   process_count=jax.process_count(),
                                   once=distributed.first_then_others,
                                   grad_accum_steps=config.grad_accum_steps)
  distributed.check_same({
      'config': json.dumps(recorded.config_dict(config), sort_keys=True),
      'vocabulary': vocabulary.fingerprint(datasets.tokenizer),
      'data': str(datasets.train.get_state().get('fingerprint', ''))})
  return datasets


def _agree_on_step(stop: StopSignals, clock: TrainingClock,
                   checkpointer: checkpoints.Checkpointer, step: int,
                   ) -> tuple[int | None, bool, bool]:
  """(signal to stop on, time budget spent, a save due by the clock) after `step`, the same
  on every host: a signal or clock that reaches one host at step s stops (or saves) all of
  them at s, so no host saves while another waits in the next step's psum. One small
  collective a step in a multi-process run; nothing in a single process."""
  local = np.array([stop.requested or 0, clock.spent(), checkpointer.clock_due()], np.int64)
  signum, out_of_time, clock_due = (int(x) for x in distributed.agree(local))
  return signum or None, bool(out_of_time), bool(clock_due)


# The data/ item of a checkpoint also records the seconds trained up to it (and the
# vocabulary's fingerprint, vocabulary.VOCABULARY).
TRAIN_SECONDS = 'train_seconds'


class TrainingClock:
  """config.train_minutes counted over the whole run, not per invocation: a run resumed
  after a crash or preemption trains for what is left of its budget, as num_train_steps
  counts steps. The time is the training loop's (compiling the step included); the gaps
  between invocations do not count."""

  def __init__(self, minutes: float, trained_s: float):
    self._budget_s = 60 * minutes if minutes > 0 else math.inf
    self._trained_s = trained_s
    self._start = time.monotonic()

  def seconds(self) -> float:
    """Seconds trained so far, over every invocation."""
    return self._trained_s + time.monotonic() - self._start

  def spent(self) -> bool:
    return self.seconds() >= self._budget_s

  def spent_before(self) -> bool:
    """Spent by earlier invocations: read from the checkpoint, so the same on every host."""
    return self._trained_s >= self._budget_s


def _restore(config: ml_collections.ConfigDict, model_config: ModelConfig, workdir: str,
             checkpointer: checkpoints.Checkpointer, state: TrainState,
             datasets: pipeline.Datasets,
             ) -> tuple[TrainState, float]:
  """The newest checkpoint (or config.restore_step's) and the seconds trained up to it, else
  the fresh state of a new run and 0; never a silent fresh start (Checkpointer.restore), and
  a checkpoint of another model is an error naming the config keys behind it."""
  # Hosts that see different checkpoints (a workdir that is not shared) would restore
  # different states, or wait forever in orbax's barriers: stop them here, clearly.
  distributed.check_same({'checkpoints': f'{checkpointer.steps()} {checkpointer.set_aside()}'})
  resuming = bool(checkpointer.steps() or checkpointer.set_aside())
  differences = recorded.compare_config(workdir, config) if resuming else {}
  try:
    restored = checkpointer.restore(state, step=config.restore_step)
  except checkpoints.CheckpointMismatch as e:
    raise errors.UserError(
        f'{params_lib.mismatch_message(e, model_config, differences)} Train with the config '
        'the run was started with, use another --workdir, or set --config.restart=True to '
        'train this one from step 0 (its checkpoints are moved aside).') from None
  if restored is None or recorded.load_config(workdir) is None:
    recorded.save_config(workdir, config)
  if restored is None:
    if config.init_from:
      state = init_from.initial_params(state, config.init_from)
    return state, 0.0
  state, data_state = restored
  if config.init_from:  # not silently: the user may expect a fine-tuning start here
    logging.warning('config.init_from=%r is read only at a run\'s start; %s has checkpoints, so '
                    'this resumes them (another --workdir starts a new fine-tuning run).',
                    config.init_from, workdir)
  # A checkpoint of an older t2t_jax has no time recorded: its time budget starts afresh.
  trained_s = float(data_state.pop(TRAIN_SECONDS, 0.0))
  vocabulary.check_recorded(data_state, datasets.tokenizer, workdir)
  data_state.pop(vocabulary.VOCABULARY, None)
  try:
    datasets.train.set_state(data_state)
  except batching.PositionMismatch as e:
    raise errors.UserError(f'{e} {_ways_on(e, config, differences, workdir)}') from None
  step = int(state.step)
  newer = [f'{checkpoints.CHECKPOINTS}/{s}' for s in checkpointer.steps() if s > step]
  newer += [f'{checkpoints.AVERAGED}/{s}'
            for s in checkpoints.checkpoint_steps(workdir, checkpoints.AVERAGED) if s > step]
  if newer:  # orbax would refuse to save below them; keep them elsewhere
    workdir_lib.move_aside(workdir, newer, f'config.restore_step={step}')
    checkpointer.reload()
  logging.info('Resuming at step %d (%.1f minutes trained).', step, trained_s / 60)
  return state, trained_s


# The settings that place a saved input-pipeline position (TrainIterator's fingerprint).
DATA_PLAN_KEYS = ('dataset', 'tfds_name', 'train_split', 'train_files', 'vocab_size',
                  'max_length', 'tokens_per_batch', 'seed', 'bucket_growth', 'bucket_band',
                  'batching', 'pack_length', 'demo_num_train', 'demo_seed')


def _ways_on(error: batching.PositionMismatch, config: ml_collections.ConfigDict,
             differences: dict[str, tuple[Any, Any]], workdir: str) -> str:
  """What a run whose data position cannot be continued can do instead, in one sentence."""
  back = [f'--{key}={old}' for key, (old, _) in differences.items()
          if key.removeprefix('config.') in DATA_PLAN_KEYS]
  if error.batching and config.batching == 'auto':  # 'auto' resolves per platform
    back.append(f'--config.batching={error.batching}')
  settings = ' '.join(back) if back else f'as in {workdir}/{workdir_lib.CONFIG}'
  return (f'Resume with the settings it was started with ({settings}); or start a new run from '
          f'its parameters (--config.init_from={workdir} and another --workdir: new Adam '
          'moments and schedule); or train this one from step 0 (--config.restart=True, its '
          'checkpoints moved aside).')


def _evaluate_dev(eval_fn: Callable, params: Any, dev: Any, mesh: Mesh, writer: MetricWriter,
                  step: int) -> dict[str, float]:
  metrics = train_step.eval_metrics(eval_fn, params, dev.batches(), mesh)
  writer.write(step, metrics, prefix='dev_')
  logging.info('step %d  dev loss %.4f  dev ppl %.2f  dev accuracy %.3f', step, metrics['loss'],
               metrics['perplexity'], metrics['accuracy'])
  return {f'dev_{k}': v for k, v in metrics.items()}


def _dev_bleu(config: ml_collections.ConfigDict, model_config: ModelConfig, search: Callable,
              params: Any, datasets: Any, mesh: Mesh, writer: MetricWriter, step: int,
              ) -> dict[str, float]:
  """Beam-search the dev set with the current parameters; sacreBLEU as `dev_bleu`."""
  max_input_length = batch_plan.max_input_length(model_config, config)
  hypotheses = batch_plan.translate(search, params, datasets.dev.sources, datasets.tokenizer,
                                    config, mesh, max_input_length=max_input_length)
  scores = bleu.bleu_scores(hypotheses, datasets.dev.references, target_lang=config.target_lang)
  metrics = {'bleu': scores['sacrebleu'], 'tok_bleu': scores['tok_bleu']}
  writer.write(step, metrics, prefix='dev_')
  logging.info('step %d  dev sacreBLEU %.2f  tokenized BLEU %.2f', step, scores['sacrebleu'],
               scores['tok_bleu'])
  return {'dev_bleu': scores['sacrebleu']}


def _early_stopping(config: ml_collections.ConfigDict, workdir: str, step: int,
                    ) -> tuple[early_stopping.EarlyStopping | None, str | None]:
  """(config.early_stopping_patience's counter, from metrics.jsonl's evaluations up to `step`;
  None when off) and, for a run that stopped early at `step` and is resumed without a raised
  patience or step budget, the line that says so (else None)."""
  stops = {s: r for s, r in metrics_lib.recorded(workdir, early_stopping.STOPPED).items()
           if s == step and isinstance(r, dict)}
  patience, budget = config.early_stopping_patience, config.num_train_steps
  since = 0
  if stops:
    stop = stops[step]
    if not early_stopping.resumes_past(stop, patience, budget):
      return None, (f'Training stopped early at step {step} (of {budget}): {stop["why"]}; '
                    'nothing to do. To train on, raise --config.early_stopping_patience '
                    f'(now {patience}) or --config.num_train_steps.')
    if budget > int(stop['num_train_steps']) and patience <= int(stop['patience']):
      since = step  # a raised budget: the patience counts afresh from here
    logging.info('Training on past the early stop at step %d (%s).', step, stop['why'])
  if not patience:
    return None, None
  metric = config.early_stopping_metric
  history = {s: float(v) for s, v in metrics_lib.recorded(workdir, metric).items()
             if s <= step and isinstance(v, (int, float))}
  return early_stopping.EarlyStopping(metric, patience, history, since), None


def _summary_line(summary: dict[str, float], step: int, last: int,
                  checkpointer: checkpoints.Checkpointer, signum: int | None,
                  stopped_early: dict[str, Any] | None = None) -> str:
  how = (f'stopped by {signal.Signals(signum).name} at step {step}' if signum is not None
         else f'stopped early at step {step}' if stopped_early is not None
         else f'finished {step} steps')
  shown = ', '.join(f'{k} {v:.4g}' for k, v in summary.items()
                    if k in ('loss', 'perplexity', 'dev_loss', 'dev_perplexity', 'dev_accuracy',
                             'dev_bleu'))
  why = f': {stopped_early["why"]}' if stopped_early is not None else ''
  best = checkpointer.best_step()
  kept = f'; kept as the best: {checkpoints.CHECKPOINTS}/{best}' if best is not None else ''
  return (f'Training {how} (of {last}){why}; {shown or "no metrics"}; latest checkpoint: '
          f'{checkpointer.directory}/{checkpointer.latest_step()}{kept}')
