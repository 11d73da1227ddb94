"""Compiling ahead: every batch shape of a run compiled in background threads before a step
needs it.

§5.1's length buckets give a WMT run tens of batch shapes (benchmarks/compilation.py), each a
compilation of the train step that, met unprepared, stalls stepping again and again through
the first epoch. The epoch plan knows the shapes (TrainBatches.batch_shapes), so `Precompiled`
compiles them all at once, first-needed first; dev BLEU's beam search likewise (`searches`).
Each executable is the one `jax.jit` would compile for its shapes.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from t2t_jax.platform.mesh import AXIS
from t2t_jax.platform.progress import Progress

BATCH_KEYS = ('inputs', 'targets')
# A packed batch's arrays beside those, each of its side's length (data/packing.py).
PACKED_KEYS = (('inputs_segmentation', 'inputs_position'),
               ('targets_segmentation', 'targets_position'))
Shape = tuple[int, int, int]  # global (rows, source length, target length)


def default_threads() -> int:
  """Background compilations at a time: a quarter of the cores, at most 8, since XLA compiles
  in parallel too and the training loop needs its share; none below 4 cores, where a
  compilation beside the step would take the step's cores (shapes are compiled when met)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  return min(8, (cores or 1) // 4)


def _abstract(tree: Any) -> Any:
  """Shapes, dtypes and shardings of an array tree, no buffers (a donated state's stay valid)."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding,
                                     weak_type=getattr(x, 'weak_type', False)), tree)


class Precompiled:
  """`fn(*args)` (a jitted function) run from executables compiled ahead, one per key (the
  shapes of the arguments that change from call to call), `keys` first-needed first on `pool`'s
  threads; without a pool, when first met, as jax.jit does. `abstract(key)`: a key's abstract
  arguments; `key_of(args)`: a call's key. `blocked_s`: seconds calls waited for a compilation;
  `compiled_on_call`: keys compiled on a caller's thread (not begun ahead, or unplanned).
  """

  def __init__(self, fn: Callable, keys: Sequence[Hashable],
               abstract: Callable[[Hashable], tuple], key_of: Callable[[tuple], Hashable], *,
               pool: concurrent.futures.ThreadPoolExecutor | None, name: str):
    self._fn, self._abstract, self._key_of = fn, abstract, key_of
    self._compiled: dict[Hashable, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self._progress_lock = threading.Lock()  # apart: a cancel under _lock runs callbacks
    self.blocked_s, self.waits, self.compiled_on_call = 0.0, 0, 0
    planned = list(dict.fromkeys(keys)) if pool else []
    if pool:
      logging.info('Compiling the %s for %d shapes ahead.', name, len(planned))
    self._planned, self._ready = set(planned), set()
    self._progress = Progress(f'Compiled ahead ({name})', len(planned), 'shapes',
                              enabled=jax.process_index() == 0, bar=False)
    for key in planned:
      self._compiled[key] = pool.submit(self._compile, key)
      self._compiled[key].add_done_callback(lambda f, key=key: self._compiled_one(key, f))

  def _compiled_one(self, key: Hashable, future: concurrent.futures.Future) -> None:
    """Counts a planned key's compilation done; the last one logs that all are ready."""
    if future.cancelled() or future.exception() is not None or key not in self._planned:
      return
    with self._progress_lock:  # a key completes once: a replaced future was cancelled
      self._ready.add(key)
      self._progress.update()
      if self._ready == self._planned:
        self._progress.close()

  def _compile(self, key: Hashable) -> Any:
    """The executable for arguments of `key`'s shapes (lowered, then compiled)."""
    return self._fn.lower(*self._abstract(key)).compile()

  def __call__(self, *args: Any) -> Any:
    key = self._key_of(args)
    with self._lock:
      future = self._compiled.get(key)
      # Not started yet (still queued behind other shapes), or outside the plan: compiled
      # here and now, as jax.jit would, rather than after everything queued before it.
      mine = future is None or future.cancel()
      if mine:
        future = self._compiled[key] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        future.add_done_callback(lambda f: self._compiled_one(key, f))
    t0 = time.perf_counter()
    if mine:
      self.compiled_on_call += 1
      try:
        future.set_result(self._compile(key))
      except BaseException as e:
        future.set_exception(e)
    compiled = future.result()
    waited = time.perf_counter() - t0
    if waited > 0.05:  # a compilation stood in the way (a dispatch takes microseconds)
      self.blocked_s, self.waits = self.blocked_s + waited, self.waits + 1
    return compiled(*args)


def steps(step: Callable, fixed: Any, shapes: Sequence[Shape], mesh: Mesh, *,
          pool: concurrent.futures.ThreadPoolExecutor | None, name: str,
          packed: bool = False) -> Precompiled:
  """A train or eval step, `step(fixed, batch)`, compiled ahead for batches of `shapes`:
  global (rows, S, T), packed ones (with segments and positions) if `packed`. `fixed` (the
  train state, or the parameters) keeps its shapes."""
  fixed = _abstract(fixed)
  sharding = NamedSharding(mesh, P(AXIS))

  def abstract(key: tuple) -> tuple:
    return fixed, {k: jax.ShapeDtypeStruct(shape, np.int32, sharding=sharding)
                   for side, shape in enumerate(key)
                   for k in (BATCH_KEYS[side], *(PACKED_KEYS[side] if packed else ()))}
  return Precompiled(step, [((rows, s), (rows, t)) for rows, s, t in shapes], abstract,
                     lambda args: tuple(tuple(args[1][k].shape) for k in BATCH_KEYS),
                     pool=pool, name=name)


def searches(search: Callable, params: Any, shapes: Sequence[tuple[int, int]], mesh: Mesh, *,
             pool: concurrent.futures.ThreadPoolExecutor | None, name: str,
             settings: Callable[[int], Any] | None = None) -> Precompiled:
  """A search, `search(params, src, settings)` (batch_plan.make_sharded_decoder), compiled
  ahead for sources of `shapes`: global (rows, S). `settings(rows)`: the abstract third
  argument for a batch of `rows` (None: beam search's α, a float32 scalar)."""
  params = _abstract(params)
  sharding = NamedSharding(mesh, P(AXIS))
  alpha = jax.ShapeDtypeStruct((), np.float32)

  def abstract(key: tuple[int, int]) -> tuple:
    return (params, jax.ShapeDtypeStruct(key, np.int32, sharding=sharding),
            alpha if settings is None else settings(key[0]))
  return Precompiled(search, list(shapes), abstract, lambda args: tuple(args[1].shape),
                     pool=pool, name=name)


def make_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor | None:
  """The background threads Precompiled compiles on (None for threads = 0: compile when met).
  Training runs inside `cancelled_on_exit(pool)`."""
  return (concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix='compile_ahead')
          if threads else None)


@contextlib.contextmanager
def cancelled_on_exit(pool: concurrent.futures.ThreadPoolExecutor | None) -> Iterator[None]:
  """On leaving, however training ends, drops the compilations not yet started: the process
  then exits once the running ones are done, not after every queued shape."""
  try:
    yield
  finally:
    if pool:
      pool.shutdown(wait=False, cancel_futures=True)
