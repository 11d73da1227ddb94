"""Every figure the accelerator claims rest on, in one run on one GPU or TPU (or a CPU).

  python benchmarks/accelerator.py [--size auto|full|tiny] [--out FILE]
                                   [--parts matmul,train,peer,decode,batching,compile,demo]
  python benchmarks/accelerator.py --parts matmul,forms,profile [--forms A,B] [--profile-dir D]
  python benchmarks/accelerator.py --parts matmul,train,forms,flags,decode,demo \\
      --dtypes bfloat16 --demo-batchings packed --out levers.jsonl    # the levers' prices

Prints JSON lines as it goes (and appends them to --out), then a markdown table. Each part is
a module of accelerator_parts/ (named after the colon; shared.py: sizes, configs, timing):
  matmul   (steps) the chip's bf16 (and float32) matmul rate, 8192³, measured in this run:
           the "peak" every fraction below is taken of
  train    (steps) the base and big train steps (experiments/wmt_ende_{base,big}.py) in
           bfloat16 and float32 at §5.1's ~25k tokens a side (384 × 64 source + 384 × 64
           target tokens, random ids, no padding): ms a step, tokens/s, analytic TFLOP/s
           (model.train_step_flops) and its fraction of the matmul peak, XLA's own FLOPs
  peer     (steps) flax's examples/wmt step (benchmarks/peers/flax_wmt.py) on the base shape
  decode   (search) base beam-4 search (§6.1: α 0.6, input + 50, early stopping) of 64 and
           512 random 32-token sentences in bfloat16, and of the 64 in float32: sentences/s,
           and the share of sentences whose bf16 output ids equal float32's; then bf16 at 64
           to 1024 sentences (decode_sweep: what config.decode_tokens_per_batch=0 takes)
  batching (steps) the base train step on real text (the WMT sample where $T2T_WMT_SAMPLE
           names it, else the demo corpus), §5.1's length buckets against packed rows
           (benchmarks/batchings.py): real target tokens a second, padding, compile seconds
  compile  (processes) the base bf16 step compiled in a fresh process with an empty
           persistent cache (cold), then in another that finds it there (warm): compile and
           process seconds
  demo     (demo) the built-in demo end to end in a fresh workdir (train, average, eval), the
           compilation cache off: seconds of each, compile seconds (JAX_LOG_COMPILES), BLEU;
           for each config.batching of --demo-batchings (default: the config's, 'auto');
           then beam 4 with its trained weights over 64 and 512 test sentences, early
           stopping on (trained_search)
Three more parts run only when --parts names them:
  forms    (forms) the price of each lever and form: the base bf16 train step and beam search
           with the 'xla' forms, then with each config.model setting of FORMS and
           DECODE_FORMS (a config.model.kernels value with levers of kernels.py, the CPU's
           forms, no dropout), side by side; --forms / --decode-forms pick some
  flags    (processes) the base bf16 step and the beam search of the most sentences under
           each XLA_FLAGS set of FLAG_SETS (GPU command buffers), a process each
  profile  (profile) a jax.profiler trace of three base bf16 steps ('xla' forms): device time
           by kernel, the largest first, and the trace and the optimized program under
           --profile-dir (what each fusion computes is in the program's text)
The steps of the train part are compiled in threads, so compile time overlaps.
`--size tiny` (the default on a CPU) shrinks every model, batch and the demo, so that the
whole script runs in a minute there (tests/test_accelerator_benchmark.py); figures at that size say
nothing about speed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import jax
from accelerator_parts import demo, forms, processes, profile, search, steps
from accelerator_parts.shared import SIZES, emit
from accelerator_parts.table import table

from t2t_jax.config import rules

PARTS = ('matmul', 'train', 'forms', 'profile', 'flags', 'peer', 'decode', 'batching', 'compile',
         'demo')
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ('forms', 'profile', 'flags'))  # asked for


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', default='auto', choices=('auto', 'full', 'tiny'),
                      help="auto: 'tiny' on a CPU, else 'full'")
  parser.add_argument('--parts', default=','.join(DEFAULT_PARTS),
                      help=f"of {','.join(PARTS)}")
  parser.add_argument('--forms', default=','.join(forms.FORMS),
                      help='forms: the train step forms')
  parser.add_argument('--decode-forms', default=','.join(forms.DECODE_FORMS),
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
  if args.kernels != 'auto' and not rules.CONCRETE_KERNELS.test(args.kernels):
    parser.error(f'--kernels={args.kernels}: {rules.CONCRETE_KERNELS.allowed}')
  for flag, names, known in (('--parts', args.parts, PARTS), ('--forms', args.forms, forms.FORMS),
                             ('--decode-forms', args.decode_forms, forms.DECODE_FORMS)):
    unknown = sorted(set(names.split(',')) - set(known))
    if unknown:
      parser.error(f'{flag}: {unknown} not among {tuple(known)}')
  return args


def main() -> None:
  args = parse_args()
  size_name = args.size if args.size != 'auto' else (
      'tiny' if jax.default_backend() == 'cpu' else 'full')
  if args.probe_compile:
    return processes.probe_compile(size_name)
  if args.probe_step:
    return processes.probe_step(size_name)
  size, parts = dict(SIZES[size_name], kernels=args.kernels), args.parts.split(',')
  if args.sentences:
    size['sentences'] = tuple(int(n) for n in args.sentences.split(','))
  configs, dtypes = args.configs.split(','), args.dtypes.split(',')
  device = jax.devices()[0]
  lines = [emit({'part': 'device', 'backend': jax.default_backend(),
                 'device_kind': device.device_kind, 'devices': jax.device_count(),
                 'jax': jax.__version__, 'size': size_name,
                 'date': time.strftime('%Y-%m-%d')}, args.out)]
  peak = 0.0
  if 'matmul' in parts:
    matmul = steps.bench_matmul(size)
    lines += [emit(line, args.out) for line in matmul]
    peak = matmul[0]['tflop_per_s'] * 1e12
  profiled = {}  # the forms part's compiled 'xla' step, which the profile part traces
  benches = {
      'train': lambda: steps.bench_train(size, peak, args.out, configs, dtypes),
      'peer': lambda: steps.bench_peer(size, peak, args.out),
      'forms': lambda: forms.bench_forms(size, peak, args.out, args.forms.split(','),
                                         args.decode_forms.split(','), profiled),
      'profile': lambda: profile.bench_profile(size, args.out,
                                               args.profile_dir or tempfile.mkdtemp(), profiled),
      'flags': lambda: processes.bench_flags(size_name, args.out),
      'decode': lambda: search.bench_decode(size, args.out, dtypes),
      'batching': lambda: steps.bench_batching(size, args.out),
      'compile': lambda: processes.bench_compile(size_name, args.out),
      'demo': lambda: demo.bench_demo(size, args.out, args.demo_batchings.split(','))}
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
