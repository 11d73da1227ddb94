"""Data parallelism as the pmap model: a 1-D mesh of every device, named 'data'.

Parameters are replicated; each batch is split along its rows. Batches enter as
process-local numpy rows and become one global array, so the same code runs on one CPU,
8 GPUs, a TPU slice or several hosts (`jax.distributed`). The train and eval steps
(train_step.py) and decoding (evaluate.py) all run under `jax.shard_map` over this mesh.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = 'data'  # the mesh axis the batch is split over


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh of all devices (of every process), named 'data'."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device holds the whole array: parameters and optimizer state."""
  return NamedSharding(mesh, P())


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Process-local rows -> one global array per key, split over the 'data' axis."""
  sharding = NamedSharding(mesh, P(AXIS))
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
