"""The dev set's loss of any parameters of a trained run: what --mode=average measures of the
mean and of each checkpoint in it, so that an average worse than its best member is seen
(§6.1 averages; it never says the mean is better, and on a short fine-tuning it can be far
worse). The loss is training's dev loss (label-smoothed, per target token, §5.4), so the
figures stand beside metrics.jsonl's."""
from __future__ import annotations

from typing import Any

import jax
import ml_collections

from t2t_jax.data import pipeline
from t2t_jax.model.transformer import ModelConfig
from t2t_jax.platform.mesh import make_mesh, replicated
from t2t_jax.training.train_step import compile_eval_step, eval_metrics


def has_dev_set(config: ml_collections.ConfigDict) -> bool:
  """Whether config names a dev set (dataset='files' needs config.dev_files)."""
  return config.dataset != 'files' or bool(str(config.dev_files).strip())


class DevLoss:
  """Parameters -> their dev loss; the dev set and its batches are read once, and the eval
  step compiles once per batch shape."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self._mesh = make_mesh()
    model_config = ModelConfig.from_config(config)
    tokenizer = pipeline.load_tokenizer(config, workdir)
    self._dev = pipeline.load_eval_set(
        config, workdir, 'dev', tokenizer=tokenizer, num_devices=self._mesh.size,
        process_index=jax.process_index(), process_count=jax.process_count())
    self._eval_fn = compile_eval_step(model_config, config.label_smoothing, self._mesh)

  def __call__(self, params: Any) -> float:
    params = jax.device_put(params, replicated(self._mesh))
    return eval_metrics(self._eval_fn, params, self._dev.batches(), self._mesh)['loss']
