"""BLEU against the sacrebleu command line and against the steps of get_ende_bleu.sh."""
import os
import subprocess
import sys

import pytest

from helpers import assert_printed
from t2t_jax.decoding import bleu

HYPOTHESES = ['Der Hund sieht den Ball.', 'Die Frau liest ein langes Buch im Garten.',
              'Ein Mann kauft, weil er Hunger hat, das Brot.', 'Die Nord-Süd-Verbindung ist neu.',
              'Das ist ein "Test" & mehr.']
REFERENCES = ['Der Hund sieht einen Ball.', 'Die Frau liest ein langes Buch im Garten.',
              'Ein Mann kauft das Brot, weil er Hunger hat.', 'Die Nord-Süd-Verbindung ist alt.',
              'Das ist ein "Test" und mehr.']


@pytest.mark.e2e
def test_sacrebleu_equals_the_command_line(tmp_path):
  hyp, ref = tmp_path / 'hyp.txt', tmp_path / 'ref.txt'
  hyp.write_text('\n'.join(HYPOTHESES) + '\n', encoding='utf-8')
  ref.write_text('\n'.join(REFERENCES) + '\n', encoding='utf-8')
  cli = os.path.join(os.path.dirname(sys.executable), 'sacrebleu')
  out = subprocess.run([cli, str(ref), '-i', str(hyp), '-b', '-w', '6'], capture_output=True,
                       text=True, check=True).stdout
  scores = bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de')
  assert_printed([out.strip()], [scores['sacrebleu']], 6)  # printed with 6 decimals (-w 6)
  sig = subprocess.run([cli, str(ref), '-i', str(hyp)], capture_output=True, text=True,
                       check=True).stdout
  assert scores['sacrebleu_signature'] in sig


def test_compound_splitting_matches_the_perl_rule():
  # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' on these lines, worked by hand:
  assert bleu.split_compounds('Nord-Süd') == 'Nord ##AT##-##AT## Süd'
  # Non-overlapping left to right, as Perl's /g: the second hyphen's left char was consumed.
  assert bleu.split_compounds('a-b-c') == 'a ##AT##-##AT## b-c'
  assert bleu.split_compounds('a - b -c') == 'a - b -c'


def test_tokenized_bleu_is_multi_bleu_on_moses_tokens():
  tokens = bleu.moses_tokenize(['Das ist ein "Test" & mehr.'], 'de')
  assert tokens == ['Das ist ein &quot; Test &quot; &amp; mehr .']
  # Identical output scores 100; one changed word scores below, and above sacreBLEU's 0
  # floor for a completely different sentence.
  assert bleu.tokenized_bleu(REFERENCES, REFERENCES, 'de') == pytest.approx(100.0)
  score = bleu.tokenized_bleu(HYPOTHESES, REFERENCES, 'de')
  hyp = [bleu.split_compounds(t) for t in bleu.moses_tokenize(HYPOTHESES, 'de')]
  ref = [bleu.split_compounds(t) for t in bleu.moses_tokenize(REFERENCES, 'de')]
  assert score == pytest.approx(multi_bleu(hyp, ref), abs=1e-9)
  assert 0 < score < 100


def multi_bleu(hypotheses, references):
  """multi-bleu.perl re-derived: BLEU-4 on whitespace tokens, brevity penalty, no smoothing."""
  import collections
  import math
  matches, totals, hyp_len, ref_len = [0] * 4, [0] * 4, 0, 0
  for h, r in zip(hypotheses, references, strict=True):
    h, r = h.split(), r.split()
    hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
    for n in range(1, 5):
      h_grams = collections.Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
      r_grams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
      matches[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
      totals[n - 1] += max(len(h) - n + 1, 0)
  if min(matches) == 0:
    return 0.0
  log_precision = sum(math.log(m / t) for m, t in zip(matches, totals, strict=True)) / 4
  brevity = min(0.0, 1 - ref_len / hyp_len)
  return 100 * math.exp(log_precision + brevity)


def test_tokenized_bleu_is_zero_without_any_four_gram_match():
  assert bleu.tokenized_bleu(['a b c'], ['a b c d e'], 'en') == 0.0


FRENCH_HYPOTHESES = ['Le porte-monnaie est dans la voiture.', "C'est un chef-d'œuvre rare."]
FRENCH_REFERENCES = ['Le porte-monnaie est sur la table.', "C'est un chef-d'œuvre connu."]


def test_compounds_are_split_for_german_targets_only():
  """get_ende_bleu.sh's ##AT## splitting is the EN→DE convention: French targets are scored
  on Moses tokens alone (each hyphenated word one token), German ones split."""
  for lang, split in (('fr', False), ('de', True)):
    hyp = bleu.moses_tokenize(FRENCH_HYPOTHESES, lang)
    ref = bleu.moses_tokenize(FRENCH_REFERENCES, lang)
    if split:
      hyp = [bleu.split_compounds(t) for t in hyp]
      ref = [bleu.split_compounds(t) for t in ref]
    assert bleu.tokenized_bleu(FRENCH_HYPOTHESES, FRENCH_REFERENCES, lang) == pytest.approx(
        multi_bleu(hyp, ref), abs=1e-9)
  # The splitting's free matches (##AT##-##AT## and the compound's halves) raise the score.
  assert (bleu.tokenized_bleu(FRENCH_HYPOTHESES, FRENCH_REFERENCES, 'fr') <
          bleu.tokenized_bleu(FRENCH_HYPOTHESES, FRENCH_REFERENCES, 'de'))
  assert bleu.SPLIT_COMPOUNDS == ('de',)
