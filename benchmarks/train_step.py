"""Train-step speed on this machine: tokens/s and achieved GFLOP/s, as JSON lines.

  python benchmarks/train_step.py [--configs base,demo] [--steps 5]

The base config runs the peers' benchmark shape: 32 sentences × 64 source tokens and
32 × 64 target tokens a step, no padding. FLOPs are XLA's own count of the compiled step.
The last line is the machine's float32 matmul GFLOP/s, for reference, and `matmul_fraction`
in each line is the step's share of it. `--peer` times the training step of flax's
`examples/wmt` (benchmarks/peers/flax_wmt.py) on the same shapes in the same process after
each config, and prints the ratio: only ratios from one run count on a shared machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if __name__ == '__main__':
  from t2t_jax import hugepages
  hugepages.reexec()  # before JAX is imported: glibc's huge pages for XLA's buffers

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments import demo, wmt_ende_base  # noqa: E402
from t2t_jax import mesh as mesh_lib  # noqa: E402
from t2t_jax import optim, train_step, xla  # noqa: E402
from t2t_jax.model import ModelConfig, Transformer  # noqa: E402

xla.configure_cpu()

SHAPES = {'base': (wmt_ende_base, 32, 64), 'demo': (demo, 64, 16)}  # config, rows, length


def random_batch(rows: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  ids = lambda: rng.integers(3, vocab_size, (rows, length), dtype=np.int32)  # noqa: E731
  return {'inputs': ids(), 'targets': ids()}


def bench_config(name: str, steps: int) -> dict:
  module, rows, length = SHAPES[name]
  config = module.get_config()
  model_config = ModelConfig.from_config(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, 0, mesh)
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  batch = mesh_lib.shard_batch(random_batch(rows, length, config.vocab_size), mesh)
  t0 = time.perf_counter()
  compiled = train_fn.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  params = int(sum(x.size for x in jax.tree_util.tree_leaves(state.params)))
  timing = time_steps(compiled, lambda state: compiled(state, batch), state, rows=rows,
                      length=length, steps=steps, compile_s=compile_s)
  return {'benchmark': 'train_step', 'config': name, 'params': params} | timing


def time_steps(compiled, run: Callable, state, *, rows: int, length: int, steps: int,
               compile_s: float) -> dict:
  """One warm-up step, then the median of `steps` timed ones of `run(state) -> (state,
  metrics)`: the JSON line's figures, for our step and the peer's alike. FLOPs are XLA's
  count of `compiled`."""
  cost = compiled.cost_analysis()
  flops = float((cost[0] if isinstance(cost, list) else cost).get('flops', float('nan')))
  state, metrics = run(state)  # warm-up
  jax.block_until_ready(metrics)
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, metrics = run(state)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  tokens = 2 * rows * length
  return {'batch': f'{rows}x{length}+{rows}x{length}',
          'step_seconds': round(step_s, 4), 'tokens_per_s': round(tokens / step_s, 1),
          'target_tokens_per_s': round(tokens / 2 / step_s, 1),
          'gflop_per_step': round(flops / 1e9, 2), 'gflop_per_s': round(flops / 1e9 / step_s, 1),
          'compile_seconds': round(compile_s, 1), 'devices': 1,
          'load_average_1min': round(os.getloadavg()[0], 2),
          'backend': jax.default_backend(), 'cpu_count': os.cpu_count(),
          'glibc_tunables': os.environ.get('GLIBC_TUNABLES', '')}  # huge pages or not


def bench_matmul(n: int = 2048, repeats: int = 10) -> dict:
  a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(repeats):
    f(a, a).block_until_ready()
  seconds = (time.perf_counter() - t0) / repeats
  return {'benchmark': 'matmul', 'shape': f'{n}x{n}x{n}', 'dtype': 'float32',
          'gflop_per_s': round(2 * n ** 3 / seconds / 1e9, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='base,demo')
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--peer', action='store_true', help="also flax examples/wmt's step")
  args = parser.parse_args()
  matmul = bench_matmul()
  for name in args.configs.split(','):
    ours = bench_config(name, args.steps)
    ours['matmul_fraction'] = round(ours['gflop_per_s'] / matmul['gflop_per_s'], 3)
    print(json.dumps(ours), flush=True)
    if args.peer:
      sys.path.insert(0, os.path.join(ROOT, 'benchmarks', 'peers'))
      import flax_wmt  # noqa: PLC0415 -- the peer, only when asked
      peer = flax_wmt.bench(name, args.steps)
      print(json.dumps(peer), flush=True)
      print(json.dumps({'benchmark': 'train_step_ratio', 'config': name,
                        't2t_jax_over_flax_examples_wmt': round(
                            peer['step_seconds'] / ours['step_seconds'], 3)}), flush=True)
  print(json.dumps(matmul), flush=True)


if __name__ == '__main__':
  main()
