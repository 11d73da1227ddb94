"""XLA plumbing of a run: the CPU backend's flags and the persistent compilation cache.

A run meets tens of batch shapes (§5.1's length buckets), each a compilation, again after every
restart, eval and translate. The cache keeps the compiled executables on disk, keyed by JAX on
the computation, shapes, devices, flags and versions, so one directory serves every run and
machine safely.
"""
from __future__ import annotations

import os

import jax
from absl import logging
from jax.experimental.compilation_cache import compilation_cache

# Each shortens the train step or beam search on a CPU (docs/performance.md).
CPU_FLAGS = {
    # XLA:CPU hands reductions to YNNPACK by default; for the softmax over a 37k vocabulary,
    # where beam search spends much of its time, XLA's own loops are faster. Dots and
    # elementwise fusions keep YNNPACK.
    '--xla_cpu_experimental_ynn_fusion_type': '-reduce',
    # The scheduler that orders independent ops for concurrency puts big matmuls side by side,
    # each then getting part of the cores; in program order each gets them all, which shortens
    # the train step and beam search. Parameters and decoded ids are bitwise the same.
    '--xla_cpu_enable_concurrency_optimized_scheduler': 'false',
    # Region-based live-range analysis (off on CPU by default) sees that a while loop's carried
    # decoding cache is read before it is written in place, where the default copied every
    # layer's keys and values twice a decoding step. Decoded ids are bitwise the same.
    '--xla_cpu_copy_insertion_use_region_analysis': 'true',
}


# The train step's compiler_options: YNNPACK's default fusion set, reductions included, which
# CPU_FLAGS' '-reduce' narrows for decoding's sake. The train step's column sums (the gradients
# of biases and layer-norm gains over the batch's rows) run faster in YNNPACK than as XLA's
# trees of reduce-windows (docs/performance.md).
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


# Beam search on a CPU as one JAX device per core, each searching its own rows
# (batch_plan.make_sharded_decoder): on one device XLA:CPU splits every op over the cores, and
# each of a step's many small ops ends in a wait for the slowest thread; with a device per core
# the searches fill each other's gaps (docs/performance.md). Same output ids. At most
# MAX_DECODING_DEVICES, since every device streams its own copy of the parameters each step.
# Training keeps one device: it gains nothing, and its numbers would depend on the core count
# (each device draws its own dropout masks).
DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
MAX_DECODING_DEVICES = 4


def decoding_devices() -> int:
  """CPU devices for decoding: one per core this process may use, at most MAX_DECODING_DEVICES."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return max(1, min(cores or 1, MAX_DECODING_DEVICES))


def configure_cpu(*, decoding: bool = False) -> None:
  """Sets CPU_FLAGS in XLA_FLAGS; an explicit setting of a flag wins. `decoding`: also split
  the CPU into `decoding_devices()` devices, for processes that only decode (--mode=translate
  and eval). Entry points call it first: XLA reads the flags once, when JAX creates its CPU
  backend. GPU and TPU runs are unaffected."""
  flags = dict(CPU_FLAGS)
  if decoding:
    flags[DEVICE_COUNT_FLAG] = str(decoding_devices())
  for flag, value in flags.items():
    if flag not in os.environ.get('XLA_FLAGS', ''):
      os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {flag}={value}".strip()


def enable_compilation_cache(directory: str) -> None:
  """Reads and writes compiled executables in `directory` ('' = off; '~' is expanded): those
  that took `jax_persistent_cache_min_compile_time_secs` (the steps, not the small helpers). A
  torn entry costs a warning and a recompilation (JAX checks what it reads). A second call with
  the same directory changes nothing; another takes effect from the next compilation."""
  # None is off, also where the environment's JAX_COMPILATION_CACHE_DIR names a folder.
  path = os.path.expanduser(directory) if directory else None
  if path == jax.config.jax_compilation_cache_dir:
    return
  jax.config.update('jax_compilation_cache_dir', path)
  # JAX opens its cache once, at the first compilation; this makes it open the new one.
  compilation_cache.reset_cache()
  if path:
    logging.info('Compilation cache: %s (--config.compilation_cache_dir=\'\' turns it off)', path)
