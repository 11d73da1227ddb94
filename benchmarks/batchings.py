"""The train step on real text, §5.1's length buckets against packed rows, as JSON lines.

  python benchmarks/batchings.py [--config=base] [--batches=6] [--rounds=2] [--data=wmt]

Both batchings cut the same pairs into batches of config.tokens_per_batch slots a side: the
real 10k-pair WMT sample ($T2T_WMT_SAMPLE, an 8000-piece vocabulary; --data=wmt) or the
built-in demo corpus (--data=demo, for a machine without the sample). The train step of
--config (its 'auto' dtype and forms, one device) takes the first --batches batches of
epoch 0 of each; every distinct shape among them is compiled first (counted, untimed), then
`rounds` rounds alternate the batchings, every batch once a round, so that a slower spell of
a shared machine slows both. Each line: real (non-padding) target tokens a second, real
source and target tokens a second, mean step seconds, the padding efficiency of those
batches, their shapes and the seconds compiling them took. Packing trades padding and
compilations for attention over longer rows: this is what decides config.batching='auto'
(rules.batching_of) on a platform.
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

from t2t_jax.data import pipeline
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step

BATCHINGS = ('buckets', 'packed')


def make_config(name: str, data: str, batching: str, changes: dict):
  """--config on the chosen text, with `batching` and `changes` (keys of the config)."""
  config = common.get_config(name)
  config.batching = batching
  if data == 'wmt':
    config.dataset = 'files'
    config.train_files = common.wmt_sample('train')
    config.dev_files = common.wmt_sample('newstest2013')
    config.test_files = ''
    config.vocab_size = 8000  # a 10k-pair sample cannot support 37000 pieces
  else:
    demo = common.get_config('demo')
    for key in ('dataset', 'demo_num_train', 'demo_num_eval', 'demo_seed', 'vocab_size',
                'vocab_sample_sentences'):
      config[key] = demo[key]
  changes = dict(changes)
  config.model.update(changes.pop('model', {}))
  config.update(changes)
  return config


def batches(config, workdir: str, count: int) -> list[dict[str, np.ndarray]]:
  """The first `count` batches of epoch 0 (fewer if the epoch has fewer)."""
  train = pipeline.get_datasets(config, workdir, num_devices=1).train
  return [next(train) for _ in range(min(count, train.plan(0).num_batches))]


class Stepper:
  """The train step of `config` on one device, each batch shape compiled once, ahead."""

  def __init__(self, config, batches: list[dict[str, np.ndarray]]):
    model_config = ModelConfig.from_config(config)
    self.mesh = mesh_lib.make_mesh(jax.devices()[:1])
    tx = optim.make_optimizer(config)
    self.state = train_step.create_train_state(Transformer(model_config), tx, 0, self.mesh)
    train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, self.mesh)
    self.batches = [mesh_lib.shard_batch(b, self.mesh) for b in batches]
    self.compiled, self.compile_s = {}, 0.0
    for batch in self.batches:
      key = self.key(batch)
      if key not in self.compiled:
        t0 = time.perf_counter()
        self.compiled[key] = train_fn.lower(self.state, batch).compile()
        self.compile_s += time.perf_counter() - t0
    self.seconds = 0.0
    self.run_round()  # warm-up, untimed
    self.seconds = 0.0

  @staticmethod
  def key(batch) -> tuple:
    return tuple(batch['inputs'].shape) + tuple(batch['targets'].shape)

  def run_round(self) -> None:
    for batch in self.batches:
      t0 = time.perf_counter()
      self.state, metrics = self.compiled[self.key(batch)](self.state, batch)
      jax.block_until_ready(metrics)
      self.seconds += time.perf_counter() - t0


def line(name: str, batching: str, data: str, host_batches, stepper: Stepper, rounds: int,
         ) -> dict:
  real_src = sum(int(np.count_nonzero(b['inputs'])) for b in host_batches) * rounds
  real_tgt = sum(int(np.count_nonzero(b['targets'])) for b in host_batches) * rounds
  slots = sum(b['inputs'].size + b['targets'].size for b in host_batches) * rounds
  steps = len(host_batches) * rounds
  return {'benchmark': 'batching', 'config': name, 'data': data, 'batching': batching,
          'batches': len(host_batches), 'rounds': rounds,
          'target_tokens_per_s': round(real_tgt / stepper.seconds, 1),
          'tokens_per_s': round((real_src + real_tgt) / stepper.seconds, 1),
          'step_seconds': round(stepper.seconds / steps, 4),
          'padding_efficiency': round((real_src + real_tgt) / slots, 4),
          'shapes': [list(k) for k in stepper.compiled],
          'compile_seconds': round(stepper.compile_s, 1),
          'backend': jax.default_backend(), 'cpu_count': os.cpu_count()}


def run(name: str, data: str, count: int, rounds: int, changes: dict | None = None,
        ) -> list[dict]:
  """Both batchings' lines (benchmarks/accelerator.py's batching part calls this too)."""
  configs = {b: make_config(name, data, b, changes or {}) for b in BATCHINGS}
  with tempfile.TemporaryDirectory() as tmp:
    host = {b: batches(configs[b], os.path.join(tmp, 'workdir'), count)
            for b in BATCHINGS}  # one vocabulary and id cache for both
  steppers = {b: Stepper(configs[b], host[b]) for b in BATCHINGS}
  for _ in range(rounds):
    for stepper in steppers.values():
      stepper.run_round()
  return [line(name, b, data, host[b], steppers[b], rounds) for b in BATCHINGS]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  parser.add_argument('--data', default='wmt', choices=('wmt', 'demo'))
  parser.add_argument('--batches', type=int, default=6)
  parser.add_argument('--rounds', type=int, default=2)
  args = parser.parse_args()
  buckets, packed = (common.emit(line) for line in run(args.config, args.data, args.batches,
                                                       args.rounds))
  common.emit({'benchmark': 'batching_ratio', 'config': args.config, 'data': args.data,
               'packed_over_buckets_target_tokens_per_s': round(
                   packed['target_tokens_per_s'] / buckets['target_tokens_per_s'], 3)})


if __name__ == '__main__':
  main()
