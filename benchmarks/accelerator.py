"""Every figure the accelerator claims rest on, in one run on one GPU or TPU (or a CPU).

  python benchmarks/accelerator.py [--size auto|full|tiny] [--out FILE]
                                   [--parts matmul,train,peer,decode,compile,demo]

Prints JSON lines as it goes (and appends them to --out), then a markdown table:
  matmul   the chip's bf16 (and float32) matmul rate, 8192³, measured in this run: the
           "peak" every fraction below is taken of
  train    the base and big train steps (experiments/wmt_ende_{base,big}.py) in bfloat16 and
           float32 at §5.1's ~25k tokens a side (384 × 64 source + 384 × 64 target tokens,
           random ids, no padding): ms a step, tokens/s, analytic TFLOP/s
           (model.train_step_flops) and its fraction of the matmul peak, XLA's own FLOPs
  peer     flax's examples/wmt step (benchmarks/peers/flax_wmt.py) on the base shape, bf16
  decode   base beam-4 search (§6.1: α 0.6, input + 50, early stopping) of 64 and 512
           random 32-token sentences in bfloat16, and of the 64 in float32: sentences/s, and
           the share of sentences whose bf16 output ids equal float32's
  compile  the base bf16 step compiled in a fresh process with an empty persistent cache
           (cold), then in another that finds it there (warm): compile and process seconds
  demo     the built-in demo end to end in a fresh workdir (train, average, eval), the
           compilation cache off: seconds of each, compile seconds (JAX_LOG_COMPILES), BLEU
The steps of the train part are compiled in threads, so compile time overlaps.
`--size tiny` (the default on a CPU) shrinks every model, batch and the demo, so that the
whole script runs in a minute there (tests/test_accelerator_benchmark.py); figures at that size say
nothing about speed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from t2t_jax.decoding import decode, translator  # noqa: E402
from t2t_jax.model.transformer import ModelConfig, Transformer, train_step_flops  # noqa: E402
from t2t_jax.platform import mesh as mesh_lib  # noqa: E402
from t2t_jax.training import optim, train_step  # noqa: E402

ROOT = common.ROOT
emit, random_ids = common.emit, common.random_ids
PARTS = ('matmul', 'train', 'peer', 'decode', 'compile', 'demo')
# What each size runs. 'tiny' keeps every code path at sizes a CPU runs in seconds.
SIZES = {
    'full': dict(matmul=8192, rows=384, length=64, steps=10, sentences=(64, 512),
                 source_length=32, extra_length=50, model={}, demo=[]),
    'tiny': dict(matmul=256, rows=8, length=16, steps=2, sentences=(4, 8), source_length=8,
                 extra_length=6, model=dict(num_layers=1, d_model=32, d_ff=64, num_heads=2),
                 vocab_size=128,
                 # Coarse length buckets (growth 2): few shapes to compile, as tiny needs.
                 demo=['--config.num_train_steps=6', '--config.demo_num_train=2000',
                       '--config.demo_num_eval=16', '--config.vocab_size=400',
                       '--config.bucket_growth=2',
                       '--config.vocab_sample_sentences=2000', '--config.log_every_steps=3',
                       '--config.eval_every_steps=6', '--config.checkpoint_every_steps=3',
                       '--config.average_last=2', '--config.model.num_layers=1',
                       '--config.model.d_model=32', '--config.model.d_ff=64']),
}


# config.model.kernels for every model here (--kernels): 'auto', or 'xla' / 'cpu' to compare
# the hardware forms (t2t_jax/model/kernels.py) on one machine.
KERNELS = {'choice': 'auto'}


def model_config(name: str, size: dict, dtype: str, **changes) -> ModelConfig:
  config = common.get_config(name)
  config.model.kernels = KERNELS['choice']
  for key, value in size['model'].items():
    config.model[key] = value
  config.vocab_size = size.get('vocab_size', config.vocab_size)
  config.model.dtype = dtype
  return ModelConfig.from_config(config).replace(**changes)


def timed(fn, repeats: int) -> float:
  """Median seconds of `repeats` calls of fn, after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def bench_matmul(size: dict) -> list[dict]:
  """The chip's matmul rate at n³, bf16 and float32, as the ceiling for the steps below."""
  n, lines = size['matmul'], []
  for dtype in ('bfloat16', 'float32'):
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = timed(lambda: matmul(a, a), 20)  # noqa: B023 -- called within the iteration
    lines.append({'part': 'matmul', 'shape': f'{n}x{n}x{n}', 'dtype': dtype,
                  'ms': round(seconds * 1e3, 3),
                  'tflop_per_s': round(2 * n ** 3 / seconds / 1e12, 2)})
  return lines


def prepare_train(name: str, size: dict, dtype: str):
  """(fields, lowered step, state, batch) of config `name`'s train step in `dtype`."""
  c = model_config(name, size, dtype)
  config = common.get_config(name)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(c), tx, 0, mesh)
  train_fn, _ = train_step.compile_steps(c, tx, config.label_smoothing, mesh)
  rows, length = size['rows'], size['length']
  batch = mesh_lib.shard_batch({'inputs': random_ids(rows, length, c.vocab_size, 1),
                                'targets': random_ids(rows, length, c.vocab_size, 2)}, mesh)
  fields = {'part': 'train', 'config': name, 'dtype': dtype, 'kernels': c.kernels,
            'batch': f'{rows}x{length}+{rows}x{length}',
            'flops': train_step_flops(c, rows, length, length)}
  return fields, train_fn.lower(state, batch), state, batch


def compile_all(lowered: list) -> tuple[list, list[float]]:
  """Compiles every lowered program in threads (XLA compiles outside the GIL); each one's
  seconds from the start."""
  t0 = time.perf_counter()

  def compile_one(program):
    compiled = program.compile()
    return compiled, time.perf_counter() - t0
  with concurrent.futures.ThreadPoolExecutor(max(1, len(lowered))) as pool:
    results = list(pool.map(compile_one, lowered))
  return [r[0] for r in results], [r[1] for r in results]


def xla_flops(compiled) -> float:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float((cost or {}).get('flops', float('nan')))


def time_steps(step, state, batch, steps: int) -> float:
  """Median seconds of a train step, each step on the state the last one returned."""
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], batch)
    return metrics
  return timed(run, steps)


def bench_train(size: dict, peak: float, out: str | None, configs: list[str],
                dtypes: list[str]) -> list[dict]:
  """Each config in each dtype: the steps compiled together, then timed one by one."""
  prepared = [prepare_train(name, size, dtype) for name in configs for dtype in dtypes]
  compiled, compile_s = compile_all([p[1] for p in prepared])
  lines = []
  for (fields, _, state, batch), step, seconds in zip(prepared, compiled, compile_s,
                                                       strict=True):
    step_s = time_steps(step, state, batch, size['steps'])
    tokens = batch['targets'].size
    flops = fields.pop('flops')
    lines.append(emit(fields | {
        'ms': round(step_s * 1e3, 2), 'target_tokens_per_s': round(tokens / step_s),
        'tokens_per_s': round(2 * tokens / step_s),
        'analytic_tflop_per_s': round(flops / step_s / 1e12, 2),
        'fraction_of_peak': round(flops / step_s / peak, 3) if peak else None,
        'analytic_gflop': round(flops / 1e9, 4),
        'xla_gflop': round(xla_flops(step) / 1e9, 4),
        'compile_s_parallel': round(seconds, 1)}, out))
  return lines


def bench_peer(size: dict, peak: float, out: str | None) -> list[dict]:
  """flax's examples/wmt train step on the base shape, bf16, timed as ours."""
  flax_wmt = common.import_peer('flax_wmt')  # the peer, only when asked
  ours = flax_wmt.ours  # benchmarks/train_step.py: its timing
  c = model_config('base', size, 'bfloat16')
  shape = dict(vocab_size=c.vocab_size, emb_dim=c.d_model, num_heads=c.num_heads,
               mlp_dim=c.d_ff, num_layers=c.num_layers, rows=size['rows'], length=size['length'])
  runner = flax_wmt.prepare('base', shape, jnp.bfloat16)
  step_s = float(np.median(ours.timed_steps(runner, size['steps'])))
  tokens = size['rows'] * size['length']
  flops = train_step_flops(c, size['rows'], size['length'], size['length'])
  return [emit({'part': 'peer', 'peer': 'flax_examples_wmt', 'config': 'base',
                'dtype': 'bfloat16', 'batch': f"{size['rows']}x{size['length']}"
                f"+{size['rows']}x{size['length']}", 'ms': round(step_s * 1e3, 2),
                'tokens_per_s': round(2 * tokens / step_s),
                'analytic_tflop_per_s': round(flops / step_s / 1e12, 2),
                'fraction_of_peak': round(flops / step_s / peak, 3) if peak else None,
                'compile_s': round(runner.compile_s, 1)}, out)]


def bench_decode(size: dict, out: str | None, dtypes: list[str]) -> list[dict]:
  """Base beam-4 decoding at each sentence count in bf16, and the first count in float32
  (with float32 in `dtypes`), then the share of the same outputs."""
  mesh = mesh_lib.make_mesh()
  f32 = model_config('base', size, 'float32', deterministic=True)
  dummy = np.ones((1, 2), np.int32)
  params = jax.jit(lambda rng: Transformer(f32).init(rng, dummy, dummy)['params'])(
      jax.random.PRNGKey(0))
  params = jax.device_put(params, mesh_lib.replicated(mesh))
  alpha, lines, outputs = np.float32(0.6), [], {}
  runs = [('bfloat16', n) for n in size['sentences']]
  if 'float32' in dtypes:
    runs.append(('float32', size['sentences'][0]))
  for dtype, rows in runs:
    c = f32.replace(dtype=dtype)

    def search(params, src, alpha, c=c):
      return decode.beam_search(params, src, config=c, beam_size=4, alpha=alpha,
                                extra_length=size['extra_length'])
    src = common.random_sources(rows, size['source_length'], c.vocab_size, 3)
    src = mesh_lib.shard_batch({'src': src}, mesh)['src']
    t0 = time.perf_counter()
    compiled = translator.shard_rows(search, mesh).lower(params, src, alpha).compile()
    compile_s = time.perf_counter() - t0
    seconds = timed(lambda: compiled(params, src, alpha), 3)  # noqa: B023
    ids = np.asarray(compiled(params, src, alpha)[0])  # noqa: B023
    outputs[dtype, rows] = ids
    lines.append(emit({'part': 'decode', 'config': 'base', 'dtype': dtype, 'kernels': c.kernels,
                       'sentences': rows,
                       'source_length': size['source_length'], 'beam': 4,
                       'max_steps': size['source_length'] + size['extra_length'],
                       'ms': round(seconds * 1e3, 1),
                       'sentences_per_s': round(rows / seconds, 1),
                       'output_tokens': int((ids != 0).sum()),
                       'compile_s': round(compile_s, 1)}, out))
  first = size['sentences'][0]
  if ('float32', first) not in outputs:
    return lines
  same = (outputs['bfloat16', first] == outputs['float32', first]).all(axis=-1)
  lines.append(emit({'part': 'decode_agreement', 'sentences': first,
                     'bf16_ids_equal_float32_share': round(float(same.mean()), 3),
                     'weights': 'random'}, out))
  return lines


# Child processes share the GPU with this one, which holds most of its memory already.
CHILD_ENV = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}


def probe_compile(size_name: str) -> None:
  """In a fresh process (--probe-compile): the base bf16 step compiled, seconds printed."""
  t0 = time.perf_counter()
  _, lowered, _, _ = prepare_train('base', SIZES[size_name], 'bfloat16')
  t1 = time.perf_counter()
  lowered.compile()
  print(json.dumps({'lower_s': round(t1 - t0, 2), 'compile_s': round(time.perf_counter() - t1, 2)}))


def bench_compile(size_name: str, out: str | None) -> list[dict]:
  """The probe twice over one persistent cache: empty (cold), then filled (warm)."""
  lines = []
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0', **CHILD_ENV)
    for run in ('cold', 'warm'):
      t0 = time.perf_counter()
      result = subprocess.run([sys.executable, __file__, '--probe-compile', '--size', size_name],
                              env=env, capture_output=True, text=True, check=True)
      probe = json.loads(result.stdout.strip().splitlines()[-1])
      lines.append(emit({'part': 'compile', 'config': 'base', 'dtype': 'bfloat16', 'cache': run,
                         **probe, 'process_s': round(time.perf_counter() - t0, 1)}, out))
  return lines


COMPILE_LOG = re.compile(r'Finished XLA compilation of (.+?) in ([0-9.e+-]+) ?s')


def bench_demo(size: dict, out: str | None) -> list[dict]:
  """The demo's chain (make demo without translate) in a fresh workdir, the cache off: a
  line after each mode, so that a run cut short keeps what it measured."""
  lines = []
  with tempfile.TemporaryDirectory() as workdir:
    env = dict(os.environ, JAX_LOG_COMPILES='1', **CHILD_ENV)
    for mode in ('train', 'average', 'eval'):
      t0 = time.perf_counter()
      result = subprocess.run(
          [sys.executable, '-m', 't2t_jax.main', '--config=experiments/demo.py',
           f'--workdir={workdir}', f'--mode={mode}', "--config.compilation_cache_dir=",
           *size['demo']], cwd=ROOT, env=env, capture_output=True, text=True)
      if result.returncode:
        raise RuntimeError(f'demo --mode={mode} failed:\n{result.stderr[-3000:]}')
      line = {'part': 'demo', 'mode': mode, 'seconds': round(time.perf_counter() - t0, 1),
              'compile_s': round(sum(float(s) for _, s in COMPILE_LOG.findall(result.stderr)), 1),
              'compilations': len(COMPILE_LOG.findall(result.stderr))}
      if mode == 'eval':
        [scores] = [os.path.join(root, 'scores.json') for root, _, files in
                    os.walk(os.path.join(workdir, 'eval')) if 'scores.json' in files]
        with open(scores) as f:
          line['sacrebleu'] = json.load(f)['sacrebleu']
      lines.append(emit(line, out))
  return lines


def table(lines: list[dict]) -> str:
  """The lines as one markdown table: part, what, the figure that matters."""
  rows = ['| part | what | figure |', '|---|---|---|']
  for line in lines:
    what = ' '.join(str(line[k]) for k in ('config', 'dtype', 'shape', 'batch', 'sentences',
                                           'cache', 'mode') if k in line)
    figure = ', '.join(f'{k} {line[k]}' for k in (
        'tflop_per_s', 'ms', 'tokens_per_s', 'fraction_of_peak', 'sentences_per_s',
        'bf16_ids_equal_float32_share', 'seconds', 'compile_s', 'process_s', 'sacrebleu')
        if line.get(k) is not None)
    rows.append(f"| {line['part']} | {what} | {figure} |")
  return '\n'.join(rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', default='auto', choices=('auto', 'full', 'tiny'),
                      help="auto: 'tiny' on a CPU, else 'full'")
  parser.add_argument('--parts', default=','.join(PARTS))
  parser.add_argument('--configs', default='base,big', help='train: of ' + ','.join(common.CONFIGS))
  parser.add_argument('--dtypes', default='bfloat16,float32', help='train and decode')
  parser.add_argument('--sentences', default='', help='decode: sentence counts (64,512)')
  parser.add_argument('--kernels', default='auto', choices=('auto', 'xla', 'cpu'),
                      help='config.model.kernels of every model (t2t_jax/model/kernels.py)')
  parser.add_argument('--out', default=None, help='also append the JSON lines to this file')
  parser.add_argument('--probe-compile', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  size_name = args.size if args.size != 'auto' else (
      'tiny' if jax.default_backend() == 'cpu' else 'full')
  if args.probe_compile:
    return probe_compile(size_name)
  size, parts = dict(SIZES[size_name]), args.parts.split(',')
  KERNELS['choice'] = args.kernels
  if args.sentences:
    size['sentences'] = tuple(int(n) for n in args.sentences.split(','))
  configs, dtypes = args.configs.split(','), args.dtypes.split(',')
  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    parser.error(f'--parts: {unknown} not among {PARTS}')
  device = jax.devices()[0]
  lines = [emit({'part': 'device', 'backend': jax.default_backend(),
                 'device_kind': device.device_kind, 'devices': jax.device_count(),
                 'jax': jax.__version__, 'size': size_name,
                 'date': time.strftime('%Y-%m-%d')}, args.out)]
  peak = 0.0
  if 'matmul' in parts:
    matmul = bench_matmul(size)
    lines += [emit(line, args.out) for line in matmul]
    peak = matmul[0]['tflop_per_s'] * 1e12
  benches = {'train': lambda: bench_train(size, peak, args.out, configs, dtypes),
             'peer': lambda: bench_peer(size, peak, args.out),
             'decode': lambda: bench_decode(size, args.out, dtypes),
             'compile': lambda: bench_compile(size_name, args.out),
             'demo': lambda: bench_demo(size, args.out)}
  for part in PARTS[1:]:
    if part in parts:
      t0 = time.perf_counter()
      lines += benches[part]()
      print(f'# {part}: {time.perf_counter() - t0:.0f} s', file=sys.stderr, flush=True)
  print(table(lines))
  if args.out:
    with contextlib.suppress(OSError), open(os.path.splitext(args.out)[0] + '.md', 'w') as f:
      f.write(table(lines) + '\n')


if __name__ == '__main__':
  main()
