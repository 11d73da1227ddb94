"""A trained run as a Hugging Face MarianMT folder at --output (transformers'
MarianMTModel and MarianTokenizer load it), or with --config.export_format=ctranslate2 as
CTranslate2 models, float32 and int8, for fast CPU inference (docs/export.md)."""
from __future__ import annotations

import ml_collections

from t2t_jax import cli
from t2t_jax.apps import export, export_ct2
from t2t_jax.platform import errors

# config.export_format -> (its export, what loads it)
FORMATS = {'marian': (export.export_run, 'transformers.MarianMTModel'),
           'ctranslate2': (export_ct2.export_run, 'ctranslate2.Translator: float32/, int8/')}


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  output = cli.FLAGS.output
  if output is None:
    raise errors.UserError('--mode=export needs --output=DIR (the folder to write)')
  export_run, loader = FORMATS[config.export_format]
  export_run(config, workdir, output)
  return f'exported {workdir} to {output} ({loader})'
