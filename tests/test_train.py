"""The data-parallel train step: 8 devices equal 1, the loss falls, the loop writes metrics."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import demo
from t2t_jax import config_lib, losses, optim, synthetic, train
from t2t_jax.model import Transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config():
  config = demo.get_config()
  config.dataset = 'synthetic'
  config.model.update(num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout_rate=0.0)
  config.vocab_size, config.max_length, config.tokens_per_batch = 40, 12, 16 * 12
  config.warmup_steps = 10
  return config


def run_steps(config, devices, batches):
  mesh = train.make_mesh(devices)
  model_config = config_lib.validate(config)
  tx = optim.make_optimizer(config)
  state = train.create_train_state(Transformer(model_config), tx, config.seed, mesh)
  train_fn, _ = train.compile_steps(model_config, tx, config.label_smoothing, mesh)
  for batch in batches:
    state, metrics = train_fn(state, train.shard_batch(batch, mesh))
  return jax.device_get(state.params), jax.device_get(metrics)


def test_eight_devices_equal_one():
  """One step on the same global batch and seed, dropout off: the same parameters to 1e-5,
  although the devices hold different numbers of real tokens (the gradient is a global
  per-token mean)."""
  assert jax.device_count() == 8, 'tests/conftest.py asks for 8 CPU devices'
  config = tiny_config()
  batches = [synthetic.make_batch(16, config.vocab_size, config.max_length, 0, i)
             for i in range(1)]
  per_device_tokens = (batches[0]['targets'] != 0).reshape(8, -1).sum(1)
  assert len(set(per_device_tokens)) > 1  # uneven split: the normalisation matters
  params_1, metrics_1 = run_steps(config, jax.devices()[:1], batches)
  params_8, metrics_8 = run_steps(config, jax.devices(), batches)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                         params_1, params_8)
  np.testing.assert_allclose(metrics_1['loss'], metrics_8['loss'], rtol=1e-5)
  # Adam hides a wrong gradient scale; the norm doesn't. Reference: plain jax.grad of the
  # per-token mean loss over the whole batch, with no mesh at all.
  model_config = config_lib.validate(config)
  params = train.create_train_state(Transformer(model_config), optim.make_optimizer(config),
                                    config.seed, train.make_mesh(jax.devices()[:1])).params

  def mean_loss(p):
    logits = Transformer(model_config).apply({'params': p}, batches[0]['inputs'],
                                             batches[0]['targets'], rngs={'dropout': jax.random.PRNGKey(0)})
    sums = losses.cross_entropy_sums(logits, batches[0]['targets'], label_smoothing=0.1)
    return sums.loss / sums.num_tokens
  reference_norm = np.sqrt(sum(np.sum(np.square(g)) for g in
                               jax.tree_util.tree_leaves(jax.grad(mean_loss)(params))))
  np.testing.assert_allclose(metrics_1['grad_norm'], reference_norm, rtol=1e-4)
  np.testing.assert_allclose(metrics_8['grad_norm'], reference_norm, rtol=1e-4)
  assert metrics_1['num_tokens'] == metrics_8['num_tokens'] == (batches[-1]['targets'] != 0).sum()


def test_loss_falls_on_the_synthetic_task():
  config = tiny_config()
  config.model.dropout_rate = 0.1
  mesh = train.make_mesh(jax.devices()[:2])
  model_config = config_lib.validate(config)
  tx = optim.make_optimizer(config)
  state = train.create_train_state(Transformer(model_config), tx, 0, mesh)
  train_fn, eval_fn = train.compile_steps(model_config, tx, config.label_smoothing, mesh)
  it = synthetic.SyntheticIterator(config, num_devices=2, process_index=0, process_count=1)
  dev = synthetic.make_batch(16, config.vocab_size, config.max_length, 0, 10**6)
  before = train.evaluate(eval_fn, state.params, [dev], mesh)
  for _ in range(150):
    state, _ = train_fn(state, train.shard_batch(next(it), mesh))
  after = train.evaluate(eval_fn, state.params, [dev], mesh)
  assert int(state.step) == 150
  assert after['loss'] < before['loss'] - 0.5, (before, after)
  assert after['accuracy'] > 3 * before['accuracy'], (before, after)
  np.testing.assert_allclose(before['perplexity'], np.exp(before['nll']), rtol=1e-5)


def test_dropout_rng_differs_per_step_and_device():
  """fold_in(rng, step) then fold_in(device): two steps on the same batch differ."""
  config = tiny_config()
  config.model.dropout_rate = 0.5
  batch = synthetic.make_batch(16, config.vocab_size, config.max_length, 0, 0)
  mesh = train.make_mesh(jax.devices()[:1])
  model_config = config_lib.validate(config)
  tx = optim.make_optimizer(config)
  state = train.create_train_state(Transformer(model_config), tx, 0, mesh)
  train_fn, _ = train.compile_steps(model_config, tx, config.label_smoothing, mesh)
  state, m1 = train_fn(state, train.shard_batch(batch, mesh))
  state, m2 = train_fn(state, train.shard_batch(batch, mesh))
  assert float(m1['loss']) != float(m2['loss'])


def run_main(*args, env_extra=None):
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=2',
             **(env_extra or {}))
  return subprocess.run([sys.executable, '-m', 't2t_jax.main', *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600)


def test_params_mode_prints_the_exact_count():
  result = run_main('--config=experiments/table3.py:C_N2', '--mode=params')
  assert result.returncode == 0, result.stderr
  last = result.stdout.strip().splitlines()[-1]
  attention = 4 * 512 * 512
  ffn = 2 * 512 * 2048 + 2048 + 512
  expected = 37000 * 512 + 2 * (attention + ffn + 2 * 1024) + 2 * (2 * attention + ffn + 3 * 1024)
  assert last == f'params: {expected}'


def test_train_mode_writes_metrics(tmp_path):
  result = run_main('--config=experiments/demo.py', f'--workdir={tmp_path}',
                    '--config.dataset=synthetic', '--config.num_train_steps=20',
                    '--config.log_every_steps=10', '--config.eval_every_steps=20',
                    '--config.model.num_layers=1', '--config.model.d_model=32',
                    '--config.model.d_ff=64', '--config.vocab_size=40',
                    '--config.max_length=12', '--config.tokens_per_batch=192')
  assert result.returncode == 0, result.stderr[-3000:]
  records = [json.loads(line) for line in open(tmp_path / 'metrics.jsonl')]
  train_records = [r for r in records if 'loss' in r]
  assert [r['step'] for r in train_records] == [10, 20]
  for r in train_records:
    assert {'loss', 'learning_rate', 'tokens_per_s', 'perplexity'} <= set(r)
    assert r['tokens_per_s'] > 0 and np.isfinite(r['loss'])
  assert any('dev_loss' in r for r in records)
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  events = EventAccumulator(str(tmp_path / 'tensorboard'))
  events.Reload()
  assert [e.step for e in events.Scalars('loss')] == [10, 20]
  np.testing.assert_allclose([e.value for e in events.Scalars('loss')],
                             [r['loss'] for r in train_records], rtol=1e-6)
  assert 'dev_loss' in events.Tags()['scalars']


def test_unknown_override_fails_before_training(tmp_path):
  result = run_main('--config=experiments/demo.py', f'--workdir={tmp_path}',
                    '--config.dataset=synthetic', '--config.model.dropout_rate=-0.5')
  assert result.returncode != 0
  assert 'config.model.dropout_rate' in result.stderr


def test_time_budget_ends_the_run_like_its_last_step(tmp_path):
  """config.train_minutes: once spent, the current step is logged, evaluated and saved."""
  result = run_main('--config=experiments/demo.py', f'--workdir={tmp_path}',
                    '--config.dataset=synthetic', '--config.num_train_steps=1000',
                    '--config.train_minutes=1e-6', '--config.checkpoint_every_steps=0',
                    '--config.model.num_layers=1', '--config.model.d_model=32',
                    '--config.model.d_ff=64', '--config.vocab_size=40',
                    '--config.max_length=12', '--config.tokens_per_batch=192')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'config.train_minutes=1e-06 reached at step 1.' in result.stderr
  assert 'finished 1 steps (of 1000)' in result.stderr
  records = [json.loads(line) for line in open(tmp_path / 'metrics.jsonl')]
  assert [r['step'] for r in records if 'loss' in r] == [1]
  assert [r['step'] for r in records if 'dev_loss' in r] == [1]
  from t2t_jax import checkpoints
  assert checkpoints.Checkpointer(str(tmp_path), keep=5).latest_step() == 1


def test_auto_dtype_and_bfloat16_keeps_float32_state():
  """dtype 'auto': float32 on the CPU (these tests), bfloat16 on GPU/TPU. In bfloat16 the
  parameters and Adam moments stay float32, and the loss is float32's within bf16's
  precision (8 bits of mantissa)."""
  assert demo.get_config().model.dtype == 'auto'
  config = tiny_config()
  assert config_lib.validate(config).dtype == 'float32'
  assert config_lib.compute_dtype('gpu') == config_lib.compute_dtype('tpu') == 'bfloat16'
  assert config_lib.compute_dtype('cpu') == 'float32'
  batches = [synthetic.make_batch(16, config.vocab_size, config.max_length, 0, i)
             for i in range(2)]
  _, metrics_32 = run_steps(config, jax.devices()[:1], batches)
  config.model.dtype = 'bfloat16'
  mesh = train.make_mesh(jax.devices()[:1])
  model_config = config_lib.validate(config)
  tx = optim.make_optimizer(config)
  state = train.create_train_state(Transformer(model_config), tx, config.seed, mesh)
  train_fn, _ = train.compile_steps(model_config, tx, config.label_smoothing, mesh)
  for batch in batches:
    state, metrics_16 = train_fn(state, train.shard_batch(batch, mesh))
  floats = [x for x in jax.tree_util.tree_leaves((state.params, state.opt_state))
            if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
  assert floats and all(x.dtype == np.float32 for x in floats)
  assert metrics_16['loss'].dtype == np.float32
  np.testing.assert_allclose(metrics_16['loss'], metrics_32['loss'], rtol=2e-2)


def test_compilation_cache_serves_a_second_run(tmp_path):
  """The first run writes its compiled steps to config.compilation_cache_dir; a second one
  (a restart, or another run of the same shapes) loads them all and compiles nothing new."""
  cache = tmp_path / 'xla'
  tiny = ['--config=experiments/demo.py', '--config.dataset=synthetic',
          '--config.num_train_steps=2', '--config.model.num_layers=1',
          '--config.model.d_model=32', '--config.model.d_ff=64', '--config.vocab_size=40',
          '--config.max_length=12', '--config.tokens_per_batch=192']
  # Every compilation counts here, however quick: the tiny model compiles in under 1 s.
  env = {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0', 'JAX_LOG_COMPILES': '1'}
  first = run_main(*tiny, f'--workdir={tmp_path / "a"}',
                   f'--config.compilation_cache_dir={cache}', env_extra=env)
  assert first.returncode == 0, first.stderr[-3000:]
  entries = set(os.listdir(cache))
  assert entries
  second = run_main(*tiny, f'--workdir={tmp_path / "b"}',
                    f'--config.compilation_cache_dir={cache}', env_extra=env)
  assert second.returncode == 0, second.stderr[-3000:]
  assert set(os.listdir(cache)) == entries  # nothing new to compile
  assert second.stderr.count('Persistent compilation cache hit') >= 2  # train and eval step
  off = run_main(*tiny, f'--workdir={tmp_path / "c"}', '--config.compilation_cache_dir=',
                 env_extra=env)
  assert off.returncode == 0 and 'Persistent compilation cache hit' not in off.stderr
