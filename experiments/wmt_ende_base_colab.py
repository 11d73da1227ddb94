"""Transformer (base) on WMT14 English→German on one 16 GiB accelerator: today's Colab.

Colab's TPU runtime is now a single TPU v5e chip with 16 GiB of memory (it was a v2-8, eight
cores like the paper's eight P100 GPUs, §5.2), and its GPU runtimes have one GPU (a T4 has
16 GB). This is experiments/wmt_ende_base.py with only what such a device needs changed: the
model (Table 3 "base"), the update of ~25000 source and ~25000 target tokens (§5.1), the
schedule (§5.3) and the averaging of the last 5 checkpoints (§6.1) are the paper's.
notebooks/colab.ipynb selects it on a TPU or GPU runtime.
"""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
wmt_ende_base = loading.load_sibling(__file__, 'wmt_ende_base')


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_base.get_config()
  # bfloat16 compute: half the activation memory of float32 and the v5e's (and A100/L4's)
  # matrix units' native type. Parameters, Adam moments, softmax, layer-norm statistics and
  # the loss stay float32 (transformer.py). 'auto' would choose it too on a TPU or GPU; named here
  # so that the memory estimate below holds wherever the config runs. A deviation from the
  # paper, which trained in float32 on P100 GPUs (§5.2; a P100 has no bfloat16);
  # --config.model.dtype=float32 restores it. (Nor has a T4 bfloat16 matrix units: there it
  # saves memory, not time.)
  config.model.dtype = 'bfloat16'
  # §5.1's batch is kept: tokens_per_batch stays 27000 (~25000 real tokens a side), the
  # global batch of one update whatever the devices (batching.py), and the base config's
  # batches are the same ones. One device takes it in 8 micro-batches, one after another,
  # summing their gradients (train_step.py): the same update as the paper's 8 GPUs (§5.2)
  # each taking ~3125 tokens a side. Memory of one train step, worst bucket (112 rows of 256 + 256
  # tokens: 105 real rows padded to a multiple of 8, so 14 rows a micro-batch), base model,
  # bfloat16, from XLA's compiled memory_analysis() on the CPU (benchmarks/grad_accum_memory.py
  # --rows=112 --length=256 --dtype=bfloat16; an estimate, not measured on a TPU or GPU):
  # temp 5.8 GiB + arguments 0.7 GiB (params and Adam moments; the outputs reuse them) =
  # 6.5 GiB. With 4 micro-batches it is 11.6 GiB, over the ~11 GiB that JAX takes of a T4
  # (75% of its 15 GiB); with 2, 21.7 GiB; with 1, 41.5 GiB. Smaller micro-batches cost some
  # speed: on a device with more memory --config.grad_accum_steps=4 (or 1) is the same update.
  config.grad_accum_steps = 8
  # A free Google Drive has 15 GB. One checkpoint is params + 2 Adam moments in float32:
  # 63,045,632 parameters × 12 bytes = 0.76 GB (orbax writes a little less:
  # docs/performance.md).
  # The base config keeps 20 (for big's average of 20): 20 × 0.76 = 15.1 GB, over the
  # Drive. 5 are what §6.1 averages for base: 5 × 0.76 = 3.8 GB, 4.5 GB while a 6th is
  # written (orbax deletes the oldest after), + 0.25 GB averaged params (4 bytes each) =
  # 4.8 GB, which leaves room for data_cache/ (≤ 0.8 GB) and tfds' WMT14 (~3 GB) on Drive.
  config.keep_checkpoints = 5
  config.average_last = 5  # §6.1, as base: ≤ keep_checkpoints
  # A Colab runtime can vanish without a signal, and 1500 steps of 8 micro-batches take
  # hours on one device: time-based saves too, so a lost runtime costs at most 10 minutes.
  # The last 5 checkpoints averaged are then the newest 5 saves of either kind, not §6.1's
  # 6000 steps: pass --config.checkpoint_every_minutes=0 for those.
  config.checkpoint_every_minutes = 10.0
  return config
