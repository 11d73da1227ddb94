"""The flags and compile parts, which run benchmarks/accelerator.py again in fresh processes
(XLA reads its flags once; a cold compilation needs a process that has compiled nothing), and
the probes those processes run (--probe-step, --probe-compile)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from accelerator_parts.shared import (
  CHILD_ENV,
  ENTRY,
  SIZES,
  decode_params,
  emit,
  failed,
  prepare_search,
  prepare_train,
  time_search,
  time_steps,
)
from t2t_jax.platform import mesh as mesh_lib

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
      result = subprocess.run([sys.executable, ENTRY, '--probe-step', '--size', size_name],
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
      result = subprocess.run([sys.executable, ENTRY, '--probe-compile', '--size', size_name],
                              env=env, capture_output=True, text=True, check=True)
      probe = json.loads(result.stdout.strip().splitlines()[-1])
      lines.append(emit({'part': 'compile', 'config': 'base', 'dtype': 'bfloat16', 'cache': run,
                         **probe, 'process_s': round(time.perf_counter() - t0, 1)}, out))
  return lines
