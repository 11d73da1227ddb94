"""Memory of the train step with gradient accumulation (config.grad_accum_steps), as JSON lines.

  python benchmarks/grad_accum_memory.py [--config=base] [--rows=392] [--length=64] [--k=1,2,4]

Compiles (does not run) the train step of one device for a ~25k-token batch, §5.1's
(392 × 64 source and 392 × 64 target tokens: 25,088 each; 392 rows divide into 1, 2, 4
and 8 micro-batches), once for each k, and prints XLA's `memory_analysis()` of the
compiled step: `temp` holds the activations kept for the backward pass and the
workspace, which the k micro-batches divide (plus one gradient-sized accumulator);
`arguments` (params, Adam moments, the batch) and `outputs` do not change with k.
Runs on any backend; the state is abstract (jax.eval_shape), so nothing is allocated.
"""
from __future__ import annotations

import argparse
import time

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import jax
import numpy as np

from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step

MIB = 2 ** 20


def step_memory(config_name: str, rows: int, length: int, k: int, dtype: str = 'auto') -> dict:
  """memory_analysis() of the compiled train step for a [rows, length] + [rows, length] batch."""
  config = common.get_config(config_name)
  config.model.dtype = dtype
  model_config = ModelConfig.from_config(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  tx = optim.make_optimizer(config)
  state = jax.eval_shape(
      lambda: train_step.create_train_state(Transformer(model_config), tx, 0, mesh))
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh,
                                         grad_accum_steps=k)
  batch = {key: jax.ShapeDtypeStruct((rows, length), np.int32) for key in ('inputs', 'targets')}
  start = time.perf_counter()
  memory = train_fn.lower(state, batch).compile().memory_analysis()
  return {'benchmark': 'grad_accum_memory', 'config': config_name, 'grad_accum_steps': k,
          'batch': f'{rows}x{length}+{rows}x{length}', 'micro_batch_rows': rows // k,
          'temp_mib': round(memory.temp_size_in_bytes / MIB, 1),
          'arguments_mib': round(memory.argument_size_in_bytes / MIB, 1),
          'outputs_mib': round(memory.output_size_in_bytes / MIB, 1),
          'compile_seconds': round(time.perf_counter() - start, 1),
          'backend': jax.default_backend(), 'dtype': model_config.dtype}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  parser.add_argument('--rows', type=int, default=392)
  parser.add_argument('--length', type=int, default=64)
  parser.add_argument('--k', default='1,2,4', help='grad_accum_steps values, comma-separated')
  parser.add_argument('--dtype', default='auto', help="compute dtype (config.model.dtype): "
                      "'auto' (float32 on a CPU), 'bfloat16' (the Colab config's)")
  args = parser.parse_args()
  for k in (int(x) for x in args.k.split(',')):
    common.emit(step_memory(args.config, args.rows, args.length, k, args.dtype))


if __name__ == '__main__':
  main()
