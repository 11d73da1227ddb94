"""Every figure the accelerator claims rest on, in one run on one GPU or TPU (or a CPU).

  python benchmarks/accelerator.py [--size auto|full|tiny] [--out FILE]
                                   [--parts matmul,train,peer,decode,batching,compile,demo]
  python benchmarks/accelerator.py --parts matmul,forms,profile [--forms A,B] [--profile-dir D]
  python benchmarks/accelerator.py --parts matmul,train,forms,flags,decode,demo \\
      --dtypes bfloat16 --demo-batchings packed --out levers.jsonl    # the levers' prices

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
           the share of sentences whose bf16 output ids equal float32's; then bf16 at 64 to
           1024 sentences (decode_sweep: what config.decode_tokens_per_batch=0 takes)
  batching the base train step on real text (the WMT sample where $T2T_WMT_SAMPLE names it,
           else the demo corpus), §5.1's length buckets against packed rows
           (benchmarks/batchings.py): real target tokens a second, padding, compile seconds
  compile  the base bf16 step compiled in a fresh process with an empty persistent cache
           (cold), then in another that finds it there (warm): compile and process seconds
  demo     the built-in demo end to end in a fresh workdir (train, average, eval), the
           compilation cache off: seconds of each, compile seconds (JAX_LOG_COMPILES), BLEU;
           for each config.batching of --demo-batchings (default: the config's, 'auto');
           then beam 4 with its trained weights over 64 and 512 test sentences, early
           stopping on (trained_search)
Three more parts run only when --parts names them:
  forms    the price of each lever and form: the base bf16 train step and beam search with
           the 'xla' forms, then with each lever of kernels.py (or a probe's form) in their
           place (FORMS, DECODE_FORMS), side by side; --forms / --decode-forms pick some
  flags    the base bf16 step and the beam search of the most sentences under each
           XLA_FLAGS set of FLAG_SETS (GPU command buffers), a process each
  profile  a jax.profiler trace of three base bf16 steps ('xla' forms): device time by
           kernel, the largest first, and the trace and the optimized program under
           --profile-dir (what each fusion computes is in the program's text)
The steps of the train part are compiled in threads, so compile time overlaps.
`--size tiny` (the default on a CPU) shrinks every model, batch and the demo, so that the
whole script runs in a minute there (tests/test_accelerator_benchmark.py); figures at that size say
nothing about speed.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.apps import translator
from t2t_jax.config import rules
from t2t_jax.decoding import batch_plan, decode
from t2t_jax.model import kernels
from t2t_jax.model.transformer import ModelConfig, Transformer, train_step_flops
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step

ROOT = common.ROOT
emit, random_ids = common.emit, common.random_ids
PARTS = ('matmul', 'train', 'forms', 'profile', 'flags', 'peer', 'decode', 'batching', 'compile',
         'demo')
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ('forms', 'profile', 'flags'))  # asked for
# What each size runs. 'tiny' keeps every code path at sizes a CPU runs in seconds.
SIZES = {
    'full': dict(matmul=8192, rows=384, length=64, steps=10, sentences=(64, 512),
                 sweep=(64, 128, 256, 512, 1024),
                 source_length=32, extra_length=50, model={}, demo=[],
                 batching=dict(config='base', batches=6, rounds=2, changes={})),
    'tiny': dict(matmul=256, rows=8, length=16, steps=2, sentences=(4, 8), sweep=(2, 4, 8),
                 source_length=8,
                 extra_length=6, model=dict(num_layers=1, d_model=32, d_ff=64, num_heads=2),
                 vocab_size=128,
                 batching=dict(config='demo', batches=2, rounds=1, changes=dict(
                     demo_num_train=2000, demo_num_eval=16, vocab_size=400,
                     vocab_sample_sentences=2000, model=dict(num_layers=1, d_model=32,
                                                             d_ff=64))),
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


def prepare_train(name: str, size: dict, dtype: str, **changes):
  """(fields, lowered step, state, batch) of config `name`'s train step in `dtype`."""
  c = model_config(name, size, dtype, **changes)
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
  seconds from the start. A program that fails to compile gives its exception."""
  t0 = time.perf_counter()

  def compile_one(program):
    try:
      compiled = program.compile()
    except Exception as e:  # the caller reports which program failed
      compiled = e
    return compiled, time.perf_counter() - t0
  with concurrent.futures.ThreadPoolExecutor(max(1, len(lowered))) as pool:
    results = list(pool.map(compile_one, lowered))
  return [r[0] for r in results], [r[1] for r in results]


def xla_flops(compiled) -> float:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float((cost or {}).get('flops', float('nan')))


def time_steps(step, state, batch, steps: int) -> tuple[float, object]:
  """(median seconds of a train step, the last state), each step on the state the last one
  returned (the step donates it)."""
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], batch)
    return metrics
  return timed(run, steps), holder[0]


def bench_train(size: dict, peak: float, out: str | None, configs: list[str],
                dtypes: list[str]) -> list[dict]:
  """Each config in each dtype: the steps compiled together, then timed one by one."""
  prepared = [prepare_train(name, size, dtype) for name in configs for dtype in dtypes]
  compiled, compile_s = compile_all([p[1] for p in prepared])
  lines = []
  for (fields, _, state, batch), step, seconds in zip(prepared, compiled, compile_s,
                                                      strict=True):
    if isinstance(step, Exception):
      raise step
    step_s, _ = time_steps(step, state, batch, size['steps'])
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


def decode_params(size: dict, mesh) -> tuple[ModelConfig, dict]:
  """(float32 config, random float32 parameters on every device) of the base model."""
  f32 = model_config('base', size, 'float32', deterministic=True)
  dummy = np.ones((1, 2), np.int32)
  params = jax.jit(lambda rng: Transformer(f32).init(rng, dummy, dummy)['params'])(
      jax.random.PRNGKey(0))
  return f32, jax.device_put(params, mesh_lib.replicated(mesh))


def prepare_search(c: ModelConfig, size: dict, rows: int, mesh, params) -> tuple:
  """(lowered beam-4 search, its arguments) over `rows` random sentences."""
  def search(params, src, alpha):
    return decode.beam_search(params, src, config=c, beam_size=4, alpha=alpha,
                              extra_length=size['extra_length'])
  src = common.random_sources(rows, size['source_length'], c.vocab_size, 3)
  src = mesh_lib.shard_batch({'src': src}, mesh)['src']
  args = (params, src, np.float32(0.6))
  return batch_plan.shard_rows(search, mesh).lower(*args), args


def time_search(compiled, args: tuple) -> tuple[float, np.ndarray]:
  """(median seconds of a search, its output ids)."""
  seconds = timed(lambda: compiled(*args), 3)
  return seconds, np.asarray(compiled(*args)[0])


def bench_decode(size: dict, out: str | None, dtypes: list[str]) -> list[dict]:
  """Base beam-4 decoding at each sentence count in bf16, and the first count in float32
  (with float32 in `dtypes`), then the share of the same outputs."""
  mesh = mesh_lib.make_mesh()
  f32, params = decode_params(size, mesh)
  lines, outputs = [], {}
  runs = [('bfloat16', n) for n in size['sentences']]
  if 'float32' in dtypes:
    runs.append(('float32', size['sentences'][0]))
  for dtype, rows in runs:
    c = f32.replace(dtype=dtype)
    t0 = time.perf_counter()
    lowered, args = prepare_search(c, size, rows, mesh, params)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    seconds, ids = time_search(compiled, args)
    outputs[dtype, rows] = ids
    lines.append(emit({'part': 'decode', 'config': 'base', 'dtype': dtype, 'kernels': c.kernels,
                       'sentences': rows,
                       'source_length': size['source_length'], 'beam': 4,
                       'max_steps': size['source_length'] + size['extra_length'],
                       'ms': round(seconds * 1e3, 1),
                       'sentences_per_s': round(rows / seconds, 1),
                       'output_tokens': int((ids != 0).sum()),
                       'compile_s': round(compile_s, 1)}, out))
  for rows in size['sweep']:  # config.decode_tokens_per_batch=0's per-platform value
    lowered, args = prepare_search(f32.replace(dtype='bfloat16'), size, rows, mesh, params)
    seconds, _ = time_search(lowered.compile(), args)
    lines.append(emit({'part': 'decode_sweep', 'dtype': 'bfloat16', 'sentences': rows,
                       'padded_source_tokens': rows * size['source_length'],
                       'sentences_per_s': round(rows / seconds, 1)}, out))
  first = size['sentences'][0]
  if ('float32', first) not in outputs:
    return lines
  same = (outputs['bfloat16', first] == outputs['float32', first]).all(axis=-1)
  lines.append(emit({'part': 'decode_agreement', 'sentences': first,
                     'bf16_ids_equal_float32_share': round(float(same.mean()), 3),
                     'weights': 'random'}, out))
  return lines


# ---------------------------------------------------------------- forms: each form's price

def no_bits(shape: tuple[int, ...], key: jax.Array) -> jax.Array:
  """All-zero bits (every element kept): the step without a generator, masks still applied."""
  del key
  return jnp.zeros(shape, jnp.uint32)


def bf16_tied_logits(x: jax.Array, embedding: jax.Array) -> jax.Array:
  """The tied logits in the compute dtype, then cast to float32 (the less exact form)."""
  return jnp.einsum('btm,vm->btv', x, embedding).astype(jnp.float32)


XLA_FORMS = kernels.KERNELS['xla']
# The train step's candidates: each a config.model.kernels value (the levers of kernels.py,
# which a run can use), or, for a probe no config offers, the 'xla' forms with one swapped.
FORMS = {
    'xla': 'xla',
    'one-pass loss': 'xla+one_pass_loss',
    'fused attention': 'xla+fused_attention',  # cuDNN's where it serves
    'rbg dropout bits': 'xla+rbg_dropout',
    'hash dropout bits': 'xla+hash_dropout',
    'all levers': 'xla+one_pass_loss+fused_attention+rbg_dropout',
    'no dropout bits': dataclasses.replace(XLA_FORMS, dropout_bits=no_bits),  # the floor
    'bf16 tied logits': dataclasses.replace(XLA_FORMS, tied_logits=bf16_tied_logits),
    'cpu forms': 'cpu',
}
# The beam search's candidates (the encoder's attention is the lever's; the decoder's runs
# over its cache).
DECODE_FORMS = {
    'xla': 'xla',
    'fused attention': 'xla+fused_attention',
    'block top-k and max': dataclasses.replace(XLA_FORMS, row_max=kernels.row_max,
                                               top_k=kernels.block_top_k),
    'cpu forms': 'cpu',
}


@contextlib.contextmanager
def swapped(form: str | kernels.Kernels) -> Iterator[str]:
  """A form of FORMS or DECODE_FORMS as the config.model.kernels value to build with: a
  string as it is; a probe's Kernels handed out by the 'xla' choice while tracing."""
  if isinstance(form, str):
    yield form
    return
  saved = kernels.KERNELS['xla']
  kernels.KERNELS['xla'] = form
  try:
    yield 'xla'
  finally:
    kernels.KERNELS['xla'] = saved


def failed(part: str, form: str, error: Exception, out: str | None) -> dict:
  return emit({'part': part, 'form': form, 'error': f'{type(error).__name__}: {error}'[:400]},
              out)


def progress(message: str, t0: float) -> None:
  print(f'# {message} at {time.perf_counter() - t0:.0f} s', file=sys.stderr, flush=True)


def bench_forms(size: dict, peak: float, out: str | None, forms: list[str],
                decode_forms: list[str]) -> list[dict]:
  """The base bf16 train step with each of `forms` (of FORMS; compiled together, timed one
  by one), then the beam search with each of `decode_forms` at every sentence count."""
  lines, prepared, t0 = [], [], time.perf_counter()
  for form in forms:
    try:
      with swapped(FORMS[form]) as choice:
        prepared.append((form, *prepare_train('base', size, 'bfloat16', kernels=choice)))
    except Exception as e:  # a form this backend cannot lower is reported
      lines.append(failed('forms', form, e, out))
    progress(f'forms: {form} lowered', t0)
  compiled, compile_s = compile_all([p[2] for p in prepared])
  progress('forms: compiled', t0)
  timed_forms = []
  for (form, fields, _, state, batch), step, seconds in zip(prepared, compiled, compile_s,
                                                            strict=True):
    if isinstance(step, Exception):
      lines.append(failed('forms', form, step, out))
      continue
    step_s, state = time_steps(step, state, batch, size['steps'])
    if form == 'xla':
      PROFILED['step'] = step, state, batch  # the profile part traces this one
    timed_forms.append((form, fields, step_s * 1e3, seconds))
  xla_ms = {form: ms for form, _, ms, _ in timed_forms}.get('xla')
  for form, fields, ms, seconds in timed_forms:
    lines.append(emit({'part': 'forms', 'form': form, 'config': 'base', 'dtype': 'bfloat16',
                       'batch': fields['batch'], 'ms': round(ms, 2),
                       'vs_xla': round(ms / xla_ms, 3) if xla_ms else None,
                       'fraction_of_peak': round(fields['flops'] / ms * 1e3 / peak, 3)
                       if peak else None, 'compile_s_parallel': round(seconds, 1)}, out))
  return lines + bench_decode_forms(size, out, decode_forms)


def bench_decode_forms(size: dict, out: str | None, forms: list[str]) -> list[dict]:
  """Base bf16 beam-4 search with each of `forms` (of DECODE_FORMS) at each sentence count."""
  mesh, t0 = mesh_lib.make_mesh(), time.perf_counter()
  f32, params = decode_params(size, mesh)
  lines, prepared = [], []
  for form in forms:
    for rows in size['sentences']:
      with swapped(DECODE_FORMS[form]) as choice:
        c = f32.replace(dtype='bfloat16', kernels=choice)
        prepared.append((form, rows, *prepare_search(c, size, rows, mesh, params)))
  progress('decode forms: lowered', t0)
  compiled, compile_s = compile_all([p[2] for p in prepared])
  progress('decode forms: compiled', t0)
  results = []
  for (form, rows, _, args), search, seconds in zip(prepared, compiled, compile_s, strict=True):
    if isinstance(search, Exception):
      lines.append(failed('decode_forms', form, search, out))
      continue
    results.append((form, rows, *time_search(search, args), seconds))
  xla_ids = {rows: ids for form, rows, _, ids, _ in results if form == 'xla'}
  for form, rows, search_s, ids, seconds in results:
    same = (ids == xla_ids[rows]).all(axis=-1).mean() if rows in xla_ids else None
    lines.append(emit({'part': 'decode_forms', 'form': form, 'sentences': rows,
                       'ms': round(search_s * 1e3, 1), 'sentences_per_s': round(rows / search_s, 1),
                       'ids_equal_xla_share': None if same is None else round(float(same), 3),
                       'compile_s_parallel': round(seconds, 1)}, out))
  return lines


# ---------------------------------------------------------------- profile: where time goes

PROFILED = {}  # 'step': (compiled base bf16 step, state, batch), left by the forms part


def device_kernel_times(trace_path: str) -> tuple[dict, dict]:
  """From a perfetto trace: ({(thread, event): [microseconds, calls]}, {thread: µs}) of
  the device threads (every thread where no process names a device, as on a CPU)."""
  with gzip.open(trace_path, 'rt') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  meta = lambda kind: {(e['pid'], e.get('tid')): e['args']['name'] for e in events  # noqa: E731
                       if e.get('ph') == 'M' and e.get('name') == kind}
  processes = {pid: name for (pid, _), name in meta('process_name').items()}
  threads = meta('thread_name')
  device = {pid for pid, name in processes.items() if re.search(r'GPU|TPU|/device', name)}
  totals, busy = collections.defaultdict(lambda: [0.0, 0]), collections.Counter()
  for e in events:
    if e.get('ph') != 'X' or (device and e.get('pid') not in device):
      continue
    tid = e['pid'], e.get('tid')
    thread = f"{processes.get(e['pid'], e['pid'])} / {threads.get(tid, tid[1])}"
    totals[thread, e['name']][0] += e.get('dur', 0.0)
    totals[thread, e['name']][1] += 1
    busy[thread] += e.get('dur', 0.0)
  return totals, busy


def bench_profile(size: dict, out: str | None, profile_dir: str, steps: int = 3) -> list[dict]:
  """Three base bf16 steps traced by jax.profiler: device milliseconds a step by thread and
  by kernel, the largest 60; the trace and the optimized program are kept in profile_dir."""
  if 'step' not in PROFILED:
    _, lowered, state, batch = prepare_train('base', size, 'bfloat16', kernels='xla')
    PROFILED['step'] = lowered.compile(), state, batch
  step, state, batch = PROFILED.pop('step')
  os.makedirs(profile_dir, exist_ok=True)
  with open(os.path.join(profile_dir, 'base_step_hlo.txt'), 'w') as f:
    f.write(step.as_text())
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], batch)
    return jax.block_until_ready(metrics)
  run()
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
      for _ in range(steps):
        run()
    [path] = glob.glob(os.path.join(log_dir, '**', 'perfetto_trace.json.gz'), recursive=True)
    shutil.copy(path, os.path.join(profile_dir, 'base_step_trace.json.gz'))
  totals, busy = device_kernel_times(os.path.join(profile_dir, 'base_step_trace.json.gz'))
  lines = [emit({'part': 'profile', 'thread': thread,
                 'busy_ms_per_step': round(us / steps / 1e3, 2)}, out)
           for thread, us in busy.most_common(6)]
  for (thread, name), (us, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:60]:
    lines.append(emit({'part': 'profile', 'thread': thread, 'kernel': name[:120],
                       'ms_per_step': round(us / steps / 1e3, 3), 'calls_per_step': calls / steps},
                      out))
  return lines


# Child processes share the GPU with this one, which holds most of its memory already.
CHILD_ENV = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
# The flags part: XLA_FLAGS sets for the gaps between a GPU's kernels (command buffers, i.e.
# CUDA graphs), each priced on the base bf16 step in a process of its own (XLA reads its
# flags once). Names this jaxlib does not know stop that process; the part reports it.
FLAG_SETS = {
    'default': '',
    'command buffers off': '--xla_gpu_enable_command_buffer=',
    'command buffers, every kind': '--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,'
                                   'CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL '
                                   '--xla_gpu_graph_min_graph_size=1',
}


def probe_step(size_name: str) -> None:
  """In a fresh process (--probe-step): the base bf16 step's median ms and the base bf16
  beam search's over the most sentences of the size (its loop is where launch gaps add up),
  printed."""
  size = SIZES[size_name]
  _, lowered, state, batch = prepare_train('base', size, 'bfloat16')
  step_s, _ = time_steps(lowered.compile(), state, batch, size['steps'])
  mesh = mesh_lib.make_mesh()
  f32, params = decode_params(size, mesh)
  rows = size['sentences'][-1]
  search, args = prepare_search(f32.replace(dtype='bfloat16'), size, rows, mesh, params)
  search_s, _ = time_search(search.compile(), args)
  print(json.dumps({'ms': round(step_s * 1e3, 2), 'search_ms': round(search_s * 1e3, 1),
                    'sentences': rows}))


def bench_flags(size_name: str, out: str | None) -> list[dict]:
  """The base bf16 step and search under each of FLAG_SETS, a process each."""
  times: dict[str, list[dict]] = {name: [] for name in FLAG_SETS}
  lines = []
  for _ in range(1):  # more rounds (A B C A B C) where the time allows
    for name, flags in list(FLAG_SETS.items()):
      env = dict(os.environ, **CHILD_ENV,
                 XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
      result = subprocess.run([sys.executable, __file__, '--probe-step', '--size', size_name],
                              env=env, capture_output=True, text=True)
      if result.returncode:
        lines.append(failed('flags', name, RuntimeError(result.stderr.strip()[-300:]), out))
        times.pop(name, None)
        continue
      if name in times:
        times[name].append(json.loads(result.stdout.strip().splitlines()[-1]))
  best = {name: {key: min(r[key] for r in runs) for key in ('ms', 'search_ms')}
          for name, runs in times.items() if runs}
  base = best.get('default')
  for name, figures in best.items():
    lines.append(emit({'part': 'flags', 'form': name, 'xla_flags': FLAG_SETS[name],
                       'ms': figures['ms'], 'search_ms': figures['search_ms'],
                       'sentences': times[name][0]['sentences'],
                       'vs_xla': round(figures['ms'] / base['ms'], 3) if base else None,
                       'search_vs_xla': round(figures['search_ms'] / base['search_ms'], 3)
                       if base else None}, out))
  return lines


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


def bench_batching(size: dict, out: str | None) -> list[dict]:
  """benchmarks/batchings.py's two lines: the train step on buckets and on packed rows."""
  import batchings  # benchmarks/batchings.py, only for this part
  data = 'wmt' if os.environ.get(common.WMT_SAMPLE) else 'demo'
  settings = size['batching']
  lines = batchings.run(settings['config'], data, settings['batches'], settings['rounds'],
                        settings['changes'])
  return [emit({'part': 'batching', **line}, out) for line in lines]


def bench_demo(size: dict, out: str | None, batchings: list[str]) -> list[dict]:
  """The demo's chain for each of `batchings`."""
  return [line for batching in batchings for line in bench_demo_chain(size, out, batching)]


def bench_demo_chain(size: dict, out: str | None, batching: str) -> list[dict]:
  """The demo's chain (make demo without translate) in a fresh workdir, the cache off, with
  config.batching=`batching`: a line after each mode, so that a run cut short keeps what it
  measured."""
  lines = []
  with tempfile.TemporaryDirectory() as workdir:
    env = dict(os.environ, JAX_LOG_COMPILES='1', **CHILD_ENV)
    for mode in ('train', 'average', 'eval'):
      t0 = time.perf_counter()
      result = subprocess.run(
          [sys.executable, '-m', 't2t_jax.main', '--config=experiments/demo.py',
           f'--workdir={workdir}', f'--mode={mode}', "--config.compilation_cache_dir=",
           f'--config.batching={batching}', *size['demo']], cwd=ROOT, env=env,
          capture_output=True, text=True)
      if result.returncode:
        raise RuntimeError(f'demo --mode={mode} failed:\n{result.stderr[-3000:]}')
      line = {'part': 'demo', 'batching': batching, 'mode': mode,
              'seconds': round(time.perf_counter() - t0, 1),
              'compile_s': round(sum(float(s) for _, s in COMPILE_LOG.findall(result.stderr)), 1),
              'compilations': len(COMPILE_LOG.findall(result.stderr))}
      if mode == 'eval':
        [scores] = [os.path.join(root, 'scores.json') for root, _, files in
                    os.walk(os.path.join(workdir, 'eval')) if 'scores.json' in files]
        with open(scores) as f:
          line['sacrebleu'] = json.load(f)['sacrebleu']
      lines.append(emit(line, out))
    lines += bench_trained_search(workdir, size, out, batching)
  return lines


def bench_trained_search(workdir: str, size: dict, out: str | None, batching: str) -> list[dict]:
  """Beam 4 with the demo's trained (averaged) weights over its first test sentences, as
  many as each of size['sentences'] (repeated where the test set is shorter; rounded up to
  a multiple of the devices), one batch of
  the bucket of the longest, early stopping on as in eval: sentences a second. Random
  weights (the decode part) rarely end a sentence; trained ones end most early."""
  tr = translator.Translator.from_workdir(workdir, {'compilation_cache_dir': ''})
  with open(os.path.join(workdir, 'demo_corpus', 'test.en'), encoding='utf-8') as f:
    test = f.read().splitlines()
  _, encoded = batch_plan.encode_inputs(test, tr.tokenizer, tr.max_input_length)
  lines, decoder = [], tr.decoder()
  for asked in size['sentences']:
    rows = -(-asked // tr.mesh.size) * tr.mesh.size  # a whole number of rows a device
    chosen = [encoded[i % len(encoded)] for i in range(rows)]
    length = -(-max(len(ids) for ids in chosen) // 8) * 8
    src = np.zeros((rows, length), np.int32)
    for r, ids in enumerate(chosen):
      src[r, :len(ids)] = ids
    src = mesh_lib.shard_batch({'src': src}, tr.mesh)['src']
    args = (tr.decoding_params, src, np.float32(tr.config.beam_alpha))
    t0 = time.perf_counter()
    compiled = decoder.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    seconds, ids = time_search(compiled, args)
    lines.append(emit({'part': 'trained_search', 'batching': batching, 'sentences': rows,
                       'source_length': length, 'weights': 'demo, trained',
                       'ms': round(seconds * 1e3, 1), 'sentences_per_s': round(rows / seconds, 1),
                       'output_tokens': int((np.asarray(ids) != 0).sum()),
                       'compile_s': round(compile_s, 1)}, out))
  return lines


def table(lines: list[dict]) -> str:
  """The lines as one markdown table: part, what, the figure that matters."""
  rows = ['| part | what | figure |', '|---|---|---|']
  for line in lines:
    what = ' '.join(str(line[k]) for k in ('form', 'config', 'batching', 'dtype', 'shape', 'batch',
                                           'sentences', 'cache', 'mode', 'thread', 'kernel')
                    if k in line)
    figure = ', '.join(f'{k} {line[k]}' for k in (
        'tflop_per_s', 'ms', 'target_tokens_per_s', 'tokens_per_s', 'fraction_of_peak',
        'padding_efficiency', 'vs_xla', 'search_ms', 'search_vs_xla', 'sentences_per_s',
        'ids_equal_xla_share', 'bf16_ids_equal_float32_share', 'busy_ms_per_step',
        'ms_per_step', 'calls_per_step', 'seconds', 'compile_s', 'process_s', 'sacrebleu',
        'error')
        if line.get(k) is not None)
    rows.append(f"| {line['part']} | {what} | {figure} |")
  return '\n'.join(rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', default='auto', choices=('auto', 'full', 'tiny'),
                      help="auto: 'tiny' on a CPU, else 'full'")
  parser.add_argument('--parts', default=','.join(DEFAULT_PARTS),
                      help=f"of {','.join(PARTS)}")
  parser.add_argument('--forms', default=','.join(FORMS), help='forms: the train step forms')
  parser.add_argument('--decode-forms', default=','.join(DECODE_FORMS),
                      help='forms: the beam search forms')
  parser.add_argument('--configs', default='base,big', help='train: of ' + ','.join(common.CONFIGS))
  parser.add_argument('--dtypes', default='bfloat16,float32', help='train and decode')
  parser.add_argument('--sentences', default='', help='decode: sentence counts (64,512)')
  parser.add_argument('--kernels', default='auto',
                      help="config.model.kernels of every model (t2t_jax/model/kernels.py): "
                      "'auto', 'xla', 'cpu', with levers ('xla+one_pass_loss')")
  parser.add_argument('--demo-batchings', default='auto',
                      help='demo: config.batching of each chain (auto, buckets, packed)')
  parser.add_argument('--out', default=None, help='also append the JSON lines to this file')
  parser.add_argument('--profile-dir', default=None,
                      help="profile: where the trace and the program go (default: a new "
                      "temporary folder)")
  parser.add_argument('--probe-compile', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--probe-step', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  size_name = args.size if args.size != 'auto' else (
      'tiny' if jax.default_backend() == 'cpu' else 'full')
  if args.probe_compile:
    return probe_compile(size_name)
  if args.probe_step:
    return probe_step(size_name)
  if args.kernels != 'auto' and not rules.CONCRETE_KERNELS.test(args.kernels):
    parser.error(f'--kernels={args.kernels}: {rules.CONCRETE_KERNELS.allowed}')
  size, parts = dict(SIZES[size_name]), args.parts.split(',')
  KERNELS['choice'] = args.kernels
  if args.sentences:
    size['sentences'] = tuple(int(n) for n in args.sentences.split(','))
  configs, dtypes = args.configs.split(','), args.dtypes.split(',')
  forms, decode_forms = args.forms.split(','), args.decode_forms.split(',')
  for flag, names, known in (('--parts', parts, PARTS), ('--forms', forms, FORMS),
                             ('--decode-forms', decode_forms, DECODE_FORMS)):
    unknown = sorted(set(names) - set(known))
    if unknown:
      parser.error(f'{flag}: {unknown} not among {tuple(known)}')
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
             'forms': lambda: bench_forms(size, peak, args.out, forms, decode_forms),
             'profile': lambda: bench_profile(size, args.out,
                                              args.profile_dir or tempfile.mkdtemp()),
             'flags': lambda: bench_flags(size_name, args.out),
             'decode': lambda: bench_decode(size, args.out, dtypes),
             'batching': lambda: bench_batching(size, args.out),
             'compile': lambda: bench_compile(size_name, args.out),
             'demo': lambda: bench_demo(size, args.out, args.demo_batchings.split(','))}
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
