"""BLEU of a trained run (§6.1): `--mode=eval` translates a split (translator.py) and scores it
(bleu.py: sacreBLEU's BLEU, chrF and TER as config.eval_metrics chooses, and the paper's
tokenized BLEU), into eval/<what was evaluated>/, beside the split's per-word-piece perplexity
(Table 3's PPL, §6.2) from the same parameters and the evaluated files' paths and hashes."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
from absl import logging

from t2t_jax.apps.translator import Translator
from t2t_jax.config import rules
from t2t_jax.data import pipeline
from t2t_jax.decoding import bleu
from t2t_jax.decoding.batch_plan import one_line
from t2t_jax.platform import ahead, files
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.training.train_step import compile_eval_step, eval_metrics

EVAL = 'eval'
SIDES = ('source', 'reference')


def eval_name(split: str, translator: Translator, config: ml_collections.ConfigDict,
              sources: list[str], references: list[str]) -> str:
  """The folder of one evaluation under eval/: the split, the parameters and the search, then a
  fingerprint of all that made the result (an average's checkpoints, the dtype, the input limit,
  the sentences and references themselves), so that two different results never share a folder;
  e.g. 'test-averaged-1000-beam4-alpha0.6-extra50-3f2a91c0'."""
  made_of = {'params': translator.source, 'covers': translator.covers,
             'dtype': translator.model_config.dtype, 'beam_size': config.beam_size,
             'beam_alpha': config.beam_alpha, 'extra': config.decode_extra_length,
             'max_input_length': translator.max_input_length,
             'data': hashlib.sha256('\0'.join([*sources, '\1', *references]).encode()
                                    ).hexdigest(),
             **decoding_settings(translator, config)}
  fingerprint = hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:8]
  return (f'{split}-{translator.kind}-{translator.step}-{method_name(translator, config)}'
          f'-extra{config.decode_extra_length}-{fingerprint}')


def method_name(translator: Translator, config: ml_collections.ConfigDict) -> str:
  """The search in an eval folder's name: 'beam4-alpha0.6' (greedy: 'beam1-alpha0.6', the same
  search), 'sample-T1-top0-seed0', then '-ensemble3' for three models."""
  if config.decode_method == 'sample':
    nucleus = f'-p{config.sample_top_p:g}' if config.sample_top_p < 1 else ''
    name = (f'sample-T{config.sample_temperature:g}-top{config.sample_top_k}{nucleus}'
            f'-seed{config.sample_seed}')
  else:
    beam = 1 if config.decode_method == 'greedy' else config.beam_size
    name = f'beam{beam}-alpha{config.beam_alpha:g}'
  return name + (f'-ensemble{len(translator.ensemble) + 1}' if translator.ensemble else '')


def decoding_settings(translator: Translator, config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What an evaluation records of its search beyond beam search's keys: the method (and
  sampling's keys) unless beam search, an ensemble's other runs (and weights). Beam search of
  one run adds nothing, so its folders keep their names."""
  settings: dict[str, Any] = {}
  if config.decode_method != 'beam':
    settings['decode_method'] = config.decode_method
  if config.decode_method == 'sample':
    settings.update({key: config[key] for key in ('sample_temperature', 'sample_top_k',
                                                  'sample_top_p', 'sample_seed')})
  if translator.ensemble:
    settings['ensemble'] = [{'workdir': m.workdir, 'params': m.source, 'covers': m.covers}
                            for m in translator.ensemble]
    weights = rules.ensemble_weights(config)
    if weights is not None:  # another mean, another result: in the fingerprint too
      settings['ensemble_weights'] = list(weights)
  return settings


def evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Translates config.eval_split into eval/<eval_name>/{hypotheses,references,scores}, the
  folder whole or not at all, logs the full report (report_lines) and returns scores.json's
  content with the folder ('folder'). scores.json holds:

  * `tok_bleu`, and of config.eval_metrics, `bleu` {name, score, precisions, bp, ratio,
    hyp_len, ref_len, signature} (also as `sacrebleu` and `sacrebleu_signature`), `chrf` and
    `ter` {name, score, signature}: bleu.bleu_scores;
  * the split's loss (label-smoothed), nll, perplexity (of the nll, per word-piece) and
    accuracy, teacher-forced with the same parameters (with an ensemble, the workdir's alone);
  * `eval_set`: its `source` and `reference` side, each {path, lang, lines, sha256} (eval_set);
  * the split, the parameters, their step, the sentences and the decoding settings.
  """
  metrics = rules.eval_metrics_of(config)  # a bad name fails before decoding
  if jax.process_index() == 0:  # before decoding: a read-only workdir costs seconds, not the run
    files.writable_folder(os.path.join(workdir, EVAL), workdir, 'the evaluation')
  translator = Translator(config, workdir, mode='eval')
  evalset = pipeline.load_eval_set(
      config, workdir, config.eval_split, tokenizer=translator.tokenizer,
      num_devices=translator.mesh.size, process_index=jax.process_index(),
      process_count=jax.process_count())
  # The loss's eval step compiles for the split's batch shapes while the search decodes.
  pool = ahead.make_pool(ahead.default_threads() if config.compile_ahead else 0)
  with ahead.cancelled_on_exit(pool):
    eval_fn = ahead.steps(
        compile_eval_step(translator.model_config, config.label_smoothing, translator.mesh),
        translator.params, evalset.batch_shapes(), translator.mesh, pool=pool, name='eval step',
        packed=evalset.packed)
    hypotheses = translator(evalset.sources)
    scores = bleu.bleu_scores(hypotheses, evalset.references, target_lang=config.target_lang,
                              metrics=metrics)
    scores.update(eval_metrics(eval_fn, translator.params, evalset.batches(), translator.mesh))
  scores.update(split=config.eval_split, params=translator.source, step=translator.step,
                sentences=len(hypotheses), beam_size=config.beam_size,
                beam_alpha=config.beam_alpha, decode_extra_length=config.decode_extra_length,
                **decoding_settings(translator, config), covers=translator.covers,
                eval_set=eval_set(config, workdir, evalset.sources, evalset.references))
  name = eval_name(config.eval_split, translator, config, evalset.sources, evalset.references)
  if jax.process_index() == 0:  # one copy, however many processes decoded
    _publish(workdir, name, {
        'hypotheses.txt': ''.join(h + '\n' for h in hypotheses),
        'references.txt': ''.join(one_line(r) + '\n' for r in evalset.references),
        'scores.json': json.dumps(scores, indent=2) + '\n'})
  for line in report_lines(scores):
    logging.info('%s', line)
  return {**scores, 'folder': os.path.join(workdir, EVAL, name)}


def eval_set(config: ml_collections.ConfigDict, workdir: str, sources: Sequence[str],
             references: Sequence[str]) -> dict[str, dict[str, Any]]:
  """The evaluated split's `source` and `reference` side, each {path, lang, lines, sha256}: a
  file (dataset 'files', the demo's corpus) by its absolute path, its lines and the SHA-256 of
  its bytes as on disk; a split that is no file (tfds, synthetic) by pipeline.eval_set_origin's
  name ('tfds:<name>/<split>'), its sentences and the SHA-256 of the file they would make
  (UTF-8, each ending in a newline)."""
  origin = pipeline.eval_set_origin(config, workdir, config.eval_split)
  langs = (config.source_lang, config.target_lang)
  if isinstance(origin, str):
    return {side: {'path': origin, 'lang': lang, 'lines': len(texts),
                   'sha256': hashlib.sha256(''.join(t + '\n' for t in texts).encode()
                                            ).hexdigest()}
            for side, lang, texts in zip(SIDES, langs, (sources, references), strict=True)}
  return {side: {'path': os.path.abspath(path), 'lang': lang, **_file_digest(path)}
          for side, lang, path in zip(SIDES, langs, origin, strict=True)}


def _file_digest(path: str) -> dict[str, Any]:
  """{lines, sha256} of a file's bytes, a last line without its newline counted."""
  digest, lines, last = hashlib.sha256(), 0, b'\n'
  with open(path, 'rb') as f:
    while block := f.read(1 << 24):
      digest.update(block)
      lines += block.count(b'\n')
      last = block[-1:]
  return {'lines': lines + (last != b'\n'), 'sha256': digest.hexdigest()}


def report_lines(scores: dict[str, Any]) -> list[str]:
  """The log's report of an evaluation: each metric as sacreBLEU prints it (bleu.report),
  the perplexity, then each side of the evaluated split."""
  lines = [f"{scores['split']} {line}" for line in bleu.report(scores)]
  lines.append(f"{scores['split']} perplexity {scores['perplexity']:.4f} (loss "
               f"{scores['loss']:.4f}, accuracy {scores['accuracy']:.4f}) of {scores['params']}")
  for side, found in scores['eval_set'].items():
    lines.append(f"{scores['split']} {side}: {found['path']} ({found['lines']} lines, "
                 f"sha256 {found['sha256']})")
  return lines


def _publish(workdir: str, name: str, texts: dict[str, str]) -> None:
  """eval/<name>/ with these files, whole or not at all: written into a temporary folder,
  renamed into place when complete (an earlier one of that name is moved aside, not lost)."""
  parent = files.writable_folder(os.path.join(workdir, EVAL), workdir, 'the evaluation')
  files.sweep_temp_dirs(parent)  # a killed evaluation's
  tmp = files.make_temp_dir(parent)
  try:
    for file_name, text in texts.items():
      files.write_text(os.path.join(tmp, file_name), text)
    workdir_lib.publish_output(workdir, tmp, f'{EVAL}/{name}')
  finally:
    shutil.rmtree(tmp, ignore_errors=True)  # left only when publishing failed
