"""The data-parallel train step: 8 devices equal 1, the loss falls, the loop writes metrics."""
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import demo, wmt_ende_base
from helpers import (
  REORDERED_F32,
  TINY_CLI,
  make_config,
  run_process,
  tiny_step_config,
  trained_rtol,
)
from t2t_jax.config import rules
from t2t_jax.data import pipeline, synthetic
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import losses, optim, train_step


def run_steps(config, devices, batches, grad_accum_steps=1):
  mesh = mesh_lib.make_mesh(devices)
  model_config = ModelConfig.from_config(config)
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, config.seed, mesh)
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh,
                                         grad_accum_steps=grad_accum_steps)
  for batch in batches:
    state, metrics = train_fn(state, mesh_lib.shard_batch(batch, mesh))
  return jax.device_get(state.params), jax.device_get(metrics)


def assert_params_close(a, b):
  """Parameters from sums split over other devices or micro-batches: float32 rounding in
  another order. Initialized at magnitudes up to ~1, so the absolute floor is the relative
  tolerance."""
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(
      x, y, rtol=REORDERED_F32, atol=REORDERED_F32), a, b)


@pytest.mark.slow
def test_eight_devices_equal_one():
  """One step on the same global batch and seed, dropout off: the same parameters up to the
  rounding of sums split over devices, although the devices hold different numbers of real
  tokens (the gradient is a global per-token mean)."""
  assert jax.device_count() == 8, 'tests/conftest.py asks for 8 CPU devices'
  config = tiny_step_config()
  batches = [synthetic.make_batch(16, config.vocab_size, config.max_length, 0, i)
             for i in range(1)]
  per_device_tokens = (batches[0]['targets'] != 0).reshape(8, -1).sum(1)
  assert len(set(per_device_tokens)) > 1  # uneven split: the normalisation matters
  params_1, metrics_1 = run_steps(config, jax.devices()[:1], batches)
  params_8, metrics_8 = run_steps(config, jax.devices(), batches)
  assert_params_close(params_1, params_8)
  np.testing.assert_allclose(metrics_1['loss'], metrics_8['loss'], rtol=REORDERED_F32)
  # Adam hides a wrong gradient scale; the norm doesn't. Reference: plain jax.grad of the
  # per-token mean loss over the whole batch, with no mesh at all.
  model_config = ModelConfig.from_config(config)
  params = train_step.create_train_state(Transformer(model_config), optim.make_optimizer(config),
                                         config.seed, mesh_lib.make_mesh(jax.devices()[:1])).params

  def mean_loss(p):
    logits = Transformer(model_config).apply({'params': p}, batches[0]['inputs'],
                                             batches[0]['targets'],
                                             rngs={'dropout': jax.random.PRNGKey(0)})
    sums = losses.cross_entropy_sums(logits, batches[0]['targets'], label_smoothing=0.1)
    return sums.loss / sums.num_tokens
  reference_norm = np.sqrt(sum(np.sum(np.square(g)) for g in
                               jax.tree_util.tree_leaves(jax.grad(mean_loss)(params))))
  np.testing.assert_allclose(metrics_1['grad_norm'], reference_norm, rtol=1e-4)
  np.testing.assert_allclose(metrics_8['grad_norm'], reference_norm, rtol=1e-4)
  assert metrics_1['num_tokens'] == metrics_8['num_tokens'] == (batches[-1]['targets'] != 0).sum()


@pytest.mark.slow
@pytest.mark.parametrize('num_devices,grad_accum_steps', [(1, 2), (1, 4), (8, 2), (2, 4)])
def test_accumulated_micro_batches_make_the_full_batch_update(num_devices, grad_accum_steps):
  """config.grad_accum_steps = k: one Adam update from the summed gradients of k
  micro-batches, divided by the whole batch's token count, equals the update of the whole
  batch at once (dropout off: each micro-batch draws its own masks); so do the metrics."""
  config = tiny_step_config()
  batches = [synthetic.make_batch(16, config.vocab_size, config.max_length, 0, 0)]
  params_1, metrics_1 = run_steps(config, jax.devices()[:1], batches)
  params_k, metrics_k = run_steps(config, jax.devices()[:num_devices], batches,
                                  grad_accum_steps=grad_accum_steps)
  assert_params_close(params_1, params_k)
  assert set(metrics_k) == set(metrics_1)
  for key in metrics_1:
    np.testing.assert_allclose(metrics_k[key], metrics_1[key], rtol=REORDERED_F32, err_msg=key)


@pytest.mark.parametrize('num_devices,process_count,grad_accum_steps',
                         [(1, 1, 1), (8, 1, 1), (8, 2, 1), (2, 2, 4)])
def test_synthetic_batches_are_the_same_on_any_topology(num_devices, process_count,
                                                        grad_accum_steps):
  """The synthetic task as the files plan: the global batches of 1 device, padded with
  all-PAD rows for the devices × micro-batches; each process its block; states move."""
  config = tiny_step_config()
  config.tokens_per_batch = 13 * config.max_length  # 13 rows: no device count divides them
  topology = dict(num_devices=num_devices, process_count=process_count,
                  grad_accum_steps=grad_accum_steps)
  reference = synthetic.SyntheticIterator(config, num_devices=1, process_index=0,
                                          process_count=1)
  parts = [synthetic.SyntheticIterator(config, process_index=p, **topology)
           for p in range(process_count)]
  multiple = num_devices * grad_accum_steps
  for _ in range(3):
    want, local = next(reference), [next(part) for part in parts]
    for key in ('inputs', 'targets'):
      got = np.concatenate([block[key] for block in local])
      assert len({block[key].shape for block in local}) == 1
      assert len(got) == -(-13 // multiple) * multiple
      np.testing.assert_array_equal(got[:13], want[key])
      assert not got[13:].any()
  resumed = synthetic.SyntheticIterator(config, num_devices=1, process_index=0, process_count=1)
  resumed.set_state(parts[0].get_state())
  np.testing.assert_array_equal(next(resumed)['inputs'], next(reference)['inputs'])
  devs = [synthetic.eval_set(config, num_devices=num_devices, process_index=p,
                             process_count=process_count) for p in range(process_count)]
  dev = [next(d.batches()) for d in devs]
  index, inputs = (np.concatenate([b[key] for b in dev]) for key in ('index', 'inputs'))
  assert len(index) % num_devices == 0 and sorted(index[index >= 0]) == list(range(13))
  assert not inputs[index < 0].any()


@pytest.mark.slow
def test_each_micro_batch_draws_its_own_dropout():
  """Two identical micro-batches under dropout: different masks, so different loss sums,
  and the step's sums are theirs added up."""
  config = tiny_step_config()
  config.model.dropout_rate = 0.5
  model_config = ModelConfig.from_config(config)
  half = synthetic.make_batch(8, config.vocab_size, config.max_length, 0, 0)
  batch = {k: np.concatenate([v, v]) for k, v in half.items()}
  params = train_step.create_train_state(Transformer(model_config), optim.make_optimizer(config), 0,
                                         mesh_lib.make_mesh(jax.devices()[:1])).params
  rng, model = jax.random.PRNGKey(3), Transformer(model_config)
  accumulate = jax.jit(lambda p, b: train_step._accumulated_grads(p, b, rng, model, 0.1, 2))
  _, sums = accumulate(params, batch)
  each = [train_step.loss_sums(params, half, model, 0.1,
                                {'dropout': jax.random.fold_in(rng, i)})[0]
          for i in range(2)]
  assert float(each[0]) != float(each[1])
  np.testing.assert_allclose(sums.loss, each[0] + each[1], rtol=1e-5)


@pytest.mark.slow
def test_loss_falls_on_the_synthetic_task():
  config = tiny_step_config()
  config.model.dropout_rate = 0.1
  mesh = mesh_lib.make_mesh(jax.devices()[:2])
  model_config = ModelConfig.from_config(config)
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, 0, mesh)
  train_fn, eval_fn = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  it = synthetic.SyntheticIterator(config, num_devices=2, process_index=0, process_count=1)
  dev = synthetic.make_batch(16, config.vocab_size, config.max_length, 0, 10**6)
  before = train_step.eval_metrics(eval_fn, state.params, [dev], mesh)
  for _ in range(150):
    state, _ = train_fn(state, mesh_lib.shard_batch(next(it), mesh))
  after = train_step.eval_metrics(eval_fn, state.params, [dev], mesh)
  assert int(state.step) == 150
  assert after['loss'] < before['loss'] - 0.5, (before, after)
  assert after['accuracy'] > 3 * before['accuracy'], (before, after)
  np.testing.assert_allclose(before['perplexity'], np.exp(before['nll']), rtol=1e-5)


def test_dropout_rng_differs_per_step_and_device():
  """fold_in(rng, step) then fold_in(device): two steps on the same batch differ."""
  config = tiny_step_config()
  config.model.dropout_rate = 0.5
  batch = synthetic.make_batch(16, config.vocab_size, config.max_length, 0, 0)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  model_config = ModelConfig.from_config(config)
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, 0, mesh)
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  state, m1 = train_fn(state, mesh_lib.shard_batch(batch, mesh))
  state, m2 = train_fn(state, mesh_lib.shard_batch(batch, mesh))
  assert float(m1['loss']) != float(m2['loss'])


def tiny_files_config(tmp_path):
  """A tiny dataset=files corpus (tests/test_data.py's generator) and model: the real §5.1
  plan, whose batches have rows that 8 devices do not divide."""
  # 4 steps: their batches have 17, 17, 12 and 17 rows (two shapes to compile per run).
  config = make_config(tmp_path, bucket_band=0, bucket_growth=1.25, num_train_steps=4,
                       warmup_steps=10, log_every_steps=1, eval_every_steps=4,
                       checkpoint_every_minutes=0.0)
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4, dropout_rate=0.0)
  base = wmt_ende_base.get_config()
  flags = [f'--config.{k}={v}' for k, v in config.items() if k != 'model' and v != base[k]]
  flags += [f'--config.model.{k}={v}' for k, v in config.model.items() if v != base.model[k]]
  return config, ['--config=experiments/wmt_ende_base.py', *flags]


@pytest.mark.slow
@pytest.mark.e2e
def test_one_device_and_eight_with_micro_batches_train_alike(tmp_path):
  """Through the command line, dataset=files, dropout off: 1 device, and 8 devices with
  grad_accum_steps=2, see the same batches (padding rows aside) and log the same loss at
  every step, and the same dev loss (each alone, in one step: test_eight_devices_equal_one,
  test_accumulated_micro_batches_make_the_full_batch_update). A process's device count is
  set when it starts: a process a run."""
  config, flags = tiny_files_config(tmp_path)
  runs = {'1': (1, 1), '8x2': (8, 2)}  # devices, grad_accum_steps
  records = {}
  for name, (devices, k) in runs.items():
    workdir = tmp_path / name
    if name != '1':  # the first run's vocabulary: the same ids without training it again
      shutil.copytree(tmp_path / '1' / 'vocab', workdir / 'vocab')
    result = run_process(*flags, f'--workdir={workdir}', f'--config.grad_accum_steps={k}',
                         devices=devices)
    assert result.returncode == 0, result.stderr[-3000:]
    records[name] = [json.loads(line) for line in open(workdir / 'metrics.jsonl')]
  plan = pipeline.get_datasets(config, str(tmp_path / '1'), num_devices=1).train.plan(0)
  assert all(plan.shapes[:4, 0] % 8)  # rows that need padding rows on 8 devices
  for key in ('loss', 'dev_loss'):
    want = [(r['step'], r[key]) for r in records['1'] if key in r]
    assert [s for s, _ in want] == (list(range(1, 5)) if key == 'loss' else [4])
    got = [(r['step'], r[key]) for r in records['8x2'] if key in r]
    assert [s for s, _ in got] == [s for s, _ in want]
    for (step, value), (_, expected) in zip(got, want, strict=True):
      assert value == pytest.approx(expected, rel=trained_rtol(step)), (key, step)


def test_params_mode_prints_the_exact_count(cli):
  result = cli('--config=experiments/table3.py:C_N2', '--mode=params')
  assert result.returncode == 0, result.stderr
  last = result.stdout.strip().splitlines()[-1]
  attention = 4 * 512 * 512
  ffn = 2 * 512 * 2048 + 2048 + 512
  expected = 37000 * 512 + 2 * (attention + ffn + 2 * 1024) + 2 * (2 * attention + ffn + 3 * 1024)
  assert last == f'params: {expected}'


@pytest.mark.slow
def test_train_mode_writes_metrics(cli, tmp_path):
  result = cli(*TINY_CLI, f'--workdir={tmp_path}', '--config.num_train_steps=20',
               '--config.log_every_steps=10', '--config.eval_every_steps=20')
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


@pytest.mark.slow
def test_the_demos_log_shows_the_run_before_its_first_step(cli, tmp_path):
  """make demo's first command printed ~185 lines before its first step: a 90-line config
  dump, JAX's backend probing and cache resets. Now: the run's own lines, the config named
  in one, the batching in one; the command's last line states the result."""
  result = cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
               '--config.demo_num_train=1000', '--config.demo_num_eval=20',
               '--config.vocab_size=500', '--config.num_train_steps=1',
               '--config.model.num_layers=1', '--config.model.d_model=32',
               '--config.model.d_ff=64', '--config.compile_ahead=false')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stderr.splitlines()
  first_step = next(i for i, line in enumerate(lines) if '] step 1 ' in line)
  assert first_step <= 15, '\n'.join(lines[:first_step])
  assert all(re.search(r' (progress|tokenizer|id_cache|batching|recorded|train|xla)\.py:', line)
             for line in lines[:first_step]), '\n'.join(lines[:first_step])
  assert sum('Config: recorded in' in line for line in lines) == 1
  assert sum("train: §5.1's length buckets (batching 'buckets')" in line for line in lines) == 1
  assert result.stdout.startswith('Training finished 1 steps (of 1); loss ')


def test_unknown_override_fails_before_training(cli, tmp_path):
  result = cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
               '--config.dataset=synthetic', '--config.model.dropout_rate=-0.5')
  assert result.returncode != 0
  assert 'config.model.dropout_rate' in result.stderr


def test_time_budget_ends_the_run_like_its_last_step(cli, tmp_path):
  """config.train_minutes: once spent, the current step is logged, evaluated and saved."""
  result = cli(*TINY_CLI, f'--workdir={tmp_path}', '--config.num_train_steps=1000',
               '--config.train_minutes=1e-6', '--config.checkpoint_every_steps=0')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'config.train_minutes=1e-06 reached at step 1.' in result.stderr
  assert result.stdout.startswith('Training finished 1 steps (of 1000); ')
  records = [json.loads(line) for line in open(tmp_path / 'metrics.jsonl')]
  assert [r['step'] for r in records if 'loss' in r] == [1]
  assert [r['step'] for r in records if 'dev_loss' in r] == [1]
  from t2t_jax.training import checkpoints
  assert checkpoints.Checkpointer(str(tmp_path), keep=5).latest_step() == 1


@pytest.mark.slow
def test_time_budget_counts_over_resumes(tmp_path):
  """config.train_minutes is the run's, as num_train_steps is, not each invocation's: every
  checkpoint records the seconds trained, and a resumed run trains for what is left."""
  from t2t_jax.modes import train as trainer
  from t2t_jax.training import checkpoints
  config = tiny_step_config()
  config.update(num_train_steps=3, checkpoint_every_steps=1, checkpoint_every_minutes=0.0,
                log_every_steps=1, eval_every_steps=100, compilation_cache_dir='')
  workdir = str(tmp_path)
  trainer.train_and_evaluate(config, workdir)
  seconds = [checkpoints.read_data_state(workdir, step)[trainer.TRAIN_SECONDS]
             for step in (1, 2, 3)]
  assert 0 < seconds[0] < seconds[1] < seconds[2]
  # A budget those 3 steps already spent: the resumed run trains no further step.
  config.update(num_train_steps=10, train_minutes=seconds[2] / 60 / 2)
  trainer.train_and_evaluate(config, workdir)
  assert checkpoints.checkpoint_steps(workdir)[-1] == 3
  # Time left: it trains on, and the seconds keep adding up from where they were.
  config.update(num_train_steps=5, train_minutes=100.0)
  trainer.train_and_evaluate(config, workdir)
  assert checkpoints.checkpoint_steps(workdir)[-1] == 5
  assert checkpoints.read_data_state(workdir, 5)[trainer.TRAIN_SECONDS] > seconds[2]


def test_auto_dtype_and_bfloat16_keeps_float32_state():
  """dtype 'auto': float32 on the CPU (these tests), bfloat16 on GPU/TPU. In bfloat16 the
  parameters and Adam moments stay float32, and the loss is float32's within bf16's
  precision (8 bits of mantissa)."""
  assert demo.get_config().model.dtype == 'auto'
  config = tiny_step_config()
  assert ModelConfig.from_config(config).dtype == 'float32'
  assert rules.compute_dtype('gpu') == rules.compute_dtype('tpu') == 'bfloat16'
  assert rules.compute_dtype('cpu') == 'float32'
  batches = [synthetic.make_batch(16, config.vocab_size, config.max_length, 0, i)
             for i in range(2)]
  _, metrics_32 = run_steps(config, jax.devices()[:1], batches)
  config.model.dtype = 'bfloat16'
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  model_config = ModelConfig.from_config(config)
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, config.seed, mesh)
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  for batch in batches:
    state, metrics_16 = train_fn(state, mesh_lib.shard_batch(batch, mesh))
  floats = [x for x in jax.tree_util.tree_leaves((state.params, state.opt_state))
            if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
  assert floats and all(x.dtype == np.float32 for x in floats)
  assert metrics_16['loss'].dtype == np.float32
  np.testing.assert_allclose(metrics_16['loss'], metrics_32['loss'], rtol=2e-2)


@pytest.mark.slow
@pytest.mark.e2e
def test_compilation_cache_serves_a_second_run(tmp_path):
  """The first run writes its compiled steps to config.compilation_cache_dir; a second one
  (a restart, or another run of the same shapes) loads them all and compiles nothing new.
  JAX opens its cache once a process: a process a run."""
  cache = tmp_path / 'xla'
  tiny = ['--config=experiments/demo.py', '--config.dataset=synthetic',
          '--config.num_train_steps=2', '--config.model.num_layers=1',
          '--config.model.d_model=32', '--config.model.d_ff=64', '--config.vocab_size=40',
          '--config.max_length=12', '--config.tokens_per_batch=192']
  # Every compilation counts here, however quick: the tiny model compiles in under 1 s.
  env = {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0', 'JAX_LOG_COMPILES': '1'}
  first = run_process(*tiny, f'--workdir={tmp_path / "a"}',
                      f'--config.compilation_cache_dir={cache}', env=env)
  assert first.returncode == 0, first.stderr[-3000:]
  entries = set(os.listdir(cache))
  assert entries
  second = run_process(*tiny, f'--workdir={tmp_path / "b"}',
                       f'--config.compilation_cache_dir={cache}', env=env)
  assert second.returncode == 0, second.stderr[-3000:]
  assert set(os.listdir(cache)) == entries  # nothing new to compile
  assert second.stderr.count('Persistent compilation cache hit') >= 2  # train and eval step
  off = run_process(*tiny, f'--workdir={tmp_path / "c"}', '--config.compilation_cache_dir=',
                    env=env)
  assert off.returncode == 0 and 'Persistent compilation cache hit' not in off.stderr


def test_cpu_flags_are_added_and_an_explicit_setting_wins(monkeypatch):
  from t2t_jax.platform import xla
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8 '
                     '--xla_cpu_enable_concurrency_optimized_scheduler=true')
  xla.configure_cpu()
  flags = os.environ['XLA_FLAGS'].split()
  assert flags == ['--xla_force_host_platform_device_count=8',
                   '--xla_cpu_enable_concurrency_optimized_scheduler=true',
                   '--xla_cpu_experimental_ynn_fusion_type=-reduce',
                   '--xla_cpu_copy_insertion_use_region_analysis=true']
  xla.configure_cpu()  # idempotent
  assert os.environ['XLA_FLAGS'].split() == flags
  xla.configure_cpu(decoding=True)  # the user's device count still wins
  assert os.environ['XLA_FLAGS'].split() == flags


def test_decoding_processes_get_a_cpu_device_per_core(monkeypatch):
  """configure_cpu(decoding=True), for --mode=translate and eval: one CPU device per core this
  process may use, at most MAX_DECODING_DEVICES; training processes get no device count."""
  from t2t_jax.platform import xla
  cores = len(os.sched_getaffinity(0))
  assert xla.decoding_devices() == max(1, min(cores, xla.MAX_DECODING_DEVICES))
  monkeypatch.setenv('XLA_FLAGS', '')
  xla.configure_cpu()
  assert xla.DEVICE_COUNT_FLAG not in os.environ['XLA_FLAGS']
  monkeypatch.setenv('XLA_FLAGS', '')
  xla.configure_cpu(decoding=True)
  assert f'{xla.DEVICE_COUNT_FLAG}={xla.decoding_devices()}' in os.environ['XLA_FLAGS'].split()
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(64)))
  assert xla.decoding_devices() == xla.MAX_DECODING_DEVICES


def test_train_step_compiles_with_ynnpack_reductions_unless_the_user_chose(monkeypatch):
  """xla.step_compiler_options: YNNPACK's reductions for the train step on a CPU, which
  compile_steps passes to its jit; none where XLA_FLAGS names the fusion types itself. The
  options change what XLA emits: fewer of its own reduce-windows."""
  from t2t_jax.platform import xla
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=-reduce')
  options = xla.step_compiler_options()
  assert 'LIBRARY_FUSION_TYPE_REDUCE' in options['xla_cpu_experimental_ynn_fusion_type']
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=+reduce')
  assert xla.step_compiler_options() == {}
  column_sum = lambda x: jnp.sum(jnp.tanh(x), axis=0)  # noqa: E731
  x = jnp.ones((256, 64))
  plain = jax.jit(column_sum).lower(x).compile().as_text()
  with_options = jax.jit(column_sum, compiler_options=options).lower(x).compile().as_text()
  assert plain.count('reduce-window') > with_options.count('reduce-window')
