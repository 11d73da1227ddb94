"""Several processes, one run: starting JAX's distributed runtime, and keeping hosts agreed.

Plumbing, not paper. A multi-process run (a TPU pod slice, GPU hosts under Slurm, or any
processes given a coordinator) is the same program on every process; these helpers make
every decision that could differ between hosts (a signal that reached one host, a clock
running out, a vocabulary built from another disk) the same on all of them, so that no
host waits forever in a collective the others never enter. In a single process every
helper is a no-op.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from typing import TypeVar

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from t2t_jax import errors

T = TypeVar('T')


def initialize(*, heartbeat_timeout_s: int = 60) -> None:
  """`jax.distributed.initialize()`, told JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID where they are set; elsewhere JAX finds the cluster itself (TPU VMs,
  Slurm, Open MPI, Kubernetes).

  A process that sends no heartbeat for `heartbeat_timeout_s` seconds counts as dead and
  the runtime stops all the others ("Terminating process because the JAX distributed
  service detected fatal errors"; a collective in flight may fail first, with gloo's or
  NCCL's error), so a dead host ends the run in bounded time instead of leaving the rest
  waiting in a collective; rerunning the command resumes.
  """
  env = os.environ
  kwargs = {}
  if env.get('JAX_COORDINATOR_ADDRESS'):
    kwargs['coordinator_address'] = env['JAX_COORDINATOR_ADDRESS']
  for key, name in (('num_processes', 'JAX_NUM_PROCESSES'), ('process_id', 'JAX_PROCESS_ID')):
    if env.get(name):
      try:
        kwargs[key] = int(env[name])
      except ValueError:
        raise errors.UserError(f'{name}={env[name]!r}: must be an integer') from None
  jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s, **kwargs)
  logging.info('Process %d of %d; %d local and %d global devices.', jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


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
  """`make()` on process 0 first; the others call it once process 0 is done, so that on a
  shared file system they load what process 0 wrote instead of building it again (and
  where hosts do not share the disk, each builds its own: `check_same` then compares)."""
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
