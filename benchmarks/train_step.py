"""Train-step speed on this machine: tokens/s and achieved GFLOP/s, as JSON lines.

  python benchmarks/train_step.py [--configs base,demo] [--steps 5] [--peer [--rounds 3]]

The base config runs the peers' benchmark shape: 32 sentences × 64 source tokens and
32 × 64 target tokens a step, no padding. FLOPs are XLA's own count of the compiled step.
The last line is the machine's float32 matmul GFLOP/s, for reference, and `matmul_fraction`
in each line is the step's share of it. `--peer` times the training step of flax's
`examples/wmt` (benchmarks/peers/flax_wmt.py) on the same shapes in the same process, and
prints the ratio: only ratios from one run count on a shared machine. `--rounds` > 1
alternates the two, `steps` steps each a round, so that the machine's slower spells fall on
both; step_seconds is then the median over all rounds, and each round's ratio is printed.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import jax
import jax.numpy as jnp
import numpy as np

from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step

# The peers' benchmark shapes: rows × length source tokens and as many target tokens a step.
SHAPES = {'base': (32, 64), 'demo': (64, 16)}


def random_batch(rows: int, length: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  ids = lambda: rng.integers(3, vocab_size, (rows, length), dtype=np.int32)  # noqa: E731
  return {'inputs': ids(), 'targets': ids()}


@dataclasses.dataclass
class Runner:
  """A compiled step ready to time, `run(state) -> (state, metrics)`, at `state`, with its
  JSON line's fixed fields: ours (prepare) and the peer's (peers/flax_wmt.prepare) alike."""
  fields: dict
  compiled: Any
  run: Callable
  state: Any
  rows: int
  length: int
  compile_s: float


def prepare(name: str) -> Runner:
  """Our train step for config `name`, compiled and warmed up by one step."""
  rows, length = SHAPES[name]
  config = common.get_config(name)
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
  runner = Runner({'benchmark': 'train_step', 'config': name, 'params': params}, compiled,
                  lambda state: compiled(state, batch), state, rows, length, compile_s)
  timed_steps(runner, 1)  # warm-up
  return runner


def timed_steps(runner: Runner, steps: int) -> list[float]:
  """Seconds of each of `steps` steps, run one after another from the runner's state."""
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    runner.state, metrics = runner.run(runner.state)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  return times


def summary(runner: Runner, rounds: list[list[float]]) -> dict:
  """The JSON line: the median of every timed step of every round, for our step and the
  peer's alike; FLOPs are XLA's count of the compiled step."""
  cost = runner.compiled.cost_analysis()
  flops = float((cost[0] if isinstance(cost, list) else cost).get('flops', float('nan')))
  step_s = float(np.median([t for times in rounds for t in times]))
  tokens = 2 * runner.rows * runner.length
  return runner.fields | {
      'batch': f'{runner.rows}x{runner.length}+{runner.rows}x{runner.length}',
      'step_seconds': round(step_s, 4), 'tokens_per_s': round(tokens / step_s, 1),
      'target_tokens_per_s': round(tokens / 2 / step_s, 1),
      'gflop_per_step': round(flops / 1e9, 2), 'gflop_per_s': round(flops / 1e9 / step_s, 1),
      'round_step_seconds': [round(float(np.median(times)), 4) for times in rounds],
      'compile_seconds': round(runner.compile_s, 1), 'devices': 1,
      'load_average_1min': round(os.getloadavg()[0], 2),
      'backend': jax.default_backend(), 'cpu_count': os.cpu_count(),
      'glibc_tunables': os.environ.get('GLIBC_TUNABLES', '')}  # huge pages or not


def bench(runners: list[Runner], steps: int, rounds: int) -> list[dict]:
  """`rounds` rounds of `steps` steps of each runner in turn (ours, then the peer's), so
  that a slower spell of the shared machine slows both, not whichever ran in it alone."""
  times = [[] for _ in runners]
  for _ in range(rounds):
    for runner, runner_times in zip(runners, times, strict=True):
      runner_times.append(timed_steps(runner, steps))
  return [summary(runner, runner_times)
          for runner, runner_times in zip(runners, times, strict=True)]


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
  parser.add_argument('--steps', type=int, default=5, help='timed steps a round')
  parser.add_argument('--rounds', type=int, default=1, help='rounds, alternating with the peer')
  parser.add_argument('--peer', action='store_true', help="also flax examples/wmt's step")
  args = parser.parse_args()
  matmul = bench_matmul()
  for name in args.configs.split(','):
    runners = [prepare(name)]
    if args.peer:
      flax_wmt = common.import_peer('flax_wmt')  # the peer, only when asked
      runners.append(flax_wmt.prepare(name))
    lines = bench(runners, args.steps, args.rounds)
    lines[0]['matmul_fraction'] = round(lines[0]['gflop_per_s'] / matmul['gflop_per_s'], 3)
    for line in lines:
      common.emit(line)
    if args.peer:
      ours, peer = lines
      ratios = [p / o for p, o in zip(peer['round_step_seconds'], ours['round_step_seconds'],
                                      strict=True)]
      common.emit({'benchmark': 'train_step_ratio', 'config': name,
                   't2t_jax_over_flax_examples_wmt': round(
                       peer['step_seconds'] / ours['step_seconds'], 3),
                   'round_ratios': [round(r, 3) for r in ratios]})
    del runners, lines  # one config's states at a time
  common.emit(matmul)


if __name__ == '__main__':
  main()
