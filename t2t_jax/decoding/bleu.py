"""BLEU as the paper reports it and as it is reported today (§6.1, Table 2).

* `sacrebleu`: detokenized BLEU of sacreBLEU's default 13a tokenizer, with its signature:
  the number to compare with other work today.
* `tok_bleu`: the paper's number, computed as tensor2tensor's `get_ende_bleu.sh` did for the
  28.4: Moses-tokenize hypotheses and references (`tokenizer.perl -l <lang>`), split
  hyphenated compounds (`a-b` -> `a ##AT##-##AT## b`), then multi-bleu.perl, i.e. plain
  unsmoothed corpus BLEU-4 on those tokens (sacreBLEU with tokenize='none',
  smooth_method='none' computes exactly that).
  It is usually 0.7 to 1.5 points above sacreBLEU for the same output.
  The compound splitting is the EN→DE convention only (get_ende_bleu.sh; GNMT's and fairseq's
  `compound_split_bleu.sh` are EN→DE scripts too): German's hyphenated compounds are many, and
  splitting turns one word into three tokens, two of them free matches, which inflates the
  score. Other target languages (EN→FR, Table 2) are scored on Moses tokens without it.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import sacrebleu

# get_ende_bleu.sh: perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
_COMPOUND = re.compile(r'(\S)-(\S)')
# The target languages whose tokenized BLEU splits compounds (see the module docstring).
SPLIT_COMPOUNDS = ('de',)


def split_compounds(line: str) -> str:
  """The ##AT## compound splitting of tensor2tensor's get_ende_bleu.sh (as GNMT, ConvS2S)."""
  return _COMPOUND.sub(r'\1 ##AT##-##AT## \2', line)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
  """`tokenizer.perl -l lang` (default options: escaping on, no aggressive dash splits)."""
  # Lazily: sacremoses compiles its regular expressions at import (~0.4 s), which every
  # command-line start would pay; only scoring needs it.
  from sacremoses import MosesTokenizer
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
