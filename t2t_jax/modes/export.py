"""A trained run as a Hugging Face MarianMT folder at --output (transformers'
MarianMTModel and MarianTokenizer load it; docs/export.md)."""
from __future__ import annotations

import ml_collections

from t2t_jax import cli
from t2t_jax.apps import export
from t2t_jax.platform import errors


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  output = cli.FLAGS.output
  if output is None:
    raise errors.UserError('--mode=export needs --output=DIR (the Hugging Face folder to write)')
  export.export_run(config, workdir, output)
  return f'exported {workdir} to {output} (transformers.MarianMTModel)'
