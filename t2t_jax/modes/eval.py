"""BLEU of a trained run (§6.1): translate config.eval_split (newstest2014, or dev) and score
it, into WORKDIR/eval/<what was evaluated>/scores.json."""
from __future__ import annotations

from typing import Any

import ml_collections

from t2t_jax.apps import evaluate


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  scores = evaluate.evaluate(config, workdir)
  return (f"{scores['split']} {_metrics(scores)}, tokenized BLEU {scores['tok_bleu']:.2f}, "
          f"perplexity {scores['perplexity']:.2f} of {scores['params']}: "
          f"{scores['folder']}/scores.json")


def _metrics(scores: dict[str, Any]) -> str:
  """'BLEU 92.97 (chrF2 96.5, TER 3.2)', or those of config.eval_metrics there are; the log
  has them in full (evaluate.report_lines)."""
  others = ', '.join(f"{scores[name]['name']} {scores[name]['score']:.1f}"
                     for name in ('chrf', 'ter') if name in scores)
  if 'bleu' not in scores:
    return others
  return f"BLEU {scores['bleu']['score']:.2f}" + (f' ({others})' if others else '')
