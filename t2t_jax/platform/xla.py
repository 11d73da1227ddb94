"""XLA plumbing of a run: the CPU backend's flags and the persistent compilation cache.

Every distinct batch shape is a compilation (seconds on a CPU, 15-30 s for a base step on a
GPU), and a run meets tens of shapes (§5.1's length buckets), again after every restart,
eval and translate. The cache keeps the compiled executables on disk, keyed by JAX on the
computation, shapes, devices, flags and versions, so one directory serves every run and
machine safely: a restart loads what an earlier invocation compiled.
"""
from __future__ import annotations

import os

import jax
from absl import logging
from jax.experimental.compilation_cache import compilation_cache

CPU_FLAGS = {
    # XLA:CPU hands reductions to YNNPACK by default (jaxlib 0.10); for the softmax over a
    # 37k vocabulary XLA's own loops are faster, and beam search spends much of its time
    # there, so this shortens decoding (docs/performance.md). Dots and elementwise fusions
    # keep YNNPACK.
    '--xla_cpu_experimental_ynn_fusion_type': '-reduce',
    # The scheduler that orders independent ops for concurrency puts big matmuls side by
    # side, each then getting part of the cores; in program order each gets them all, which
    # shortens both the train step and beam search (docs/performance.md). Parameters and
    # decoded ids are bitwise the same either way.
    '--xla_cpu_enable_concurrency_optimized_scheduler': 'false',
    # Copy insertion with region-based live-range analysis (XLA's default off on CPU): it
    # sees that a while loop's carried decoding cache is read before it is written in place,
    # where the default analysis copied every layer's keys and values twice a step (at 82
    # positions, 12 arrays of 43 MB). It saves those copies of the cache in every decoding
    # step (docs/performance.md); decoded ids are bitwise the same, and the train step,
    # which has no such loop, is unaffected.
    '--xla_cpu_copy_insertion_use_region_analysis': 'true',
}


# Per computation (jax.jit's compiler_options), for the train step only: its reductions back
# to YNNPACK. CPU_FLAGS takes them from it for decoding's sake (and the eval step's, whose
# reductions are the same rows over the vocabulary), but the train step's column sums (the
# gradients of biases and layer-norm gains over the batch's rows) run faster there than as
# XLA's trees of reduce-windows, which shortens the base train step (docs/performance.md;
# the demo's step, whose reductions are small, gains nothing). The value is YNNPACK's
# default set, which XLA_FLAGS' '-reduce' narrows to DOT and INDIVIDUAL_DOT.
_YNN_WITH_REDUCE = ('LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,'
                    'LIBRARY_FUSION_TYPE_REDUCE')


def step_compiler_options() -> dict[str, str]:
  """jax.jit compiler_options for the train step: on a CPU, YNNPACK reductions (unless
  XLA_FLAGS sets the flag itself); nothing on other backends."""
  flag = '--xla_cpu_experimental_ynn_fusion_type'
  ours = f'{flag}={CPU_FLAGS[flag]}'  # what configure_cpu sets; anything else is the user's
  flags = os.environ.get('XLA_FLAGS', '')
  if jax.default_backend() != 'cpu' or (flag in flags and ours not in flags):
    return {}
  return {'xla_cpu_experimental_ynn_fusion_type': _YNN_WITH_REDUCE}


# Beam search on a CPU as one JAX device per core, each searching its own rows (the mesh's
# data parallelism, batch_plan.make_sharded_decoder). On one device XLA:CPU splits every op
# over the cores, and a step's ~400 mostly small ops each end in a wait for the slowest
# thread; with a device per core the searches fill each other's gaps, which saves those idle
# waits and context switches (docs/performance.md). Same output ids. Two devices a core
# gain nothing more. At most MAX_DECODING_DEVICES: every device holds its own copy of the
# parameters and streams them every step, and splits the decoding batch further (larger
# counts are untried). Training keeps one device: its base step gains nothing (Adam and the
# gradients' sum are then done on both), and its numbers would depend on the core count
# (each device draws its own dropout masks).
DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
MAX_DECODING_DEVICES = 4


def decoding_devices() -> int:
  """CPU devices for decoding: one per core this process may run on, at most
  MAX_DECODING_DEVICES."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return max(1, min(cores or 1, MAX_DECODING_DEVICES))


def configure_cpu(*, decoding: bool = False) -> None:
  """Sets this codebase's XLA:CPU flags (CPU_FLAGS) in XLA_FLAGS; an explicit setting of a
  flag wins. `decoding`: also split the CPU into `decoding_devices()` devices (see
  DEVICE_COUNT_FLAG above), for processes that only decode (--mode=translate and eval).

  Entry points call it first (main.py, the benchmarks, tests/conftest.py): XLA reads the
  flags once, when JAX creates its CPU backend, so a later call changes nothing. Only CPU
  compilation reads them; GPU and TPU runs are unaffected (the CPU devices are then not
  the ones a mesh is made of).
  """
  flags = dict(CPU_FLAGS)
  if decoding:
    flags[DEVICE_COUNT_FLAG] = str(decoding_devices())
  for flag, value in flags.items():
    if flag not in os.environ.get('XLA_FLAGS', ''):
      os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={value}".strip()


def enable_compilation_cache(directory: str) -> None:
  """Reads and writes compiled executables in `directory` ('' = off; '~' is expanded).

  Only compilations that took JAX's `jax_persistent_cache_min_compile_time_secs` (1 s by
  default, env JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS) are kept: the train, eval and
  decoding steps, not the many small helpers. A torn entry (a run killed while writing it)
  only costs a warning and a recompilation: JAX checks what it reads. Both the command line
  and the Translator call it with config.compilation_cache_dir; a second call with the same
  directory changes nothing, another directory takes effect from the next compilation.
  """
  # None is off, also where the environment's JAX_COMPILATION_CACHE_DIR names a folder.
  path = os.path.expanduser(directory) if directory else None
  if path == jax.config.jax_compilation_cache_dir:
    return
  jax.config.update('jax_compilation_cache_dir', path)
  # JAX opens its cache once, at the first compilation; this makes it open the new one.
  compilation_cache.reset_cache()
  if path:
    logging.info('Compilation cache: %s (--config.compilation_cache_dir=\'\' turns it off)', path)
