"""Attention heatmaps of --input="a sentence" and its translation, a PNG per layer and kind,
like the paper's Figures 3-5, into --output (default: WORKDIR/attention)."""
from __future__ import annotations

import ml_collections

from t2t_jax import cli
from t2t_jax.apps import attention_maps
from t2t_jax.platform import errors


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  flags = cli.FLAGS
  if flags.input is None:
    raise errors.UserError('--mode=attention needs --input="a sentence"')
  return '\n'.join(attention_maps.draw(config, workdir, flags.input, flags.output,
                                       layers=flags.layers))
