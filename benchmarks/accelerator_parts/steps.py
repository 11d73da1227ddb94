"""The matmul, train, peer and batching parts: the chip's matmul rate, then the train step
against it (ours, flax's, and ours on real text)."""
from __future__ import annotations

import os

import common  # benchmarks/common.py: the repository on sys.path
import jax
import jax.numpy as jnp
import numpy as np

from accelerator_parts.shared import (
  compile_all,
  emit,
  model_config,
  prepare_train,
  time_steps,
  timed,
)
from t2t_jax.model.transformer import train_step_flops


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


def xla_flops(compiled) -> float:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float((cost or {}).get('flops', float('nan')))


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


def bench_batching(size: dict, out: str | None) -> list[dict]:
  """benchmarks/batchings.py's two lines: the train step on buckets and on packed rows."""
  import batchings  # benchmarks/batchings.py, only for this part
  data = 'wmt' if os.environ.get(common.WMT_SAMPLE) else 'demo'
  settings = size['batching']
  lines = batchings.run(settings['config'], data, settings['batches'], settings['rounds'],
                        settings['changes'])
  return [emit({'part': 'batching', **line}, out) for line in lines]
