"""What every part of benchmarks/accelerator.py shares: the sizes, the model configs, timing,
compiling in threads, and the JSON lines it prints."""
from __future__ import annotations

import concurrent.futures
import os
import sys
import time

import common  # benchmarks/common.py: the repository on sys.path
import jax
import numpy as np

from t2t_jax.decoding import batch_plan, decode
from t2t_jax.model.transformer import ModelConfig, Transformer, train_step_flops
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step

ROOT = common.ROOT
ENTRY = os.path.join(common.BENCHMARKS, 'accelerator.py')  # what the child processes run
emit, random_ids = common.emit, common.random_ids
# Child processes share the GPU with this one, which holds most of its memory already.
CHILD_ENV = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
# What each size runs. 'tiny' keeps every code path at sizes a CPU runs in seconds. A size
# may also name 'kernels', config.model.kernels of every model (--kernels; default 'auto').
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


def model_config(name: str, size: dict, dtype: str, model: dict | None = None,
                 **modes) -> ModelConfig:
  """Config `name`'s model at `size` in `dtype`, with the config.model keys of `model` set
  last (a form of forms.py: 'kernels', 'dropout_rate'), then ModelConfig's mode flags."""
  config = common.get_config(name)
  config.model.kernels = size.get('kernels', 'auto')
  for key, value in size['model'].items():
    config.model[key] = value
  config.vocab_size = size.get('vocab_size', config.vocab_size)
  config.model.dtype = dtype
  for key, value in (model or {}).items():
    config.model[key] = value
  return ModelConfig.from_config(config).replace(**modes)


def timed(fn, repeats: int) -> float:
  """Median seconds of `repeats` calls of fn, after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def prepare_train(name: str, size: dict, dtype: str, model: dict | None = None):
  """(fields, lowered step, state, batch) of config `name`'s train step in `dtype`, with the
  config.model keys of `model` set."""
  c = model_config(name, size, dtype, model)
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


def time_steps(step, state, batch, steps: int) -> tuple[float, object]:
  """(median seconds of a train step, the last state), each step on the state the last one
  returned (the step donates it)."""
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], batch)
    return metrics
  return timed(run, steps), holder[0]


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


def failed(part: str, form: str, error: Exception, out: str | None) -> dict:
  return emit({'part': part, 'form': form, 'error': f'{type(error).__name__}: {error}'[:400]},
              out)


def progress(message: str, t0: float) -> None:
  print(f'# {message} at {time.perf_counter() - t0:.0f} s', file=sys.stderr, flush=True)
