"""XLA plumbing of a run: the persistent compilation cache.

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


def enable_compilation_cache(directory: str) -> None:
  """Reads and writes compiled executables in `directory` ('' = off; '~' is expanded).

  Only compilations that took JAX's `jax_persistent_cache_min_compile_time_secs` (1 s by
  default, env JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS) are kept: the train, eval and
  decoding steps, not the many small helpers. A torn entry (a run killed while writing it)
  only costs a warning and a recompilation: JAX checks what it reads.
  """
  if not directory:
    return
  path = os.path.expanduser(directory)
  jax.config.update('jax_compilation_cache_dir', path)
  logging.info('Compilation cache: %s (--config.compilation_cache_dir=\'\' turns it off)', path)
