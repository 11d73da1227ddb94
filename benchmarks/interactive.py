"""Interactive decoding: the latency of a one-line request once the decoder is compiled, and
a stream against a file.

  python benchmarks/interactive.py [--configs demo,base] [--requests 40] [--max-length 64]
  python benchmarks/interactive.py --workdir runs/demo [--text FILE] [--lines 40] [--rounds 2]

For each config, the path a `Translator` (or `--mode=translate --input=-`) takes: its beam
search (§6.1: beam 4, α 0.6, input + 50, early stopping) compiled ahead for every
interactive batch shape (batch_plan.interactive_shapes: each length bucket up to
--max-length sub-words, one row a device and 16 rows), then `--requests` one-line
requests, one after the other, each translate_ids of one sentence of a random length in
[4, --max-length] (seeded). Random weights rarely emit EOS, so most outputs run to their
limit: the slow end of what a trained model costs.

One JSON line per config: the shapes and the seconds compiling them took, then again in a
second start that finds them in the compilation cache (a temporary one), the first
request of a decoder that compiles when it meets a shape (what a request waited before),
and the p50 / p95 / max seconds of the requests after compiling ahead. Decoding runs as
translate runs it: on a CPU, one JAX device per core.

With --workdir (a trained run, such as `make demo`'s runs/demo), the feeds instead: the
first --lines lines of --text (default: the run's own demo test set) translated by
`python -m t2t_jax.main --mode=translate` as a user runs it, fed three ways, in rounds of
each in turn: `--input=FILE`, `--input=- < FILE` and `cat FILE | ... --input=-`. Each
command starts with an empty compilation cache of its own, as a first run does. One JSON
line: each feed's seconds (min over rounds), its ratio to the file's, whether its output is
the file's, and the exit delay of the streams: seconds from their last output byte to the
process's end (what compilations still running at the end of the input cost).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import common  # benchmarks/common.py: the repository on sys.path

# XLA's CPU flags in main: xla.configure_cpu(decoding=True), as translate sets them.
common.start(__name__, xla_flags=False)

import jax
import numpy as np

from t2t_jax.decoding import batch_plan
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import ahead, xla
from t2t_jax.platform.mesh import make_mesh, replicated


def request_lengths(count: int, max_length: int, seed: int = 0) -> list[int]:
  """Sub-words (EOS included) of each request: uniform in [4, max_length]."""
  return np.random.default_rng(seed).integers(4, max_length + 1, count).tolist()


def sentence(length: int, vocab_size: int, seed: int) -> list[int]:
  ids = common.random_sources(1, length, vocab_size, seed)[0]
  return ids.tolist()


def one_request(decoder, params, ids: list[int], config, mesh) -> float:
  """Seconds of translate_ids of one sentence in the interactive batches."""
  t0 = time.perf_counter()
  batch_plan.translate_ids(decoder, params, [ids], config, mesh, max_rows=16,
                           max_length=config.max_decode_input_length, show_progress=False)
  return time.perf_counter() - t0


def compile_ahead(model_config, config, mesh, params, shapes) -> tuple[float, object]:
  """(seconds, the search) of a new decoder compiled ahead for `shapes`, as
  Translator.compile_ahead does."""
  t0 = time.perf_counter()
  pool = ahead.make_pool(max(ahead.default_threads(), 1))
  search = ahead.searches(batch_plan.make_sharded_decoder(model_config, config, mesh), params,
                          shapes, mesh, pool=pool, name='beam search')
  pool.shutdown(wait=True)
  return time.perf_counter() - t0, search


def bench(name: str, args: argparse.Namespace) -> dict:
  config = common.get_config(name)
  config.max_decode_input_length = args.max_length
  model_config = ModelConfig.from_config(config).replace(deterministic=True)
  mesh = make_mesh()
  dummy = np.ones((1, 2), np.int32)
  params = jax.jit(lambda rng: Transformer(model_config).init(rng, dummy, dummy)['params'])(
      jax.random.PRNGKey(0))
  params = jax.device_put(params, replicated(mesh))
  vocab = model_config.vocab_size
  jitted = batch_plan.make_sharded_decoder(model_config, config, mesh)
  cold = one_request(jitted, params, sentence(args.max_length // 2, vocab, 99), config, mesh)
  shapes = batch_plan.interactive_shapes(config, mesh.size, max_rows=16,
                                         max_length=args.max_length)
  compile_s, _ = compile_ahead(model_config, config, mesh, params, shapes)
  # A second start finds every shape in the compilation cache the first one filled.
  cached_s, search = compile_ahead(model_config, config, mesh, params, shapes)
  seconds = [one_request(search, params, sentence(length, vocab, i), config, mesh)
             for i, length in enumerate(request_lengths(args.requests, args.max_length))]
  return common.emit({
      'benchmark': 'interactive', 'config': name, 'devices': mesh.size,
      'backend': jax.default_backend(), 'max_length': args.max_length, 'shapes': len(shapes),
      'compile_ahead_s': round(compile_s, 1), 'compile_ahead_cached_s': round(cached_s, 1),
      'first_request_compiling_s': round(cold, 2),
      'requests': args.requests, 'waits': search.waits,
      'p50_s': round(float(np.percentile(seconds, 50)), 3),
      'p95_s': round(float(np.percentile(seconds, 95)), 3),
      'max_s': round(max(seconds), 3)})


FEEDS = ('file', 'stdin', 'pipe')


def run_feed(feed: str, workdir: str, path: str, cache: str) -> tuple[float, float, bytes]:
  """(seconds, exit delay, output) of one translate command fed `path` as `feed`."""
  command = [sys.executable, '-m', 't2t_jax.main', '--mode=translate', f'--workdir={workdir}',
             f'--config.compilation_cache_dir={cache}',
             f'--input={path if feed == "file" else "-"}']
  if feed == 'pipe':
    command = ['bash', '-c', 'cat "$0" | "$@"', path, *command]
  t0 = time.perf_counter()
  with open(path if feed == 'stdin' else os.devnull, 'rb') as stdin, subprocess.Popen(
      command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      cwd=common.ROOT) as process:
    output, last = b'', t0
    while chunk := process.stdout.read1(1 << 16):
      output, last = output + chunk, time.perf_counter()
    process.wait()
  end = time.perf_counter()
  if process.returncode:
    raise SystemExit(f'{" ".join(command)}: exit status {process.returncode}')
  return end - t0, end - last, output


def feeds(args: argparse.Namespace) -> dict:
  """The same lines translated from a file, from stdin redirected and from a pipe."""
  text = args.text or os.path.join(args.workdir, 'demo_corpus', 'test.en')
  with open(text, encoding='utf-8') as f:
    lines = f.read().split('\n')[:args.lines]
  seconds: dict[str, list[float]] = {feed: [] for feed in FEEDS}
  delays: dict[str, list[float]] = {feed: [] for feed in FEEDS}
  outputs = {}
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'lines.txt')
    with open(path, 'w', encoding='utf-8') as f:
      f.write(''.join(line + '\n' for line in lines))
    for round_ in range(args.rounds):
      for feed in FEEDS:
        cache = os.path.join(tmp, f'cache-{feed}-{round_}')  # empty: a first run's cost
        took, delay, outputs[feed] = run_feed(feed, args.workdir, path, cache)
        seconds[feed].append(took)
        delays[feed].append(delay)
  best = {feed: min(times) for feed, times in seconds.items()}
  return common.emit({
      'benchmark': 'interactive_feeds', 'workdir': args.workdir, 'lines': len(lines),
      'cores': len(os.sched_getaffinity(0)), 'rounds': args.rounds,
      **{f'{feed}_s': round(best[feed], 2) for feed in FEEDS},
      **{f'{feed}_vs_file': round(best[feed] / best['file'], 2) for feed in FEEDS[1:]},
      **{f'{feed}_exit_delay_s': round(max(delays[feed]), 2) for feed in FEEDS[1:]},
      'same_output': all(outputs[feed] == outputs['file'] for feed in FEEDS)})


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='demo,base', help=','.join(common.CONFIGS))
  parser.add_argument('--requests', type=int, default=40)
  parser.add_argument('--max-length', type=int, default=64,
                      help='config.max_decode_input_length: the longest bucket compiled')
  parser.add_argument('--workdir', help='a trained run: time the feeds instead (above)')
  parser.add_argument('--text', help='--workdir: the lines to translate (default: its '
                      'demo_corpus/test.en)')
  parser.add_argument('--lines', type=int, default=40)
  parser.add_argument('--rounds', type=int, default=2)
  args = parser.parse_args()
  if args.workdir:
    feeds(args)
    return
  xla.configure_cpu(decoding=True)
  with tempfile.TemporaryDirectory() as cache:
    xla.enable_compilation_cache(cache)
    for name in args.configs.split(','):
      bench(name, args)


if __name__ == '__main__':
  main()
