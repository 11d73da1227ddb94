"""BLEU of a trained run (§6.1): translate config.eval_split (newstest2014, or dev) and score
it, into WORKDIR/eval/<what was evaluated>/scores.json."""
from __future__ import annotations

import ml_collections

from t2t_jax.apps import evaluate


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  scores = evaluate.evaluate(config, workdir)
  return (f"{scores['split']} sacreBLEU {scores['sacrebleu']:.2f}, tokenized BLEU "
          f"{scores['tok_bleu']:.2f}, perplexity {scores['perplexity']:.2f} of "
          f"{scores['params']}: {scores['folder']}/scores.json")
