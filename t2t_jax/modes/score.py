"""Score --reference as translations of --input, line by line, as beam search would score them
(fairseq's --score-reference, marian-scorer): for filtering pairs and reranking n-best lists."""
from __future__ import annotations

import ml_collections

from t2t_jax import cli
from t2t_jax.apps.translator import Translator
from t2t_jax.data import sources
from t2t_jax.decoding import scoring
from t2t_jax.modes import translate
from t2t_jax.platform import errors, files


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  flags = cli.FLAGS
  if flags.input is None or flags.reference is None:
    raise errors.UserError('--mode=score needs --input=FILE (the sources) and --reference=FILE '
                           '(their translations, line for line)')
  count = score(config, workdir, flags.input, flags.reference, flags.output,
                per_token=flags.per_token)
  return translate.result_line('scored', count, 'pairs', flags.input, flags.output)


def score(config: ml_collections.ConfigDict, workdir: str, input_path: str, reference_path: str,
          output_path: str | None, *, per_token: bool = False) -> int:
  """Each line of `reference_path` scored as the translation of the same line
  of `input_path` (scoring.format_scores), to `output_path` (None = stdout)."""
  if output_path is not None:
    files.check_writable_file(output_path, 'the scores')
  sources_, targets = sources.read_lines(input_path), sources.read_lines(reference_path)
  if len(sources_) != len(targets):
    raise errors.UserError(f'--input={input_path} has {len(sources_)} lines, '
                           f'--reference={reference_path} {len(targets)}: give a reference '
                           'line for each input line')
  scored = Translator(config, workdir, mode='translate').score(sources_, targets)
  translate.write(scoring.format_scores(scored, per_token=per_token), output_path)
  return len(scored)
