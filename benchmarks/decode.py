"""Beam-search decoding speed on this machine (§6.1 settings), as JSON lines.

  python benchmarks/decode.py [--config base] [--sentences 64] [--uncached-sentences 2]
                              [--devices N] [--peer]

The base config with random weights decodes `sentences` × 32-token inputs with beam 4,
α = 0.6. Random weights never reliably emit EOS, so early stopping is off and every
sentence runs to its limit, input + 50 = 82 steps; tokens/s counts those 82 positions a
sentence (the peers' benchmark shape).

The uncached reference re-runs the decoder over the whole current segment of positions
each step (16, 32, 64 or 82: static shapes, see decode.segment_lengths; a mean of 52.3
positions a step against 41.5 for an exactly growing prefix). It is slow, so it gets fewer
sentences; the cached search is timed again on that same batch for a like-for-like ratio.

Decoding runs as `--mode=translate` and `--mode=eval` run it: on a CPU, one JAX device per
core (xla.configure_cpu(decoding=True); `--devices N` for N), each beam-searching its share
of the sentences (the mesh's data parallelism), and the JSON lines say how many.

`--peer` times the PyTorch peer (benchmarks/peers/torch_decode.py: the same shapes, a
growing key/value cache reordered each step) in the same process after ours, and prints the
ratio: only ratios from one run count on a shared machine.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import time

import common  # benchmarks/common.py: the repository on sys.path

# XLA's CPU flags in main, after --devices: xla.configure_cpu(decoding=True).
common.start(__name__, xla_flags=False)

import jax
import numpy as np
from jax.sharding import Mesh

from t2t_jax.decoding import batch_plan, decode
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import xla
from t2t_jax.platform.mesh import make_mesh, replicated, shard_batch


def sharded_search(model_config: ModelConfig, args: argparse.Namespace, mesh: Mesh, *,
                   use_cache: bool):
  """decode.beam_search as batch_plan.make_sharded_decoder runs it: each device searches its
  own rows; early stopping off (see above)."""
  def search(params, src, alpha):
    return decode.beam_search(params, src, alpha=alpha, config=model_config,
                              beam_size=args.beam, extra_length=args.extra_length,
                              early_stop=False, use_cache=use_cache)
  return batch_plan.shard_rows(search, mesh)


def time_decode(params, src: np.ndarray, args: argparse.Namespace, model_config, *,
                use_cache: bool) -> dict:
  """Compiles once, warms up once, then times `args.repeats` runs (median)."""
  mesh = make_mesh()
  params, alpha = jax.device_put(params, replicated(mesh)), np.float32(0.6)
  sharded_src = shard_batch({'src': src}, mesh)['src']
  t0 = time.perf_counter()
  compiled = sharded_search(model_config, args, mesh, use_cache=use_cache).lower(
      params, sharded_src, alpha).compile()
  compile_s = time.perf_counter() - t0
  run = lambda: compiled(params, sharded_src, alpha)  # noqa: E731 -- α is traced, not static
  jax.block_until_ready(run())  # warm-up
  load = os.getloadavg()[0]  # other processes share the CPU: a high load means slower runs
  walls, cpus = [], []
  for _ in range(args.repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    ids, _ = run()
    jax.block_until_ready(ids)
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  wall = float(np.median(walls))
  rows, steps = src.shape[0], src.shape[1] + args.extra_length
  return {'benchmark': 'decode', 'config': args.config, 'cache': use_cache,
          'sentences': rows, 'input_tokens': src.shape[1], 'beam_size': args.beam,
          'devices': mesh.size,
          'steps': steps, 'early_stop': False, 'seconds': round(wall, 3),
          'sentences_per_s': round(rows / wall, 3),
          'output_tokens_per_s': round(rows * steps / wall, 1),
          'best_output_tokens': int((np.asarray(ids) != 0).sum()),
          # The output itself, to compare runs and code versions by: the same ids, the same hash.
          'ids_sha1': hashlib.sha1(np.asarray(ids).tobytes()).hexdigest()[:12],
          'cpu_seconds_per_wall_second': round(float(np.median(cpus)) / wall, 2),
          'load_average_1min': round(load, 2),
          'compile_seconds': round(compile_s, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  parser.add_argument('--sentences', type=int, default=64)
  parser.add_argument('--length', type=int, default=32)
  parser.add_argument('--beam', type=int, default=4)
  parser.add_argument('--extra-length', type=int, default=50)
  parser.add_argument('--uncached-sentences', type=int, default=2, help='0: skip')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--devices', type=int, default=0,
                      help='CPU devices (0: one per core, as --mode=translate uses)')
  parser.add_argument('--peer', action='store_true', help='also the PyTorch peer')
  args = parser.parse_args()
  if args.devices:  # an explicit setting wins over configure_cpu's
    os.environ['XLA_FLAGS'] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               f'{xla.DEVICE_COUNT_FLAG}={args.devices}')
  xla.configure_cpu(decoding=True)  # before anything starts JAX's CPU backend
  model_config = ModelConfig.from_config(common.get_config(args.config)).replace(
      deterministic=True)
  dummy = np.ones((1, 2), np.int32)
  params = jax.jit(lambda rng: Transformer(model_config).init(rng, dummy, dummy)['params'])(
      jax.random.PRNGKey(0))
  # Word ids ending in EOS, no padding: every sentence has the full limit.
  src = common.random_sources(args.sentences, args.length, model_config.vocab_size)
  fields = {'backend': jax.default_backend(), 'cpu_count': os.cpu_count(),
            'glibc_tunables': os.environ.get('GLIBC_TUNABLES', '')}  # huge pages or not
  ours = time_decode(params, src, args, model_config, use_cache=True)
  common.emit(ours | fields)
  if args.peer:
    torch_decode = common.import_peer('torch_decode')  # the peer, and torch, only when asked
    peer = torch_decode.bench(torch_decode.parse_args([
        f'--config={args.config}', f'--sentences={args.sentences}', f'--length={args.length}',
        f'--beam={args.beam}', f'--extra-length={args.extra_length}',
        f'--repeats={args.repeats}']))
    common.emit(peer)
    common.emit({'benchmark': 'decode_ratio', 'config': args.config,
                 't2t_jax_over_pytorch': round(peer['seconds'] / ours['seconds'], 3)})
  if args.uncached_sentences:
    devices = jax.device_count()  # rows: a multiple of the devices
    small = src[:-(-args.uncached_sentences // devices) * devices]
    cached = time_decode(params, small, args, model_config, use_cache=True)
    uncached = time_decode(params, small, args, model_config, use_cache=False)
    steps = small.shape[1] + args.extra_length
    segments = decode.segment_lengths(steps)
    recomputed = [next(n for n in segments if t < n) for t in range(steps)]
    uncached['mean_positions_recomputed_per_step'] = round(float(np.mean(recomputed)), 1)
    uncached['cache_speedup'] = round(uncached['seconds'] / cached['seconds'], 2)
    for result in (cached, uncached):
      common.emit(result | fields)


if __name__ == '__main__':
  main()
