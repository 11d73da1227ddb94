"""The model's parameter count (Table 3's last column), from the config alone."""
from __future__ import annotations

import ml_collections

from t2t_jax.model.transformer import ModelConfig, init_param_count


def run(config: ml_collections.ConfigDict, workdir: str | None) -> str:
  del workdir  # the config alone sets the count
  return f'params: {init_param_count(ModelConfig.from_config(config))}'
