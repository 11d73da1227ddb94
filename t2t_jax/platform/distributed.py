"""Several processes, one run: starting JAX's distributed runtime, and keeping hosts agreed.

A multi-process run (a TPU pod slice, GPU hosts under Slurm) is the same program on every
process; these helpers make every decision that could differ between hosts (a signal that
reached one host, a clock running out, a vocabulary built from another disk) the same on all,
so that no host waits forever in a collective the others never enter. In one process, no-ops.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from t2t_jax.platform import errors

T = TypeVar('T')


def initialize(*, heartbeat_timeout_s: int = 60, start_timeout_s: int = 300) -> None:
  """`jax.distributed.initialize()`, told JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID where set; elsewhere JAX finds the cluster itself (TPU VMs, Slurm, Open MPI,
  Kubernetes). A process silent for `heartbeat_timeout_s` counts as dead and the runtime stops
  all the others, so that a dead host ends the run in bounded time (rerunning resumes); one
  still waiting for the others after `start_timeout_s` ends with one line naming them.
  """
  kwargs = {}
  if os.environ.get('JAX_COORDINATOR_ADDRESS'):
    kwargs['coordinator_address'] = os.environ['JAX_COORDINATOR_ADDRESS']
  for key, name in (('num_processes', 'JAX_NUM_PROCESSES'), ('process_id', 'JAX_PROCESS_ID')):
    if value := os.environ.get(name):
      try:
        kwargs[key] = int(value)
      except ValueError:
        raise errors.UserError(f'{name}={value!r}: must be an integer') from None
  with _waiting_for_peers(kwargs, start_timeout_s):
    # JAX's deadline after ours: ours ends the process first, with a message.
    try:
      jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s,
                                 initialization_timeout=start_timeout_s + 30, **kwargs)
    except ValueError as e:
      if 'coordinator_address' not in str(e) or 'coordinator_address' in kwargs:
        raise
      raise errors.UserError(
          '--distributed: no cluster to join (JAX found none: not a TPU VM, Slurm, Open MPI '
          'or Kubernetes job); set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and '
          'JAX_PROCESS_ID, or leave --distributed out on one machine') from None
  logging.info('Process %d of %d; %d local and %d global devices.', jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


WAIT_LOG_S = 30.0  # between the lines that say who is still awaited


@contextlib.contextmanager
def _waiting_for_peers(kwargs: dict, timeout_s: float) -> Iterator[None]:
  """Logs every WAIT_LOG_S, while inside, that this process waits for the others to connect;
  past `timeout_s` it writes one line naming them and exits with status 1 (JAX blocks in C++
  there, and its own timeout would abort with a C++ stack trace)."""
  me, count = kwargs.get('process_id'), kwargs.get('num_processes')
  where = kwargs.get('coordinator_address', "the cluster's coordinator")
  others = (', '.join(str(i) for i in range(count) if i != me)
            if me is not None and count else 'the others')
  who = f'process {me} of {count}' if me is not None and count else 'this process'
  connected = threading.Event()

  def watch() -> None:
    start = time.monotonic()
    while not connected.wait(min(WAIT_LOG_S, max(timeout_s - (time.monotonic() - start), 0))):
      waited = time.monotonic() - start
      if waited >= timeout_s:
        sys.stderr.write(f't2t_jax: error: --distributed: {who} waited {waited:.0f} s at '
                         f'{where} for process(es) {others}, which never connected; start '
                         'them (same JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES), or '
                         'raise --distributed_start_timeout\n')
        sys.stderr.flush()
        os._exit(1)
      logging.info('%s: waiting %.0f s so far at %s for process(es) %s to connect (at most '
                   '%d s).', who.capitalize(), waited, where, others, timeout_s)
  threading.Thread(target=watch, name='distributed_start', daemon=True).start()
  try:
    yield
  finally:
    connected.set()


def agree(values: np.ndarray) -> np.ndarray:
  """The element-wise maximum of `values` over all processes: a flag any host raised is
  raised on every host (True > False), and every host sees the same numbers."""
  values = np.asarray(values)
  if jax.process_count() == 1:
    return values
  return np.asarray(multihost_utils.process_allgather(values)).max(axis=0)


def sync(name: str) -> None:
  """Waits until every process gets here."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def first_then_others(name: str, make: Callable[[], T]) -> T:
  """`make()` on process 0 first, then on the others, so that on a shared file system they
  load what process 0 wrote instead of building it again (`check_same` compares)."""
  if jax.process_index() == 0:
    result = make()
  sync(f'{name}_built')
  if jax.process_index() != 0:
    result = make()
  return result


def check_same(fingerprints: dict[str, str]) -> None:
  """Every process must have the same fingerprints (config, vocabulary, data): a mismatch
  is the same clear error on every host, not a hang in the first collective."""
  if jax.process_count() == 1:
    return
  names = sorted(fingerprints)
  mine = np.array([int.from_bytes(hashlib.sha256(fingerprints[n].encode()).digest()[:7], 'big')
                   for n in names], np.int64)
  every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, names]
  differ = [n for i, n in enumerate(names) if len(set(every[:, i].tolist())) > 1]
  if differ:
    raise errors.UserError(
        f'The processes of this run differ in their {", ".join(differ)} (process '
        f'{jax.process_index()} of {jax.process_count()} has {[fingerprints[n] for n in differ]}): '
        'give every process the same command and config, and the same workdir on a file '
        'system every host shares, so that they read one vocabulary, one data cache and one '
        'set of checkpoints.')
