"""Table 3 as one command (§6.2): `--mode=study` trains rows, evaluates them, and tabulates
them beside the paper's.

  python -m t2t_jax.main --config=experiments/table3.py --mode=study --workdir=DIR \
      [--rows=A_h1,A_h4,B_dk16] [--config.num_train_steps=N | --config.train_minutes=M]

Each row is a run of its own in DIR/<row>/ (resumable, open to every other mode): the row's
config with the --config.* overrides, alike for every row (the budget, data, vocabulary and
batch keys), evaluated as §6.2 did, "on the development set, newstest2013. We used beam search
as described in the previous section, but no checkpoint averaging" (evaluate.evaluate).
DIR/table3.md, table3.json and table3.png set each row beside Table 3's printed one. A finished
row is not run again while its config stays the same (train_row). The study file names its rows:
`rows()` (in the table's order), `get_config(row)` and `paper_row(row)` (COLUMNS' keys).
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
from absl import logging
from ml_collections import config_flags

from t2t_jax import cli
from t2t_jax.apps import evaluate
from t2t_jax.config import loading, rules
from t2t_jax.model.transformer import ModelConfig, init_param_count
from t2t_jax.modes import train
from t2t_jax.platform import errors, files
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.run import recorded as recorded_lib
from t2t_jax.training import checkpoints

ROW_RECORD = 'study.json'  # in DIR/<row>/: written once the row is trained and evaluated
TABLE_JSON, TABLE_MD, TABLE_PNG = 'table3.json', 'table3.md', 'table3.png'
# Table 3's columns: (key, header in table3.md).
COLUMNS = (('N', 'N'), ('d_model', 'd_model'), ('d_ff', 'd_ff'), ('h', 'h'), ('d_k', 'd_k'),
           ('d_v', 'd_v'), ('P_drop', 'P_drop'), ('eps_ls', 'ε_ls'),
           ('train_steps', 'train steps'), ('ppl', 'PPL (dev)'), ('bleu', 'BLEU (dev)'),
           ('params_millions', 'params ×10⁶'))
# Keys a row may vary (Table 3's columns and row E's positions): an override of one of them
# would make the row another row, so it is refused where the row sets it.
ROW_KEYS_PREFIXES = ('model.', 'label_smoothing')
# Keys that change how a row is computed, not its numbers: a finished row whose config differs
# only in these is not run again (a smaller decoding batch for a host with less memory).
HOW_NOT_WHAT = ('decode_tokens_per_batch', 'eval_tokens_per_batch', 'compilation_cache_dir',
                'log_every_steps')
# What the vocabulary is trained from: rows that agree on these share it.
VOCABULARY_KEYS = ('dataset', 'tfds_name', 'tfds_data_dir', 'train_split', 'train_files',
                   'source_lang', 'target_lang', 'vocab_size', 'vocab_sample_sentences',
                   'demo_num_train', 'demo_num_eval', 'demo_seed')


def load_study(file: str) -> types.ModuleType:
  """The study file (experiments/table3.py), checked for what a study needs."""
  module = loading.load_config_module(file)
  missing = [name for name in ('rows', 'get_config', 'paper_row')
             if not callable(getattr(module, name, None))]
  if missing:
    raise errors.UserError(f'{file}: --mode=study needs a study file, with rows(), '
                           f'get_config(row) and paper_row(row) (missing: {", ".join(missing)}); '
                           'experiments/table3.py is one')
  return module


def row_configs(study: types.ModuleType, rows: Sequence[str] | None,
                overrides: Mapping[str, Any]) -> dict[str, ml_collections.ConfigDict]:
  """Each row's config with the overrides applied, all checked before any row trains."""
  known = list(study.rows())
  rows = list(rows) if rows else known
  unknown = [row for row in rows if row not in known]
  if unknown or len(set(rows)) != len(rows):
    what = f'unknown row(s) {", ".join(unknown)}' if unknown else 'a row named twice'
    raise errors.UserError(f'--rows: {what}; choose from {",".join(known)}')
  base = recorded_lib.config_dict(study.get_config(known[0]))
  configs = {}
  for row in rows:
    config = study.get_config(row)
    varied = recorded_lib.config_differences(base, recorded_lib.config_dict(config), prefix='')
    for key in overrides:
      if key in varied and key.startswith(ROW_KEYS_PREFIXES):
        raise errors.UserError(f'--config.{key}: row {row} sets it (Table 3 varies it there); '
                               f'leave it out, or leave {row} out of --rows')
    config.update_from_flattened_dict(overrides)
    rules.validate(config, 'study')
    configs[row] = config
  return configs


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  """The --config file's rows (--rows), each with every --config.* override."""
  del config  # each row's own, from the study file
  study_file, colon, row = config_flags.get_config_filename(cli.FLAGS['config']).partition(':')
  if colon:
    raise errors.UserError(f'--config={study_file}:{row}: --mode=study takes its rows from '
                           f'--rows (--config={study_file} --rows={row})')
  study_rows(study_file, cli.FLAGS.rows,
             config_flags.get_override_values(cli.FLAGS['config']), workdir)
  return f'wrote {workdir}/{TABLE_MD}, {TABLE_JSON} and {TABLE_PNG}'


def study_rows(study_file: str, rows: Sequence[str] | None, overrides: Mapping[str, Any],
              workdir: str) -> list[dict[str, Any]]:
  """--mode=study: each row trained and evaluated, the tables and plot rewritten after each.
  Returns table3.json's rows, those an earlier invocation recorded (_earlier_row) included."""
  study = load_study(study_file)
  configs = row_configs(study, rows, overrides)
  workdir_lib.check_local(workdir)
  os.makedirs(workdir, exist_ok=True)
  logging.info('Study of %d rows (%s) in %s; overrides for every row: %s', len(configs),
               ','.join(configs), workdir, dict(overrides) or 'none')
  results = {}
  for row, config in configs.items():
    measured = train_row(row, config, os.path.join(workdir, row), workdir)
    results[row] = {'row': row, 'measured': measured, 'paper': study.paper_row(row)}
    table = [entry for r in study.rows()
             if (entry := results.get(r) or _earlier_row(study, r, overrides, workdir))]
    write_tables(workdir, table, overrides)
    # Each row is another model: its compiled steps never run again, and 20 rows' worth held
    # in one process is memory the next row's beam search may need.
    jax.clear_caches()
    gc.collect()
  return table


def _earlier_row(study: types.ModuleType, row: str, overrides: Mapping[str, Any],
                 workdir: str) -> dict[str, Any] | None:
  """A row an earlier invocation recorded in workdir, if any: its measured columns, marked
  `earlier_invocation`, with `differs_in` the keys whose values differ from what this
  invocation would run it with (e.g. num_train_steps)."""
  record = _read_json(os.path.join(workdir, row, ROW_RECORD))
  if record is None:
    return None
  config = study.get_config(row)
  config.update_from_flattened_dict(overrides)
  differ = recorded_lib.config_differences(_what(record['config']),
                                           _what(recorded_lib.config_dict(config)), prefix='')
  measured = dict(record['measured'], earlier_invocation=True, differs_in=sorted(differ))
  return {'row': row, 'measured': measured, 'paper': study.paper_row(row)}


def train_row(row: str, config: ml_collections.ConfigDict, row_dir: str, study_dir: str,
            ) -> dict[str, Any]:
  """One row: trained (resuming), evaluated on dev without averaging, recorded."""
  settings = recorded_lib.config_dict(config)
  record_path = os.path.join(row_dir, ROW_RECORD)
  record = _read_json(record_path)
  if record is not None:
    recorded = _what(record.get('config', {}))
    if recorded == _what(settings):
      logging.info('Row %s: finished before (%s); not trained or evaluated again.', row,
                   record_path)
      return record['measured']
    differ = recorded_lib.config_differences(recorded, _what(settings), prefix='')
    logging.warning('Row %s: %s was made with other settings (%s); training on from its '
                    'checkpoints and evaluating again, then replacing it.', row, record_path,
                    ', '.join(sorted(differ)))
  _share_vocabulary(config, row_dir, study_dir)
  logging.info('Row %s: training in %s', row, row_dir)
  logging.info('Row %s: %s', row, train.train_and_evaluate(config, row_dir))
  start = time.monotonic()
  scores = evaluate.evaluate(config, row_dir)
  measured = measure(config, scores, row_dir)
  measured['eval_minutes'] = round((time.monotonic() - start) / 60, 2)
  if jax.process_index() == 0:
    text = json.dumps({'row': row, 'config': settings, 'measured': measured}, indent=2)
    files.write_text(record_path, text + '\n')
  return measured


def _what(settings: Mapping[str, Any]) -> dict[str, Any]:
  """A row's config without the keys in HOW_NOT_WHAT."""
  return {key: value for key, value in settings.items() if key not in HOW_NOT_WHAT}


def measure(config: ml_collections.ConfigDict, scores: Mapping[str, Any], row_dir: str,
            ) -> dict[str, Any]:
  """Table 3's columns of a trained, evaluated row. BLEU is the tokenized BLEU, as the
  paper's (bleu.py); sacreBLEU is kept beside it."""
  model = ModelConfig.from_config(config)
  params = init_param_count(model)
  trained_s = checkpoints.read_data_state(row_dir, scores['step']).get(train.TRAIN_SECONDS)
  return {'N': model.num_layers, 'd_model': model.d_model, 'd_ff': model.d_ff,
          'h': model.num_heads, 'd_k': model.key_size, 'd_v': model.value_size,
          'P_drop': model.dropout_rate, 'eps_ls': config.label_smoothing,
          'positional': model.positional, 'train_steps': scores['step'],
          'ppl': scores['perplexity'], 'bleu': scores['tok_bleu'],
          'sacrebleu': scores['sacrebleu'], 'params_millions': round(params / 1e6, 2),
          'params': params, 'dev_sentences': scores['sentences'],
          'train_minutes': None if trained_s is None else round(trained_s / 60, 2)}


def _share_vocabulary(config: ml_collections.ConfigDict, row_dir: str, study_dir: str) -> None:
  """Before a row's first training: the vocabulary (and encoded data) of an earlier row trained
  from the same text and settings, as Table 3's rows shared one: perplexities per word-piece
  compare only over the same pieces."""
  if os.path.exists(os.path.join(row_dir, 'vocab')) or jax.process_index() != 0:
    return
  wanted = {key: config.get(key) for key in VOCABULARY_KEYS}
  for donor in sorted(os.listdir(study_dir)):
    donor_dir = os.path.join(study_dir, donor)
    recorded = recorded_lib.load_config(donor_dir) if os.path.isdir(donor_dir) else None
    if (recorded is None or not os.path.exists(os.path.join(donor_dir, 'vocab', 'spm.model'))
        or {key: recorded.get(key) for key in VOCABULARY_KEYS} != wanted):
      continue
    files.make_folder(row_dir, study_dir, 'a row of the study')
    for part in ('data_cache', 'vocab'):  # vocab/ last: its presence means both are whole
      if os.path.isdir(os.path.join(donor_dir, part)):
        _copy_whole(os.path.join(donor_dir, part), os.path.join(row_dir, part))
    logging.info('%s: the vocabulary and encoded data of %s', row_dir, donor_dir)
    return


def _copy_whole(source: str, target: str) -> None:
  """source/ as target/, which appears whole or not at all (a copy, then a rename)."""
  temp = files.make_temp_dir(os.path.dirname(target))
  staged = os.path.join(temp, os.path.basename(target))
  shutil.copytree(source, staged, copy_function=_link_or_copy,
                  ignore=shutil.ignore_patterns('.tmp-*'))
  os.rename(staged, target)
  os.rmdir(temp)


def _link_or_copy(source: str, target: str) -> None:
  """A hard link (the cache's ids are read-only, and large on WMT), else a copy."""
  try:
    os.link(source, target)
  except OSError:
    shutil.copy2(source, target)


def _read_json(path: str) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


# ------------------------------------------------------------------ the tables and the plot


def write_tables(workdir: str, results: list[dict[str, Any]], overrides: Mapping[str, Any],
                 ) -> None:
  """table3.json (one object per row: row, measured, paper), table3.md, table3.png."""
  if jax.process_index() != 0:
    return
  files.write_text(os.path.join(workdir, TABLE_JSON), json.dumps(results, indent=2) + '\n')
  files.write_text(os.path.join(workdir, TABLE_MD), markdown(results, overrides))
  plot(results, os.path.join(workdir, TABLE_PNG))


def markdown(results: list[dict[str, Any]], overrides: Mapping[str, Any]) -> str:
  """Each row measured, with Table 3's printed row under it."""
  header = ['row', '', *(title for _, title in COLUMNS), 'train min', 'sacreBLEU']
  lines = ['# Table 3, measured (t2t_jax --mode=study) and as printed', '',
           '| ' + ' | '.join(header) + ' |', '|' + '---|' * 2 + '---:|' * (len(header) - 2)]
  for result in results:
    measured, paper = result['measured'], result['paper']
    cells = [_cell(measured[key], key) for key, _ in COLUMNS]
    extra = [_cell(measured.get('train_minutes'), 'minutes'), _cell(measured['sacrebleu'], 'bleu')]
    label = f'{result["row"]} (earlier)' if measured.get('earlier_invocation') else result['row']
    lines.append(f'| {label} | measured | ' + ' | '.join(cells + extra) + ' |')
    cells = [_cell(paper.get(key), key, printed=True) for key, _ in COLUMNS]
    lines.append('| | paper | ' + ' | '.join(cells + ['', '']) + ' |')
  shown = ', '.join(f'--config.{k}={v}' for k, v in overrides.items()) or 'none'
  lines += ['', "Protocol (§6.2): the dev split (config.eval_split='dev'; newstest2013 for the "
            'paper), beam search (§6.1), the last checkpoint without averaging. PPL: per '
            'word-piece, of the unsmoothed loss. BLEU: tokenized BLEU, as the paper; sacreBLEU '
            'beside it. train min: minutes in the training loop, over every resume.',
            f'Overrides applied to every row: {shown}.']
  for result in results:
    if result['measured'].get('earlier_invocation'):
      differ = ', '.join(result['measured']['differs_in']) or 'nothing'
      lines.append(f'{result["row"]} (earlier): recorded by an earlier invocation; its '
                   f'settings differ from this one\'s in: {differ}.')
  return '\n'.join(lines + [''])


def _cell(value: Any, key: str, printed: bool = False) -> str:
  """A number as Table 3 prints it (PPL 4.92, BLEU 25.8); measured BLEU to 2 decimals."""
  if value is None:
    return ''
  if key == 'bleu' and printed:
    return f'{value:.1f}'
  if key in ('ppl', 'bleu', 'minutes'):
    return f'{value:.2f}'
  return f'{value:g}' if isinstance(value, float) else str(value)


def plot(results: list[dict[str, Any]], path: str) -> None:
  """Dev perplexity against parameters (measured and paper), and BLEU per row."""
  import matplotlib  # noqa: PLC0415 (only study and attention draw: importing it is slow)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415 (after use('Agg'): no display needed)
  fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
  positions = range(len(results))
  for source, marker, shift in (('measured', 'o', -0.2), ('paper', 'x', 0.2)):
    xs = [r[source]['params_millions'] for r in results]
    ys = [r[source]['ppl'] for r in results]
    left.scatter(xs, ys, marker=marker, label=source)
    for x, y, r in zip(xs, ys, results, strict=True):
      left.annotate(r['row'], (x, y), fontsize=7, textcoords='offset points', xytext=(3, 3))
    right.bar([i + shift for i in positions], [r[source]['bleu'] for r in results], 0.4,
              label=source)
  left.set(xscale='log', yscale='log', xlabel='parameters ×10⁶', ylabel='dev perplexity')
  left.legend()
  right.set_xticks(list(positions), [r['row'] for r in results], rotation=60, fontsize=7)
  right.set(ylabel='dev BLEU (tokenized)')
  right.legend()
  fig.suptitle('Table 3: variations of the Transformer, dev set (newstest2013 in the paper)')
  fig.tight_layout()
  temp = f'{path}.tmp-{os.getpid()}.png'
  with files.open_file(temp, 'xb', 'the study\'s plot') as f:  # never through a link
    fig.savefig(f, dpi=100, format='png')
  plt.close(fig)
  os.replace(temp, path)
