"""Data parallelism as the pmap model: a 1-D mesh of every device, named 'data'.

Parameters are replicated; each batch enters as process-local numpy rows and becomes one global
array split along its rows, so the same code runs on one CPU, 8 GPUs, a TPU slice or several
hosts. The train and eval steps (train_step.py) and decoding run under `jax.shard_map` on it.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = 'data'  # the mesh axis the batch is split over


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh of all devices (of every process), named 'data'."""
  return Mesh(np.asarray(jax.devices() if devices is None else devices), (AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array: parameters and optimizer state."""
  return NamedSharding(mesh, P())


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Process-local rows -> one global array per key, split over the 'data' axis."""
  sharding = NamedSharding(mesh, P(AXIS))
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
