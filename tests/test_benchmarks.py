"""benchmarks/ at tiny sizes: each peer against t2t_jax, and each script's JSON lines.

The peers are checked where they can be without their originals at hand: the PyTorch decoder
(benchmarks/peers/torch_decode.py) is the paper's model, so with t2t_jax's weights it must give
t2t_jax's logits and beam and greedy outputs; flax's WMT step (benchmarks/peers/flax_wmt.py)
is another model, so its parameter count is checked against ours (the same but for its two
final LayerNorms) and its loss and metrics against t2t_jax's losses on the same logits.

The scripts that use JAX run in this process on a tiny model (common.get_config patched to
helpers.tiny_config for every config name) and print what they print at full size: the keys
of each JSON line are checked. Those that need no model run as programs on a generated
corpus. benchmarks/accelerator.py has its own test (test_accelerator_benchmark.py), and
compilation.py runs only its shape statistics here: its compile children load the real
configs, seconds each (run it by hand on $T2T_WMT_SAMPLE).
"""
import gzip
import importlib
import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from helpers import ROOT
from t2t_jax.decoding import decode
from t2t_jax.model.transformer import ModelConfig, Transformer, count_params
from t2t_jax.training import losses

BENCHMARKS = os.path.join(ROOT, 'benchmarks')
PEERS = os.path.join(BENCHMARKS, 'peers')

# The keys of each JSON line, as the scripts print them at full size.
TRAIN_STEP = {'benchmark', 'config', 'params', 'batch', 'step_seconds', 'tokens_per_s',
              'target_tokens_per_s', 'gflop_per_step', 'gflop_per_s', 'round_step_seconds',
              'compile_seconds', 'devices', 'load_average_1min', 'backend', 'cpu_count',
              'glibc_tunables'}
DECODE = {'benchmark', 'config', 'cache', 'sentences', 'input_tokens', 'beam_size', 'devices',
          'steps', 'early_stop', 'seconds', 'sentences_per_s', 'output_tokens_per_s',
          'best_output_tokens', 'ids_sha1', 'cpu_seconds_per_wall_second', 'load_average_1min',
          'compile_seconds', 'backend', 'cpu_count', 'glibc_tunables'}
TORCH_DECODE = {'benchmark', 'peer', 'config', 'sentences', 'input_tokens', 'beam_size', 'steps',
                'early_stop', 'seconds', 'sentences_per_s', 'output_tokens_per_s',
                'best_output_tokens', 'cpu_seconds_per_wall_second', 'load_average_1min',
                'cpu_count', 'torch', 'threads'}


@pytest.fixture(scope='module')
def bench():
  """Imports a benchmark module by its bare name, as the scripts import each other; the
  modules and their sys.path entries are gone again after this file's tests."""
  before = set(sys.modules)
  sys.path[:0] = [BENCHMARKS, PEERS]
  yield importlib.import_module
  sys.path[:] = [p for p in sys.path if p not in (BENCHMARKS, PEERS)]
  for name in set(sys.modules) - before:
    if (getattr(sys.modules[name], '__file__', None) or '').startswith(BENCHMARKS + os.sep):
      del sys.modules[name]


@pytest.fixture
def tiny(bench, monkeypatch):
  """Every config name is helpers.tiny_config() (1 layer, d_model 32, vocabulary 40)."""
  monkeypatch.setattr(bench('common'), 'get_config', lambda name: helpers.tiny_config())
  return helpers.tiny_config()


def run_main(module, monkeypatch, capsys, *args: str) -> list[dict]:
  """module.main() with the command line `args`; the JSON lines it printed."""
  monkeypatch.setattr(sys, 'argv', [module.__file__, *args])
  module.main()
  return [json.loads(line) for line in capsys.readouterr().out.splitlines()
          if line.startswith('{')]


def run_script(path: str, *args: str, env: dict | None = None) -> list[dict]:
  """`python benchmarks/PATH ARGS` from the repository root; the JSON lines it printed."""
  result = subprocess.run([sys.executable, os.path.join('benchmarks', path), *args], cwd=ROOT,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{')]


# --------------------------------------------------------------------------------- peers


def torch_state_dict(params) -> dict[str, np.ndarray]:
  """t2t_jax's parameters in torch_decode.Transformer's names and layouts: torch Linear
  weights are [out, in], and the peer fuses Q, K, V (self-attention) and K, V (cross)."""
  def proj(p):  # [m, h, d] kernel -> [h·d, m]
    return np.asarray(p['kernel']).reshape(p['kernel'].shape[0], -1).T

  def out(p):  # [h, d, m] kernel -> [m, h·d]
    return np.asarray(p['kernel']).reshape(-1, p['kernel'].shape[-1]).T

  def norm(name, p):
    return {f'{name}.weight': p['layer_norm']['scale'], f'{name}.bias': p['layer_norm']['bias']}

  def ffn(p):
    return {f'ffn.w_{i}.{key}': p[f'w_{i}']['kernel'].T if key == 'weight' else p[f'w_{i}']['bias']
            for i in (1, 2) for key in ('weight', 'bias')}

  state = {'embedding': params['shared_embedding']['embedding']}
  for i, layer in enumerate(params['encoder'].values()):
    a = layer['self_attention']
    state |= {f'encoder.{i}.{k}': v for k, v in {
        'attn.qkv.weight': np.concatenate([proj(a['query']), proj(a['key']), proj(a['value'])]),
        'attn.out.weight': out(a['out']), **norm('ln_1', layer['attention_sublayer']),
        **norm('ln_2', layer['ffn_sublayer']), **ffn(layer['ffn'])}.items()}
  for i, layer in enumerate(params['decoder'].values()):
    a, c = layer['self_attention'], layer['cross_attention']
    state |= {f'decoder.{i}.{k}': v for k, v in {
        'self_attn.qkv.weight': np.concatenate([proj(a['query']), proj(a['key']),
                                                proj(a['value'])]),
        'self_attn.out.weight': out(a['out']), 'cross_attn.q.weight': proj(c['query']),
        'cross_attn.kv.weight': np.concatenate([proj(c['key']), proj(c['value'])]),
        'cross_attn.out.weight': out(c['out']),
        **norm('ln_1', layer['self_attention_sublayer']),
        **norm('ln_2', layer['cross_attention_sublayer']),
        **norm('ln_3', layer['ffn_sublayer']), **ffn(layer['ffn'])}.items()}
  return state


def test_the_torch_peer_decodes_as_t2t_jax_with_its_weights(bench):
  """torch_decode claims the paper's model and decode.py's beam search: loaded with t2t_jax's
  weights, its beam-4 search gives t2t_jax's ids and scores, its logits are t2t_jax's, its
  cached steps its uncached logits, and its greedy search (beam 1) takes the best token of
  t2t_jax's logits each step; early stopping off, a padded sentence among them."""
  torch = pytest.importorskip('torch')
  torch_decode, common = bench('torch_decode'), bench('common')
  config = helpers.tiny_config()
  config.model.num_layers = 2
  c = ModelConfig.from_config(config).replace(deterministic=True)
  src = common.random_sources(3, 6, c.vocab_size, seed=3)
  src[1, 3:] = [common.EOS_ID, 0, 0]  # a shorter sentence, padded
  limits = [9, 7, 9]  # non-padding tokens + extra_length 3
  # Random weights of t2t_jax's tree (abstract init: no compilation), LayerNorm gains near 1.
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: rng.normal(float(path[-1].key == 'scale'), 0.2, x.shape).astype(np.float32),
      jax.eval_shape(lambda: Transformer(c).init(jax.random.PRNGKey(0), src, src))['params'])
  model = torch_decode.build_model(dict(vocab_size=c.vocab_size, d_model=c.d_model,
                                        num_heads=c.num_heads, d_ff=c.d_ff,
                                        num_layers=c.num_layers))
  model.load_state_dict({k: torch.from_numpy(np.array(v, np.float32))
                         for k, v in torch_state_dict(params).items()})
  src_t = torch.from_numpy(src).long()

  ids, scores = decode.beam_search(params, jnp.asarray(src), config=c, beam_size=4, alpha=0.6,
                                   extra_length=3, early_stop=False)
  peer_ids, peer_scores = torch_decode.beam_search(model, src_t, 4, 3, alpha=0.6)
  np.testing.assert_array_equal(peer_ids.numpy(), ids)
  np.testing.assert_allclose(peer_scores.numpy(), scores, rtol=1e-5)

  greedy, greedy_scores = torch_decode.beam_search(model, src_t, 1, 3, alpha=0.6)
  with torch.inference_mode():
    memory_kv, mask = model.encode(src_t)
    inputs = torch.nn.functional.pad(greedy, (1, 0))[:, :-1]  # the start symbol first
    full = model.decode_full(inputs, memory_kv, mask)
    caches, steps = [None] * c.num_layers, []
    for t in range(inputs.shape[1]):
      logits, caches = model.decode_step(inputs[:, t], t, caches, memory_kv, mask, beam=1)
      steps.append(logits)
  ours = np.asarray(jax.jit(lambda p: Transformer(c).apply({'params': p}, src, greedy.numpy()))(
      params))
  np.testing.assert_allclose(full.numpy(), ours, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(torch.stack(steps, 1).numpy(), full.numpy(), atol=2e-5, rtol=1e-5)
  log_p = ours - np.log(np.exp(ours).sum(-1, keepdims=True))
  for row, limit in enumerate(limits):
    output = greedy[row].numpy()
    length = list(output).index(common.EOS_ID) + 1
    assert not output[length:].any() and length <= limit
    best = 1 + log_p[row, :length, 1:].argmax(-1)  # padding is never chosen
    best[limit - 1:] = common.EOS_ID  # at the limit only EOS
    np.testing.assert_array_equal(output[:length], best)
    score = log_p[row, np.arange(length), output[:length]].sum() / ((5 + length) / 6) ** 0.6
    np.testing.assert_allclose(greedy_scores[row].item(), score, rtol=1e-5)


def test_the_flax_peers_loss_and_metrics_are_t2t_jaxs_on_the_same_logits(bench):
  """Their metrics (cross entropy without smoothing, accuracy, denominator) are t2t_jax's
  nll, correct and num_tokens; their smoothed loss is KL(q ‖ p) for their soft targets q
  (1 - ε on the target, ε / (V - 1) elsewhere), where t2t_jax spreads ε over all V."""
  flax_wmt = bench('flax_wmt')
  rng = np.random.default_rng(0)
  logits = (3 * rng.normal(size=(3, 5, 40))).astype(np.float32)
  targets = rng.integers(1, 40, (3, 5))
  targets[0, 3:] = 0  # padding weighs nothing
  weights = (targets > 0).astype(np.float32)
  sums = losses.cross_entropy_sums(logits, targets, label_smoothing=0.1)
  nll, denominator = flax_wmt.weighted_cross_entropy(logits, targets, weights)
  np.testing.assert_allclose(nll, sums.nll, rtol=1e-5)
  assert denominator == sums.num_tokens == 13
  assert flax_wmt.weighted_accuracy(logits, targets, weights) == sums.correct

  smoothed, _ = flax_wmt.weighted_cross_entropy(logits, targets, weights, label_smoothing=0.1)
  q = np.where(np.eye(40, dtype=bool)[targets], 0.9, 0.1 / 39)
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  kl = (q * (np.log(q) - log_p)).sum(-1)
  np.testing.assert_allclose(smoothed, (kl * weights).sum(), rtol=1e-5)
  schedule = flax_wmt.learning_rate_schedule(flax_wmt.LEARNING_RATE, flax_wmt.WARMUP_STEPS)
  np.testing.assert_allclose([schedule(jnp.asarray(step)) for step in (0, 500, 1000, 4000)],
                             [0, 0.001, 0.002, 0.001], rtol=1e-6)


@pytest.mark.slow
def test_train_step_times_ours_and_the_flax_peer(bench, tiny, monkeypatch, capsys):
  """train_step.py --peer: our step's line, flax's (its parameters ours plus the 4·d_model of
  its two final LayerNorms), their ratio, the matmul rate; then the peer's script alone."""
  train_step = bench('train_step')
  matmul = train_step.bench_matmul
  monkeypatch.setattr(train_step, 'bench_matmul', lambda: matmul(64, 1))
  ours, peer, ratio, rate = run_main(train_step, monkeypatch, capsys, '--configs=demo',
                                     '--steps=1', '--peer', '--rounds=2')
  assert set(ours) == TRAIN_STEP | {'matmul_fraction'} and ours['batch'] == '64x16+64x16'
  assert set(peer) == TRAIN_STEP | {'peer', 'dtype'} and peer['peer'] == 'flax_examples_wmt'
  d_model = tiny.model.d_model
  c = ModelConfig.from_config(tiny)
  assert ours['params'] == count_params(jax.eval_shape(
      lambda: Transformer(c).init(jax.random.PRNGKey(0), np.ones((1, 2), np.int32),
                                  np.ones((1, 2), np.int32)))['params'])
  assert peer['params'] == ours['params'] + 4 * d_model
  assert len(peer['round_step_seconds']) == 2 and peer['step_seconds'] > 0
  assert set(ratio) == {'benchmark', 'config', 't2t_jax_over_flax_examples_wmt', 'round_ratios'}
  assert set(rate) == {'benchmark', 'shape', 'dtype', 'gflop_per_s'}
  [alone] = run_main(bench('flax_wmt'), monkeypatch, capsys, '--configs=demo', '--steps=1')
  assert set(alone) == set(peer) and alone['params'] == peer['params']


def test_decode_times_ours_the_torch_peer_and_the_uncached_search(bench, tiny, monkeypatch,
                                                                  capsys):
  pytest.importorskip('torch')
  lines = run_main(bench('decode'), monkeypatch, capsys, '--config=demo', '--sentences=8',
                   '--length=4', '--extra-length=2', '--repeats=1', '--uncached-sentences=8',
                   '--peer')
  ours, peer, ratio, cached, uncached = lines
  assert set(ours) == set(cached) == DECODE and ours['steps'] == 6
  assert ours['ids_sha1'] == cached['ids_sha1']  # the same sentences, the same output
  assert set(peer) == TORCH_DECODE and peer['steps'] == ours['steps']
  assert set(ratio) == {'benchmark', 'config', 't2t_jax_over_pytorch'}
  assert set(uncached) == DECODE | {'mean_positions_recomputed_per_step', 'cache_speedup'}
  assert uncached['cache'] is False and uncached['ids_sha1'] == cached['ids_sha1']


def test_checkpoint_and_grad_accum_memory(bench, tiny, monkeypatch, capsys):
  [line] = run_main(bench('checkpoint'), monkeypatch, capsys, '--config=demo')
  assert set(line) == {'benchmark', 'config', 'params', 'save_seconds', 'save_blocking_seconds',
                       'restore_seconds', 'size_mb', 'bytes_per_param'}
  [line] = run_main(bench('grad_accum_memory'), monkeypatch, capsys, '--config=demo',
                    '--rows=8', '--length=8', '--k=2')
  assert set(line) == {'benchmark', 'config', 'grad_accum_steps', 'batch', 'micro_batch_rows',
                       'temp_mib', 'arguments_mib', 'outputs_mib', 'compile_seconds', 'backend',
                       'dtype'}
  assert (line['grad_accum_steps'], line['micro_batch_rows']) == (2, 4)


# -------------------------------------------------------------- scripts on a text corpus


@pytest.fixture(scope='module')
def sample(tmp_path_factory) -> str:
  """A folder laid out as $T2T_WMT_SAMPLE: train.{en,de} and newstest2013.{en,de}."""
  folder = tmp_path_factory.mktemp('wmt_sample')
  helpers.write_pair(folder / 'train', *helpers.corpus(600, 0))
  helpers.write_pair(folder / 'newstest2013', *helpers.corpus(60, 1))
  return str(folder)


@pytest.mark.e2e
def test_input_pipeline_and_data_memory(sample):
  """As scripts: data_memory.py measures its own process's memory."""
  [line] = run_script('input_pipeline.py', f'--data={sample}/train', '--vocab_size=300',
                      '--epochs=1', '--tokens_per_batch=500')
  assert set(line) == {'batches_per_s', 'tokens_per_s', 'padding_efficiency',
                       'real_tokens_per_batch', 'distinct_shapes', 'data', 'pairs_kept',
                       'batches_per_epoch', 'epochs', 'tokens_per_batch', 'num_devices',
                       'bucket_band', 'bucket_growth', 'vocab_size', 'setup_vocab_s',
                       'setup_encode_s', 'restart_setup_s'}
  env = {'T2T_WMT_SAMPLE': sample}
  lines = run_script('data_memory.py', 'encode', '--pairs=1000', '--vocab_size=300', env=env)
  assert [line['variant'] for line in lines] == ['int_lists', 'numpy_in_memory', 'streamed']
  assert len({line['cache_bytes_per_pair'] for line in lines}) == 1  # the same ids each way
  assert set(lines[0]) == {'variant', 'pairs', 'vocab_size', 'seconds', 'rss_before_mb',
                           'peak_rss_over_before_mb', 'peak_bytes_per_pair',
                           'source_ids_per_pair', 'target_ids_per_pair', 'cache_bytes_per_pair'}
  [line] = run_script('data_memory.py', 'iterator', '--pairs=2000', '--vocab_size=300', env=env)
  assert set(line) == {'benchmark', 'pairs', 'kept', 'batches_per_epoch', 'seconds_to_plan',
                       'rss_before_mb', 'peak_rss_over_before_mb', 'peak_bytes_per_pair',
                       'kept_bytes_per_pair', 'mapped_offsets_bytes_per_pair'}


def test_compilation_shape_statistics(bench, sample, monkeypatch, capsys):
  """--shapes=0 and --sweep: the shapes of an epoch; its vocabulary (8000 pieces, more than
  a tiny corpus holds) is the corpus's own here."""
  compilation = bench('compilation')
  make_config = compilation.make_config

  def small_vocabulary(args):
    config = make_config(args)
    config.vocab_size = 300
    return config
  monkeypatch.setattr(compilation, 'make_config', small_vocabulary)
  monkeypatch.setenv('T2T_WMT_SAMPLE', sample)
  [line] = run_main(compilation, monkeypatch, capsys, '--config=demo', '--shapes=0')
  assert set(line) == {'benchmark', 'what', 'config', 'batching', 'bucket_band',
                       'bucket_growth', 'pack_length', 'train_shapes', 'dev_shapes',
                       'batches_per_epoch', 'padding_efficiency'}
  lines = run_main(compilation, monkeypatch, capsys, '--sweep', '--shapes-per-minute=10')
  assert len(lines) == len(compilation.SWEEP) and 'compile_ahead_minutes' in lines[0]
  buckets, packed = run_main(compilation, monkeypatch, capsys, '--batchings', '--pack-length=48')
  assert (buckets['batching'], packed['batching']) == ('buckets', 'packed')
  assert packed['train_shapes'] <= 2 < buckets['train_shapes']


@pytest.mark.slow
def test_batchings_times_both_batchings_on_the_same_text(bench):
  """batchings.py on the demo corpus at a tiny size: a line for each batching, the packed
  one of one shape, both over real tokens (the sense of the figures, not their speed)."""
  batchings = bench('batchings')
  tiny = dict(demo_num_train=2000, demo_num_eval=16, vocab_size=400,
              vocab_sample_sentences=2000, model=dict(num_layers=1, d_model=32, d_ff=64))
  buckets, packed = batchings.run('demo', 'demo', 3, 1, tiny)
  assert (buckets['batching'], packed['batching']) == ('buckets', 'packed')
  assert len(packed['shapes']) == 1 and len(buckets['shapes']) > 1
  for line in (buckets, packed):
    assert line['batches'] == 3 and 0 < line['padding_efficiency'] <= 1
    assert 0 < line['target_tokens_per_s'] < line['tokens_per_s']


def test_the_profile_counts_the_device_threads_alone(bench, tmp_path):
  """accelerator.py's profile part: a trace with a device process counts only its threads'
  kernels, by thread and by kernel (the host's Python frames are no device time)."""
  profile = bench('accelerator_parts.profile')
  meta = lambda pid, tid, kind, name: {'ph': 'M', 'pid': pid, 'tid': tid, 'name': kind,  # noqa: E731
                                       'args': {'name': name}}
  kernel = lambda pid, tid, name, dur: {'ph': 'X', 'pid': pid, 'tid': tid, 'name': name,  # noqa: E731
                                        'ts': 0, 'dur': dur}
  events = [meta(1, 0, 'process_name', '/device:GPU:0'), meta(1, 7, 'thread_name', 'Stream #7'),
            meta(2, 0, 'process_name', '/host:CPU'), meta(2, 3, 'thread_name', 'python'),
            kernel(1, 7, 'gemm', 5.0), kernel(1, 7, 'gemm', 7.0), kernel(1, 7, 'fusion', 2.0),
            kernel(2, 3, 'PjitFunction', 100.0)]
  path = tmp_path / 'trace.json.gz'
  with gzip.open(path, 'wt') as f:
    json.dump({'traceEvents': events}, f)
  totals, busy = profile.device_kernel_times(str(path))
  stream = '/device:GPU:0 / Stream #7'
  assert dict(totals) == {(stream, 'gemm'): [12.0, 2], (stream, 'fusion'): [2.0, 1]}
  assert dict(busy) == {stream: 14.0}


def test_every_form_is_a_config_model_setting(bench):
  """accelerator.py's forms part: each form is config.model keys a run can set (a
  config.model.kernels value, or the plain forms without dropout), built through the model
  config, with kernels.py's choices left as they are; every lever of kernels.py is priced."""
  shared, forms = bench('accelerator_parts.shared'), bench('accelerator_parts.forms')
  from t2t_jax.config import rules
  from t2t_jax.model import kernels  # beside the modules under test
  before = dict(kernels.KERNELS)
  for form in [*forms.FORMS.values(), *forms.DECODE_FORMS.values()]:
    assert rules.CONCRETE_KERNELS.test(form['kernels']), form
    c = shared.model_config('base', shared.SIZES['tiny'], 'bfloat16', form)
    assert {key: getattr(c, key) for key in form} == form
  assert forms.FORMS['no dropout'] == {'kernels': 'xla', 'dropout_rate': 0.0}
  assert kernels.KERNELS == before
  assert {f'xla+{lever}' for lever in kernels.LEVERS} <= {
      form['kernels'] for form in forms.FORMS.values()}


def test_the_demo_and_compile_parts_read_the_processes_they_start(bench, tmp_path,
                                                                  monkeypatch):
  """accelerator.py's demo and compile parts, the processes they start replaced by what those
  print: make demo's modes in one fresh workdir with the cache off, each line with its
  compilations; the compile probe over one cache, cold then warm. (The modes themselves run
  in test_notebook.py and test_readme.py, the probe's step in the accelerator test.)"""
  demo_part, processes = bench('accelerator_parts.demo'), bench('accelerator_parts.processes')
  calls = []

  def fake_run(argv, *, env, **kwargs):
    calls.append((argv, env))
    if '--probe-compile' in argv:
      cold = not os.listdir(env['JAX_COMPILATION_CACHE_DIR'])
      open(os.path.join(env['JAX_COMPILATION_CACHE_DIR'], 'entry'), 'w').close()
      out = json.dumps({'lower_s': 0.5, 'compile_s': 9.0 if cold else 0.25})
      return subprocess.CompletedProcess(argv, 0, stdout=f'noise\n{out}\n', stderr='')
    workdir = next(a for a in argv if a.startswith('--workdir='))[len('--workdir='):]
    if '--mode=eval' in argv:
      os.makedirs(os.path.join(workdir, 'eval', 'test-x'))
      with open(os.path.join(workdir, 'eval', 'test-x', 'scores.json'), 'w') as f:
        json.dump({'sacrebleu': 12.5}, f)
    log = ('I Finished XLA compilation of jit(train_step) in 1.250000000 sec\n'
           'I Finished XLA compilation of jit(search) in 2.5 sec\n')
    return subprocess.CompletedProcess(argv, 0, stdout='', stderr=log)

  monkeypatch.setattr(subprocess, 'run', fake_run)  # the parts' subprocess module
  searched = []  # the trained search (its own test: the accelerator test) gets each chain's run
  monkeypatch.setattr(demo_part, 'bench_trained_search',
                      lambda workdir, size, out, batching: searched.append((workdir, batching))
                      or [])
  out = str(tmp_path / 'figures.jsonl')
  demo = demo_part.bench_demo(processes.SIZES['full'], out, ['buckets', 'packed'])
  assert [(line['batching'], line['mode'], line['compilations'], line['compile_s'])
          for line in demo] == [(batching, mode, 2, 3.8) for batching in ('buckets', 'packed')
                                for mode in ('train', 'average', 'eval')]
  assert demo[2]['sacrebleu'] == 12.5 and 'sacrebleu' not in demo[0]
  workdirs = [a for argv, _ in calls for a in argv if a.startswith('--workdir=')]
  assert len(set(workdirs)) == 2 and len(workdirs) == 6  # a fresh one for each chain
  assert searched == [(workdirs[0][len('--workdir='):], 'buckets'),
                      (workdirs[3][len('--workdir='):], 'packed')]
  assert not any(os.path.exists(w[len('--workdir='):]) for w in workdirs)
  for argv, env in calls:
    assert argv[1:4] == ['-m', 't2t_jax.main', '--config=experiments/demo.py']
    assert '--config.compilation_cache_dir=' in argv and env['JAX_LOG_COMPILES'] == '1'
  assert [a for argv, _ in calls for a in argv if a.startswith('--config.batching=')] == [
      f'--config.batching={b}' for b in ('buckets', 'packed') for _ in range(3)]
  calls.clear()
  compile_lines = processes.bench_compile('tiny', out)
  assert [(line['cache'], line['compile_s']) for line in compile_lines] == [
      ('cold', 9.0), ('warm', 0.25)]
  entry = os.path.join(BENCHMARKS, 'accelerator.py')  # the probe: the script run again
  assert [argv[1:] for argv, _ in calls] == [[entry, '--probe-compile', '--size', 'tiny']] * 2
  assert len(open(out).readlines()) == 8


def test_interactive_requests_after_compiling_ahead(bench, tiny, monkeypatch, capsys):
  """interactive.py: every interactive shape compiled ahead, then requests that wait for none
  (the test process keeps its own compilation cache: the script's would outlive its folder)."""
  interactive = bench('interactive')
  monkeypatch.setattr(interactive.xla, 'enable_compilation_cache', lambda directory: None)
  [line] = run_main(interactive, monkeypatch, capsys, '--configs=demo', '--requests=3',
                    '--max-length=8')
  assert set(line) == {'benchmark', 'config', 'devices', 'backend', 'max_length', 'shapes',
                       'compile_ahead_s', 'compile_ahead_cached_s', 'first_request_compiling_s',
                       'requests', 'waits', 'p50_s', 'p95_s', 'max_s'}
  # On 8 devices with 64 tokens a batch: bucket 4 with 8 rows and with 16, bucket 8 with 8.
  assert line['devices'] == 8 and line['shapes'] == 3
  assert line['waits'] == 0 and 0 < line['p50_s'] <= line['p95_s'] <= line['max_s']


@pytest.mark.e2e
def test_interactive_feeds_translate_alike_from_a_file_stdin_and_a_pipe(bench, tiny_workdir,
                                                                        monkeypatch, capsys,
                                                                        tmp_path):
  """interactive.py --workdir: the same lines by translate's three feeds, real commands."""
  interactive = bench('interactive')
  (tmp_path / 'lines.txt').write_text('5 6 7\n\n11 12\n9 9 9 9\n')
  [line] = run_main(interactive, monkeypatch, capsys, f'--workdir={tiny_workdir}',
                    f'--text={tmp_path / "lines.txt"}', '--lines=3', '--rounds=1')
  assert line['lines'] == 3 and line['same_output'] is True
  assert all(line[f'{feed}_s'] > 0 for feed in interactive.FEEDS)
  # (the ratio of the unrounded seconds)
  assert line['pipe_vs_file'] == pytest.approx(line['pipe_s'] / line['file_s'], abs=0.02)


def test_the_trained_search_decodes_a_runs_test_sentences(bench, tiny_workdir, tmp_path):
  """accelerator.py's trained_search: a trained run's beam search over its first test
  sentences, as many as each count asks (repeated), in one batch each."""
  demo_part = bench('accelerator_parts.demo')
  run = tmp_path / 'run'
  shutil.copytree(tiny_workdir, run)
  (run / 'demo_corpus').mkdir()
  (run / 'demo_corpus' / 'test.en').write_text('5 6 7\n11 12\n9 9 9 9\n')
  lines = demo_part.bench_trained_search(str(run), {'sentences': (2, 5)}, None, 'buckets')
  devices = jax.device_count()  # a whole number of rows a device
  assert [(line['sentences'], line['source_length']) for line in lines] == [
      (-(-n // devices) * devices, 8) for n in (2, 5)]
  assert all(line['sentences_per_s'] > 0 and line['output_tokens'] > 0 for line in lines)


@pytest.mark.e2e
def test_serve_under_load_and_against_a_file(tiny_workdir, tmp_path):
  """serve.py's lines at a tiny load: a server process of the tiny run, two loads of a second,
  a short sentence alone, and the file's throughput with the ratio."""
  pytest.importorskip('uvicorn', reason="the extra 'serve'")
  sentences = tmp_path / 'test.txt'
  sentences.write_text('5 6 7\n11 12\n3 4 5 6\n')
  lines = run_script('serve.py', f'--workdir={tiny_workdir}', f'--sentences={sentences}',
                     '--seconds=1', '--clients=1,2', '--single=2', '--short=5 6')
  assert [line['benchmark'] for line in lines] == ['serve_start', 'serve_single_short', 'serve',
                                                   'serve', 'serve_file_baseline']
  assert [line['clients'] for line in lines[2:4]] == [1, 2]
  assert all(line['failed'] == 0 and line['requests'] > 0 for line in lines[2:4])
  # one client's requests each make a batch (it posts the next when answered)
  assert lines[2]['batches'] == lines[2]['requests'] and lines[2]['requests_per_batch'] == 1
  assert lines[3]['batches'] <= lines[3]['requests']
  assert set(lines[4]) == {'benchmark', 'sentences', 'seconds', 'sentences_per_s',
                           'serve_ratio', 'serve_clients'}
  assert lines[4]['sentences'] == 3 and lines[4]['serve_clients'] == 2
