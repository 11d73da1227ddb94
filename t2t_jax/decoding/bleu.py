"""BLEU as the paper reports it and as it is reported today (§6.1, Table 2), with chrF and TER.

* `tok_bleu`: the paper's, as tensor2tensor's `get_ende_bleu.sh` computed the 28.4: Moses
  tokens, hyphenated compounds split (`a-b` -> `a ##AT##-##AT## b`), multi-bleu.perl's
  unsmoothed corpus BLEU-4; usually 0.7 to 1.5 points above sacreBLEU. The splitting is
  EN→DE's convention only (GNMT's and fairseq's `compound_split_bleu.sh` too): it turns a
  German compound into three tokens, two free matches; EN→FR (Table 2) is scored without it.
* sacreBLEU's metrics at its defaults, each with its signature, as other work reports today and
  as its command line (`sacrebleu REF -i HYP -m bleu chrf ter`) prints them: `bleu` (13a
  tokens, also as `sacrebleu` and `sacrebleu_signature`), `chrf` (chrF2) and `ter` (TERCOM's).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import sacrebleu

_COMPOUND = re.compile(r'(\S)-(\S)')
SPLIT_COMPOUNDS = ('de',)  # the targets whose tokenized BLEU splits compounds


def split_compounds(line: str) -> str:
  r"""get_ende_bleu.sh's `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` (as GNMT, ConvS2S)."""
  return _COMPOUND.sub(r'\1 ##AT##-##AT## \2', line)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
  """`tokenizer.perl -l lang` (default options: escaping on, no aggressive dash splits)."""
  # Here: its import compiles many regular expressions.
  from sacremoses import MosesTokenizer  # noqa: PLC0415
  tokenizer = MosesTokenizer(lang=lang)
  return [tokenizer.tokenize(line, return_str=True, escape=True) for line in lines]


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> float:
  """The paper-comparable BLEU: Moses tokens, compounds split (German targets), multi-bleu.perl."""
  split = split_compounds if lang in SPLIT_COMPOUNDS else (lambda line: line)
  hyp = [split(line) for line in moses_tokenize(hypotheses, lang)]
  ref = [split(line) for line in moses_tokenize(references, lang)]
  # multi-bleu.perl does not smooth: any empty n-gram order makes the score 0.
  metric = sacrebleu.metrics.BLEU(tokenize='none', smooth_method='none', force=True)
  return metric.corpus_score(hyp, [ref]).score


def _bleu(hypotheses: list[str], references: list[list[str]]) -> dict[str, Any]:
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(hypotheses, references)
  return {'name': score.name, 'score': score.score, 'precisions': list(score.precisions),
          'bp': score.bp, 'ratio': score.ratio, 'hyp_len': score.sys_len,
          'ref_len': score.ref_len, 'signature': str(metric.get_signature())}


def _chrf(hypotheses: list[str], references: list[list[str]]) -> dict[str, Any]:
  metric = sacrebleu.metrics.CHRF()
  score = metric.corpus_score(hypotheses, references)
  return {'name': score.name, 'score': score.score, 'signature': str(metric.get_signature())}


def _ter(hypotheses: list[str], references: list[list[str]]) -> dict[str, Any]:
  metric = sacrebleu.metrics.TER()
  score = metric.corpus_score(hypotheses, references)
  return {'name': score.name, 'score': score.score, 'signature': str(metric.get_signature())}


# The same names and order as config.eval_metrics (rules.EVAL_METRICS).
METRICS: dict[str, Callable[[list[str], list[list[str]]], dict[str, Any]]] = {
    'bleu': _bleu, 'chrf': _chrf, 'ter': _ter}


def bleu_scores(hypotheses: Sequence[str], references: Sequence[str], *, target_lang: str,
                metrics: Sequence[str] = ('bleu',)) -> dict[str, Any]:
  """The scores of detokenized text: the paper's `tok_bleu` always, and each of `metrics`
  (of METRICS) as sacreBLEU's command line computes it, under its name, as its `--format json`
  has it: {'name', 'score', 'signature'}. 'bleu' adds its n-gram precisions (1 to 4, in %),
  'bp' (brevity penalty), 'ratio', 'hyp_len' and 'ref_len' (13a tokens), and its score and
  signature as 'sacrebleu' and 'sacrebleu_signature'. The default, BLEU alone, is training's
  dev BLEU: chrF and TER cost time it does not spend."""
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} references')
  unknown = [name for name in metrics if name not in METRICS]
  if unknown:
    raise ValueError(f'metrics {unknown}: not of {tuple(METRICS)}')
  hyp, refs = list(hypotheses), [list(references)]
  computed = {name: score(hyp, refs) for name, score in METRICS.items() if name in metrics}
  # BLEU's score and signature also where training's dev BLEU, the study and notebooks read them.
  legacy = ({'sacrebleu': computed['bleu']['score'],
             'sacrebleu_signature': computed['bleu']['signature']} if 'bleu' in computed else {})
  return {**legacy, 'tok_bleu': tokenized_bleu(hypotheses, references, target_lang), **computed}


def report(scores: dict[str, Any]) -> list[str]:
  """The lines of sacreBLEU's `--format text --width 2` for the metrics in `scores`
  (`NAME|SIGNATURE = SCORE`, BLEU's precisions, brevity penalty and lengths after it), then
  the tokenized BLEU."""
  lines = []
  for name in METRICS:
    if name in scores:
      metric = scores[name]
      line = f"{metric['name']}|{metric['signature']} = {metric['score']:.2f}"
      if name == 'bleu':
        line += (f" {'/'.join(f'{p:.1f}' for p in metric['precisions'])} (BP = "
                 f"{metric['bp']:.3f} ratio = {metric['ratio']:.3f} hyp_len = "
                 f"{metric['hyp_len']:d} ref_len = {metric['ref_len']:d})")
      lines.append(line)
  return [*lines, f"tokenized BLEU (the paper's, §6.1) = {scores['tok_bleu']:.2f}"]
