"""Checkpoint save time, restore time and on-disk size for a config (base by default).

  python benchmarks/checkpoint.py [--config base|big|demo]

Prints one JSON object. The state has taken one real update first. Save is timed
to completion; `save_blocking_seconds` is what the training loop waits for (orbax copies to
host, then writes in the background); restore is a fresh restore
of the latest checkpoint, as a resumed run does.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import jax
import numpy as np

from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import checkpoints, optim, train_step


def directory_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path)
             for f in files)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  args = parser.parse_args()
  config = common.get_config(args.config)
  model_config = ModelConfig.from_config(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  tx = optim.make_optimizer(config)
  state = train_step.create_train_state(Transformer(model_config), tx, 0, mesh)
  # One real update, so that Adam's moments are not all zeros (zeros compress to nothing).
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  rng = np.random.default_rng(0)
  batch = {k: rng.integers(3, config.vocab_size, (8, 32), dtype=np.int32)
           for k in ('inputs', 'targets')}
  state, _ = train_fn(state, mesh_lib.shard_batch(batch, mesh))
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as workdir:
    saver = checkpoints.Checkpointer(workdir, keep=2)
    t0 = time.perf_counter()
    saver.save(state, {'epoch': 0, 'batch': 0})
    blocking = time.perf_counter() - t0
    saver.wait()
    save = time.perf_counter() - t0
    saver.close()
    size = directory_bytes(os.path.join(workdir, 'checkpoints'))
    loader = checkpoints.Checkpointer(workdir, keep=2)
    t0 = time.perf_counter()
    restored, _ = loader.restore(state)
    jax.block_until_ready(restored)
    restore = time.perf_counter() - t0
    loader.close()
  params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
  common.emit({'benchmark': 'checkpoint', 'config': args.config, 'params': int(params),
               'save_seconds': round(save, 2), 'save_blocking_seconds': round(blocking, 2),
               'restore_seconds': round(restore, 2), 'size_mb': round(size / 2**20, 1),
               'bytes_per_param': round(size / params, 2)})


if __name__ == '__main__':
  main()
