"""Compiling ahead (t2t_jax/platform/ahead.py): the shapes the plan promises are the shapes the
batches have, and a run compiles its steps in background threads, not on the step path,
with the same results as compiling each shape when met."""
import json
import logging
import os
import re
import time

import jax
import numpy as np
import pytest

from helpers import CompileLog, make_config, tiny_config, tiny_step_config
from t2t_jax.data import pipeline, synthetic
from t2t_jax.decoding import batch_plan
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.modes import train as trainer
from t2t_jax.platform import ahead, progress
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step


def files_config(tmp_path, **overrides):
  config = make_config(tmp_path, **{'bucket_band': 0, 'bucket_growth': 1.25,
                                    'checkpoint_every_minutes': 0.0,
                                    'compilation_cache_dir': '', **overrides})
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4, dropout_rate=0.0)
  return config


def global_shape(batch):
  return (batch['inputs'].shape[0], batch['inputs'].shape[1], batch['targets'].shape[1])


@pytest.mark.parametrize('num_devices,grad_accum_steps', [(1, 1), (8, 2)])
def test_batch_shapes_are_those_of_the_batches_to_come(tmp_path, num_devices, grad_accum_steps):
  """From a position mid-epoch: the distinct shapes of the rest of the epoch and of the
  next one, in the order they first come; the dev set's likewise."""
  config = files_config(tmp_path)
  datasets = pipeline.get_datasets(config, str(tmp_path / 'work'), num_devices=num_devices,
                                   grad_accum_steps=grad_accum_steps)
  batches = datasets.train
  epoch_length = batches.plan(0).num_batches
  assert epoch_length > 4
  batches.set_state({**batches.get_state(), 'epoch': 0, 'batch': 3})
  promised = batches.batch_shapes()
  met = [global_shape(next(batches)) for _ in range(2 * epoch_length)]
  assert promised == list(dict.fromkeys(met))
  assert len(promised) > 1
  assert all(rows % (num_devices * grad_accum_steps) == 0 for rows, _, _ in promised)
  dev = datasets.dev
  assert dev.batch_shapes() == list(dict.fromkeys(global_shape(b) for b in dev.batches()))


def train_logging_compiles(config, workdir):
  handler = CompileLog()
  logger = logging.getLogger('jax')
  logger.addHandler(handler)
  # The global setting, not jax.log_compiles(): that one holds for this thread alone.
  jax.config.update('jax_log_compiles', True)
  try:
    trainer.train_and_evaluate(config, str(workdir))
  finally:
    jax.config.update('jax_log_compiles', False)
    logger.removeHandler(handler)
  return handler.records, [json.loads(line) for line in open(workdir / 'metrics.jsonl')]


def test_no_background_compilation_below_four_cores(monkeypatch):
  for cores, threads in ((1, 0), (2, 0), (4, 1), (16, 4), (96, 8)):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda _, n=cores: set(range(n)))
    assert ahead.default_threads() == threads


def test_compiling_ahead_shows_its_progress_and_when_it_is_ready(caplog, monkeypatch):
  """A line of how far it is once it takes long, with an ETA, and one when every planned
  shape is compiled, however each was compiled (in the background or by a call that needed
  it first); none while a shape is missing."""
  monkeypatch.setattr(progress, 'FIRST_LINE_S', 0.0)
  add = jax.jit(lambda x: x + 1)
  shapes = [(3,), (4,), (5,)]
  planned = lambda pool: ahead.Precompiled(  # noqa: E731
      add, shapes, lambda key: (jax.ShapeDtypeStruct(key, np.float32),),
      lambda args: args[0].shape, pool=pool, name='adder')
  caplog.set_level(logging.INFO)
  pool = ahead.make_pool(1)
  compiled = planned(pool)
  pool.shutdown(wait=True)
  lines = [r.getMessage() for r in caplog.records if 'adder' in r.getMessage()]
  assert lines[0] == 'Compiling the adder for 3 shapes ahead.'
  assert re.fullmatch(r'Compiled ahead \(adder\): 1/3 shapes \(33%\), .* shapes/s, ETA .*',
                      lines[1])
  assert re.fullmatch(r'Compiled ahead \(adder\): 3 shapes in 0:\d\d \(.* shapes/s\)',
                      lines[-1])
  np.testing.assert_array_equal(compiled(np.zeros(4, np.float32)), np.ones(4))
  caplog.clear()
  pool = ahead.make_pool(1)
  pool.submit(time.sleep, 1.0)  # the queue waits: the plan's shapes are all still queued
  compiled = planned(pool)
  compiled(np.zeros(5, np.float32))  # one compiled by the call that needs it
  pool.shutdown(wait=False, cancel_futures=True)  # the others dropped
  pool.shutdown(wait=True)
  assert compiled.compiled_on_call == 1
  assert not [r for r in caplog.records if re.search(r'adder\): \d+ shapes in', r.getMessage())]


@pytest.mark.slow
def test_precompiled_steps_compile_nothing_when_called():
  """Once the background threads are done, a step of a planned shape compiles nothing and
  gives jax.jit's result; a shape outside the plan is compiled when met, on the caller's
  thread, and counted as a wait."""
  config = tiny_step_config()
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  model_config = ModelConfig.from_config(config)
  tx = optim.make_optimizer(config)
  new_state = lambda: train_step.create_train_state(  # noqa: E731
      Transformer(model_config), tx, config.seed, mesh)
  jitted, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  batches = [synthetic.make_batch(rows, config.vocab_size, config.max_length, 0, i)
             for i, rows in enumerate((16, 8, 4))]
  pool = ahead.make_pool(2)
  step = ahead.steps(jitted, new_state(), [(16, 12, 12), (8, 12, 12)], mesh, pool=pool,
                     name='train step')
  pool.shutdown(wait=True)
  handler = CompileLog()
  logging.getLogger('jax').addHandler(handler)
  jax.config.update('jax_log_compiles', True)
  try:
    ours, reference = new_state(), new_state()
    for i, batch in enumerate(batches):
      batch = mesh_lib.shard_batch(batch, mesh)
      ours, ours_metrics = step(ours, batch)
      reference, reference_metrics = jitted(reference, batch)
      assert step.waits == (i == 2)  # only the unplanned shape waited
      compiled_here = [t for t, n in handler.records if 'train_step' in n]
      # (jax.jit finds the executables compiled ahead in its own cache: it compiles none)
      assert compiled_here == [] if i < 2 else compiled_here[:1] == ['MainThread']
  finally:
    jax.config.update('jax_log_compiles', False)
    logging.getLogger('jax').removeHandler(handler)
  assert step.blocked_s > 0
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(ours.params),
                         jax.device_get(reference.params))
  np.testing.assert_array_equal(ours_metrics['loss'], reference_metrics['loss'])


@pytest.mark.slow
def test_precompiled_searches_compile_nothing_and_decode_the_same():
  """Dev BLEU's beam search compiled ahead for translate_ids's batch shapes: decoding then
  compiles nothing and gives jax.jit's ids and scores."""
  config = tiny_step_config()
  config.decode_tokens_per_batch = 64  # batches of a few rows, not the demo's hundreds
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  model_config = ModelConfig.from_config(config)
  params = train_step.create_train_state(Transformer(model_config), optim.make_optimizer(config),
                                         config.seed, mesh).params
  inputs = [[5, 6, 7, 2], [5, 6, 2], [4] * 7 + [2], [9] * 11 + [2]]
  shapes = batch_plan.batch_shapes(inputs, config, mesh.size)
  assert len(shapes) > 1
  jitted = batch_plan.make_sharded_decoder(model_config, config, mesh)
  pool = ahead.make_pool(2)
  search = ahead.searches(jitted, params, shapes, mesh, pool=pool, name='beam search')
  pool.shutdown(wait=True)
  handler = CompileLog()
  logging.getLogger('jax').addHandler(handler)
  jax.config.update('jax_log_compiles', True)
  try:
    ours = batch_plan.translate_ids(search, params, inputs, config, mesh, show_progress=False)
    assert [n for _, n in handler.records if 'search' in n] == []
  finally:
    jax.config.update('jax_log_compiles', False)
    logging.getLogger('jax').removeHandler(handler)
  assert search.waits == 0
  reference = batch_plan.translate_ids(jitted, params, inputs, config, mesh, show_progress=False)
  for got, want in zip(ours, reference, strict=True):
    for a, b in zip(got, want, strict=True):
      np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_run_compiles_its_steps_ahead_and_trains_the_same(tmp_path, monkeypatch):
  """With config.compile_ahead, the train and eval steps are compiled on the background
  threads (a shape the loop needs before its turn is compiled on the loop's thread), and
  the metrics are those of a run that compiles each shape when it meets it."""
  monkeypatch.setattr(ahead, 'default_threads', lambda: 1)  # as on a 4-core machine
  # Coarse buckets: 5 train and 3 dev shapes to compile per run, not 8 and 7.
  steps = dict(num_train_steps=6, log_every_steps=1, eval_every_steps=3, bucket_growth=2.0)
  ahead_run, ahead_metrics = train_logging_compiles(
      files_config(tmp_path, compile_ahead=True, **steps), tmp_path / 'ahead')
  met_run, met_metrics = train_logging_compiles(
      files_config(tmp_path, compile_ahead=False, **steps), tmp_path / 'met')
  steps_of = lambda run, where: [n for thread, n in run if where(thread)  # noqa: E731
                                 and ('train_step' in n or 'eval_step' in n)]
  background = steps_of(ahead_run, lambda t: t.startswith('compile_ahead'))
  assert any('train_step' in n for n in background)
  assert steps_of(met_run, lambda t: t == 'MainThread')  # without it: on the loop's thread
  strip = lambda records: [{k: v for k, v in r.items() if not k.endswith('_s')  # noqa: E731
                            and k != 'eta_minutes'} for r in records]
  assert strip(ahead_metrics) == strip(met_metrics)


@pytest.mark.slow
def test_dev_bleus_search_is_built_once_and_compiled_ahead(tmp_path, monkeypatch):
  """Dev BLEU's beam search, at two evaluations: compiled once for each shape of the dev
  set's decoding batches, not again at the second evaluation. (Which thread compiles each
  depends on timing here; test_precompiled_searches_compile_nothing_and_decode_the_same
  shows the background compilations.)"""
  monkeypatch.setattr(ahead, 'default_threads', lambda: 1)
  config = tiny_config()
  config.update(num_train_steps=4, eval_every_steps=2, eval_bleu_every_steps=2,
                compile_ahead=True, compilation_cache_dir='')
  run, metrics = train_logging_compiles(config, tmp_path / 'run')
  datasets = pipeline.get_datasets(config, str(tmp_path / 'run'), num_devices=1)
  _, inputs = batch_plan.encode_inputs(datasets.dev.sources, datasets.tokenizer, 10**6)
  shapes = set(batch_plan.batch_shapes(inputs, config, 1))
  assert len([n for _, n in run if 'search' in n]) == len(shapes) > 1
  assert [m['step'] for m in metrics if 'dev_bleu' in m] == [2, 4]
