"""BLEU against the sacrebleu command line and against the steps of get_ende_bleu.sh."""
import json
import re
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


def sacrebleu_command_line(ref, hyp, *args: str) -> str:
  """`python -m sacrebleu REF -i HYP -m bleu chrf ter ARGS`: its standard output."""
  return subprocess.run([sys.executable, '-m', 'sacrebleu', str(ref), '-i', str(hyp), '-m',
                         'bleu', 'chrf', 'ter', *args], capture_output=True, text=True,
                        check=True).stdout


def assert_equals_the_command_line(scores, ref, hyp):
  """Every figure of bleu.bleu_scores(..., metrics=bleu,chrf,ter) is sacreBLEU's command line's
  on the files REF and HYP, to the precision it prints: each score with 6 decimals (-w 6) and
  its signature; BLEU's n-gram precisions with 1, its brevity penalty and ratio with 3, its
  lengths whole; and bleu.report's lines are its text lines (-w 2)."""
  printed = json.loads(sacrebleu_command_line(ref, hyp, '-f', 'json', '-w', '6'))
  by_name = {entry['name']: entry for entry in printed}
  assert sorted(by_name) == sorted(scores[name]['name'] for name in ('bleu', 'chrf', 'ter'))
  for name in ('bleu', 'chrf', 'ter'):
    entry = by_name[scores[name]['name']]
    assert scores[name]['signature'] == entry['signature']
    assert_printed([entry['score']], [scores[name]['score']], 6)
  assert (scores['sacrebleu'], scores['sacrebleu_signature']) == (
      scores['bleu']['score'], scores['bleu']['signature'])
  verbose = re.fullmatch(r'(\S+)/(\S+)/(\S+)/(\S+) \(BP = (\S+) ratio = (\S+) hyp_len = (\d+) '
                         r'ref_len = (\d+)\)', by_name['BLEU']['verbose_score']).groups()
  got = scores['bleu']
  assert_printed(verbose[:4], got['precisions'], 1)
  assert_printed(verbose[4:6], [got['bp'], got['ratio']], 3)
  assert [int(n) for n in verbose[6:]] == [got['hyp_len'], got['ref_len']]
  text = sacrebleu_command_line(ref, hyp, '-f', 'text', '-w', '2')
  assert [line.strip() for line in text.splitlines()] == bleu.report(scores)[:3]


@pytest.mark.e2e
def test_sacrebleu_equals_the_command_line(tmp_path):
  hyp, ref = tmp_path / 'hyp.txt', tmp_path / 'ref.txt'
  hyp.write_text('\n'.join(HYPOTHESES) + '\n', encoding='utf-8')
  ref.write_text('\n'.join(REFERENCES) + '\n', encoding='utf-8')
  scores = bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de', metrics=bleu.METRICS)
  assert_equals_the_command_line(scores, ref, hyp)
  assert 0 < scores['bleu']['bp'] <= 1 and 0 < scores['ter']['score'] < 100


def test_the_metrics_asked_for_and_no_others():
  """Training's dev BLEU (the default) costs no chrF or TER; config.eval_metrics chooses any
  of the three, the paper's tokenized BLEU always beside them."""
  every = bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de', metrics=bleu.METRICS)
  default = bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de')
  assert default == {k: v for k, v in every.items() if k not in ('chrf', 'ter')}
  assert bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de', metrics=('bleu',)) == default
  chrf = bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de', metrics=('chrf',))
  assert chrf == {'tok_bleu': every['tok_bleu'], 'chrf': every['chrf']}
  assert [line.split(' = ')[0].split('|')[0] for line in bleu.report(chrf)] == [
      'chrF2', "tokenized BLEU (the paper's, §6.1)"]
  with pytest.raises(ValueError, match='meteor'):
    bleu.bleu_scores(HYPOTHESES, REFERENCES, target_lang='de', metrics=('bleu', 'meteor'))


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
