"""BLEU as the paper reports it and as it is reported today (§6.1, Table 2).

* `sacrebleu`: sacreBLEU's detokenized BLEU (13a) and its signature, as other work reports today.
* `tok_bleu`: the paper's, as tensor2tensor's `get_ende_bleu.sh` computed the 28.4: Moses
  tokens, hyphenated compounds split (`a-b` -> `a ##AT##-##AT## b`), multi-bleu.perl's
  unsmoothed corpus BLEU-4; usually 0.7 to 1.5 points above sacreBLEU. The splitting is
  EN→DE's convention only (GNMT's and fairseq's `compound_split_bleu.sh` too): it turns a
  German compound into three tokens, two free matches; EN→FR (Table 2) is scored without it.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

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


def bleu_scores(hypotheses: Sequence[str], references: Sequence[str], *,
                target_lang: str) -> dict[str, float | str]:
  """{'sacrebleu', 'sacrebleu_signature', 'tok_bleu'} for detokenized text."""
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} references')
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(list(hypotheses), [list(references)])
  return {'sacrebleu': score.score, 'sacrebleu_signature': str(metric.get_signature()),
          'tok_bleu': tokenized_bleu(hypotheses, references, target_lang)}
