"""BLEU of a trained run (§6.1): `--mode=eval` translates a split (translator.py) and scores it
(bleu.py), into eval/<what was evaluated>/, beside the split's per-word-piece perplexity
(Table 3's PPL, §6.2) from the same parameters."""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
from absl import logging

from t2t_jax import bleu, data, files
from t2t_jax.train_step import compile_eval_step, eval_metrics
from t2t_jax.translator import Translator, one_line

EVAL = 'eval'


def eval_name(split: str, translator: Translator, config: ml_collections.ConfigDict) -> str:
  """The folder of one evaluation under eval/: what was decoded, with what, and how.

  E.g. 'test-averaged-1000-beam4-alpha0.6-extra50': dev and test, averaged and raw
  parameters of the same step, and other decoding settings never overwrite each other.
  """
  return (f'{split}-{translator.kind}-{translator.step}-beam{config.beam_size}'
          f'-alpha{config.beam_alpha:g}-extra{config.decode_extra_length}')


def run_eval(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """--mode=eval: translate config.eval_split, write eval/<eval_name>/{hypotheses,
  references,scores}; scores.json is written last, so its presence means complete.

  scores.json also holds the split's loss (label-smoothed), nll, perplexity (of the nll,
  per word-piece) and accuracy, teacher-forced with the same parameters.
  """
  translator = Translator(config, workdir, mode='eval')
  evalset = data.load_eval_set(config, workdir, config.eval_split,
                               tokenizer=translator.tokenizer, num_devices=translator.mesh.size,
                               process_index=jax.process_index(),
                               process_count=jax.process_count())
  hypotheses = translator(evalset.sources)
  scores = bleu.bleu_scores(hypotheses, evalset.references, target_lang=config.target_lang)
  eval_fn = compile_eval_step(translator.model_config, config.label_smoothing, translator.mesh)
  scores.update(eval_metrics(eval_fn, translator.params, evalset.batches(), translator.mesh))
  scores.update(split=config.eval_split, params=translator.source, step=translator.step,
                sentences=len(hypotheses), beam_size=config.beam_size,
                beam_alpha=config.beam_alpha, decode_extra_length=config.decode_extra_length)
  out_dir = os.path.join(workdir, EVAL, eval_name(config.eval_split, translator, config))
  os.makedirs(out_dir, exist_ok=True)
  _write(os.path.join(out_dir, 'hypotheses.txt'), ''.join(h + '\n' for h in hypotheses))
  _write(os.path.join(out_dir, 'references.txt'),
         ''.join(one_line(r) + '\n' for r in evalset.references))
  _write(os.path.join(out_dir, 'scores.json'), json.dumps(scores, indent=2) + '\n')
  logging.info('%s BLEU of %s: sacreBLEU %.2f (%s), tokenized BLEU %.2f; written to %s',
               config.eval_split, translator.source, scores['sacrebleu'],
               scores['sacrebleu_signature'], scores['tok_bleu'], out_dir)
  return scores


def _write(path: str, text: str) -> None:
  if jax.process_index() == 0:  # one copy, however many processes decoded
    files.write_text(path, text)
