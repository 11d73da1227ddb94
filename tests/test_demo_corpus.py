"""Tests for the generated demo corpus: determinism, held-out splits, files, German grammar.

The grammar checks do not reuse demo_corpus's inflection tables: articles, adjective
endings, prepositions and contractions are written out here from a German grammar, and
whole sentences are translated by hand.
"""
import os
import random
import re
import subprocess
import sys
import time

import pytest

from t2t_jax.data import demo_corpus as dc
from t2t_jax.data.demo_corpus import Clause, Sentence
from t2t_jax.data.demo_corpus import NounPhrase as NP
from t2t_jax.data.demo_corpus import PrepPhrase as PP

# ---------------------------------------------------------------------------------------
# Hand-translated sentences.
# ---------------------------------------------------------------------------------------

HAND_TRANSLATED = [
    (Sentence(Clause(NP('man'), 'see', obj=NP('dog'))),
     'The man sees the dog.', 'Der Mann sieht den Hund.'),
    (Sentence(Clause(NP('woman', det='a'), 'help', obj=NP('man', adjectives=('old',)))),
     'A woman helps the old man.', 'Eine Frau hilft dem alten Mann.'),
    (Sentence(Clause(NP('man'), 'see', obj=NP('dog', det='a', adjectives=('big',)),
                     adverb='today', fronted=True)),
     'Today the man sees a big dog.', 'Heute sieht der Mann einen großen Hund.'),
    (Sentence(Clause(NP('child'), 'laugh'), 'because',
              Clause(NP('dog'), 'see', obj=NP('ball'))),
     'The child laughs because the dog sees the ball.',
     'Das Kind lacht, weil der Hund den Ball sieht.'),
    (Sentence(Clause(NP('boy'), 'call', obj=NP('teacher'), tense='perfect')),
     'The boy has called the teacher.', 'Der Junge hat den Lehrer angerufen.'),
    (Sentence(Clause(NP('woman'), 'sleep'), 'when',
              Clause(NP('child', plural=True), 'invite', obj=NP('neighbour')),
              sub_first=True),
     'When the children invite the neighbour, the woman sleeps.',
     'Wenn die Kinder den Nachbarn einladen, schläft die Frau.'),
    (Sentence(Clause(NP('father'), 'give', obj=NP('book', det='a'),
                     recipient=NP('girl', det='my', plural=True), to_recipient=True,
                     modal='want', negated=True)),
     'The father does not want to give a book to my girls.',
     'Der Vater will meinen Mädchen kein Buch geben.'),
    (Sentence(Clause(NP('student', det='a'), 'wait for', obj=NP('bus'),
                     pp=PP('in', NP('park')), negated=True)),
     'A student does not wait for the bus in the park.',
     'Ein Student wartet im Park nicht auf den Bus.'),
    (Sentence(Clause(NP('cat', det='our'), 'run', pp=PP('into', NP('house')),
                     tense='perfect')),
     'Our cat has run into the house.', 'Unsere Katze ist ins Haus gelaufen.'),
    (Sentence(Clause(NP('Anna', det='name'), 'say that',
                     complement=Clause(NP('horse', plural=True), 'be', predicate='tired',
                                       very=True, negated=True))),
     'Anna says that the horses are not very tired.',
     'Anna sagt, dass die Pferde nicht sehr müde sind.'),
    (Sentence(Clause(NP('man', relative=Clause(None, 'help', obj=NP('child', plural=True),
                                               gap='subject')), 'laugh')),
     'The man who helps the children laughs.', 'Der Mann, der den Kindern hilft, lacht.'),
    (Sentence(Clause(NP('woman'), 'read', obj=NP('letter', det='a', relative=Clause(
        NP('teacher'), 'write', tense='perfect', gap='object')))),
     'The woman reads a letter that the teacher has written.',
     'Die Frau liest einen Brief, den der Lehrer geschrieben hat.'),
    (Sentence(Clause(NP('boy', plural=True, relative=Clause(
        NP('doctor'), 'help', gap='object')), 'be', predicate='happy')),
     'The boys that the doctor helps are happy.',
     'Die Jungen, denen der Arzt hilft, sind glücklich.'),
    (Sentence(Clause(NP('neighbour', det='this'), 'pick up',
                     obj=NP('key', det='his', adjectives=('small',))), question=True),
     'Does this neighbour pick up his small key?',
     'Holt dieser Nachbar seinen kleinen Schlüssel ab?'),
    (Sentence(Clause(NP('bird', det='three', plural=True, adjectives=('small',)), 'sit',
                     pp=PP('on', NP('roof', adjectives=('red',))))),
     'Three small birds sit on the red roof.', 'Drei kleine Vögel sitzen auf dem roten Dach.'),
    (Sentence(Clause(NP('Peter', det='name'), 'play',
                     pp=PP('with', NP('dog', det='bare', plural=True, adjectives=('young',))))),
     'Peter plays with young dogs.', 'Peter spielt mit jungen Hunden.'),
    (Sentence(Clause(NP('child', det='every'), 'drink',
                     obj=NP('milk', det='bare', adjectives=('cold',)))),
     'Every child drinks cold milk.', 'Jedes Kind trinkt kalte Milch.'),
    (Sentence(Clause(NP('king'), 'sing', obj=NP('song', det='a'), tense='perfect'), 'but',
              Clause(NP('queen'), 'dance', adverb='often')),
     'The king has sung a song, but the queen often dances.',
     'Der König hat ein Lied gesungen, aber die Königin tanzt oft.'),
    (Sentence(Clause(NP('elephant', det='a'), 'go',
                     pp=PP('to', NP('school', adjectives=('old',))), modal='can')),
     'An elephant can go to the old school.', 'Ein Elefant kann zur alten Schule gehen.'),
    (Sentence(Clause(NP('doctor'), 'know that', tense='perfect',
                     complement=Clause(NP('nurse'), 'sleep')), 'and',
              Clause(NP('bear'), 'stay', pp=PP('in', NP('forest')))),
     'The doctor has known that the nurse sleeps and the bear stays in the forest.',
     'Der Arzt hat gewusst, dass die Krankenschwester schläft, und der Bär bleibt im Wald.'),
    (Sentence(Clause(NP('farmer', det='many', plural=True, adjectives=('tired',)), 'be',
                     pp=PP('next to', NP('cow', det='our', plural=True)), tense='perfect')),
     'Many tired farmers have been next to our cows.',
     'Viele müde Bauern sind neben unseren Kühen gewesen.'),
    (Sentence(Clause(NP('mother'), 'show', obj=NP('picture', det='bare', plural=True),
                     recipient=NP('child', det='a', adjectives=('sad',)))),
     'The mother shows a sad child pictures.',
     'Die Mutter zeigt einem traurigen Kind Bilder.'),
]


@pytest.mark.parametrize('sentence,english,german', HAND_TRANSLATED)
def test_hand_translated_sentences(sentence, english, german):
  assert dc.render_english(sentence) == english
  assert dc.translate(sentence) == german


# ---------------------------------------------------------------------------------------
# Grammar invariants over sampled sentences, against tables written out here.
# ---------------------------------------------------------------------------------------

# [gender or 'pl'] -> (nominative, accusative, dative)
ARTICLES = {
    'the': {'m': ('der', 'den', 'dem'), 'f': ('die', 'die', 'der'),
            'n': ('das', 'das', 'dem'), 'pl': ('die', 'die', 'den')},
    'this': {'m': ('dieser', 'diesen', 'diesem'), 'f': ('diese', 'diese', 'dieser'),
             'n': ('dieses', 'dieses', 'diesem'), 'pl': ('diese', 'diese', 'diesen')},
    'every': {'m': ('jeder', 'jeden', 'jedem'), 'f': ('jede', 'jede', 'jeder'),
              'n': ('jedes', 'jedes', 'jedem')},
    'a': {'m': ('ein', 'einen', 'einem'), 'f': ('eine', 'eine', 'einer'),
          'n': ('ein', 'ein', 'einem')},
    'no': {'m': ('kein', 'keinen', 'keinem'), 'f': ('keine', 'keine', 'keiner'),
           'n': ('kein', 'kein', 'keinem'), 'pl': ('keine', 'keine', 'keinen')},
    'my': {'m': ('mein', 'meinen', 'meinem'), 'f': ('meine', 'meine', 'meiner'),
           'n': ('mein', 'mein', 'meinem'), 'pl': ('meine', 'meine', 'meinen')},
    'our': {'m': ('unser', 'unseren', 'unserem'), 'f': ('unsere', 'unsere', 'unserer'),
            'n': ('unser', 'unser', 'unserem'), 'pl': ('unsere', 'unsere', 'unseren')},
    'his': {'m': ('sein', 'seinen', 'seinem'), 'f': ('seine', 'seine', 'seiner'),
            'n': ('sein', 'sein', 'seinem'), 'pl': ('seine', 'seine', 'seinen')},
    'her': {'m': ('ihr', 'ihren', 'ihrem'), 'f': ('ihre', 'ihre', 'ihrer'),
            'n': ('ihr', 'ihr', 'ihrem'), 'pl': ('ihre', 'ihre', 'ihren')},
    'many': {'pl': ('viele', 'viele', 'vielen')},
    'some': {'pl': ('einige', 'einige', 'einigen')},
}
NUMBER_WORDS = {'two': 'zwei', 'three': 'drei', 'four': 'vier', 'five': 'fünf',
                'six': 'sechs', 'seven': 'sieben', 'eight': 'acht', 'nine': 'neun',
                'ten': 'zehn'}
ADJECTIVE_ENDINGS = {
    # after der, dieser, jeder
    'weak': {'m': ('e', 'en', 'en'), 'f': ('e', 'e', 'en'), 'n': ('e', 'e', 'en'),
             'pl': ('en', 'en', 'en')},
    # after ein, kein and the possessives
    'mixed': {'m': ('er', 'en', 'en'), 'f': ('e', 'e', 'en'), 'n': ('es', 'es', 'en'),
              'pl': ('en', 'en', 'en')},
    # no article, numbers, viele, einige
    'strong': {'m': ('er', 'en', 'em'), 'f': ('e', 'e', 'er'), 'n': ('es', 'es', 'em'),
               'pl': ('e', 'e', 'en')},
}
DECLENSION = {'the': 'weak', 'this': 'weak', 'every': 'weak', 'a': 'mixed', 'no': 'mixed',
              'my': 'mixed', 'our': 'mixed', 'his': 'mixed', 'her': 'mixed'}
RELATIVE_PRONOUNS = {'m': ('der', 'den', 'dem'), 'f': ('die', 'die', 'der'),
                     'n': ('das', 'das', 'dem'), 'pl': ('die', 'die', 'denen')}
CASE_INDEX = {'nom': 0, 'acc': 1, 'dat': 2}
PREPOSITIONS = {'in': ('in', 'dat'), 'on': ('auf', 'dat'), 'under': ('unter', 'dat'),
                'behind': ('hinter', 'dat'), 'in front of': ('vor', 'dat'),
                'next to': ('neben', 'dat'), 'at': ('an', 'dat'), 'with': ('mit', 'dat'),
                'without': ('ohne', 'acc'), 'for': ('für', 'acc'), 'into': ('in', 'acc'),
                'onto': ('auf', 'acc'), 'to': ('zu', 'dat'), 'through': ('durch', 'acc'),
                'across': ('über', 'acc'), 'from': ('von', 'dat')}
CONTRACTIONS = {'in dem': 'im', 'in das': 'ins', 'an dem': 'am', 'zu dem': 'zum',
                'zu der': 'zur', 'von dem': 'vom'}
DATIVE_VERBS = {'help', 'thank', 'follow', 'answer', 'belong to'}
PREPOSITIONAL_VERBS = {'wait for': ('auf', 'acc'), 'think of': ('an', 'acc'),
                       'talk about': ('über', 'acc')}
SUBORDINATORS = {'weil', 'obwohl', 'wenn', 'während', 'dass'}
FINITE_AUXILIARIES = {'hat', 'haben', 'ist', 'sind', 'kann', 'können', 'muss', 'müssen',
                      'will', 'wollen'}


def expected_np(np, case, prep=None):
  """The German noun phrase (without a relative clause), from the tables above."""
  noun = dc.NOUNS[np.noun]
  g = 'pl' if np.plural else noun.gender
  ci = CASE_INDEX[case]
  words = []
  if np.det in ARTICLES:
    words.append(ARTICLES[np.det][g][ci])
  elif np.det in NUMBER_WORDS:
    words.append(NUMBER_WORDS[np.det])
  ending = ADJECTIVE_ENDINGS[DECLENSION.get(np.det, 'strong')][g][ci]
  words += (['sehr'] if np.very else []) + [
      dc.ADJECTIVES[a].de_stem + ending for a in np.adjectives]
  if np.plural:
    form = noun.de_pl
    if case == 'dat' and not form.endswith(('n', 's')):
      form += 'n'
  else:
    form = noun.de_weak if noun.de_weak and case != 'nom' else noun.de
  words.append(form)
  text = ' '.join(words)
  if prep:
    text = f'{prep} {text}'
    if np.det == 'the':
      head = ' '.join(text.split()[:2])
      if head in CONTRACTIONS:
        text = CONTRACTIONS[head] + text[len(head):]
  return text


def clause_noun_phrases(c):
  """(NP, case, German preposition) for every NP of a clause and of its sub-clauses."""
  if c.subject is not None:
    yield c.subject, 'nom', None
  if c.obj is not None:
    obj = c.obj
    if c.negated and obj.det in ('a', 'bare') and c.verb not in PREPOSITIONAL_VERBS:
      obj = NP(obj.noun, 'no', obj.plural, obj.adjectives, obj.very, obj.relative)
    if c.verb in PREPOSITIONAL_VERBS:
      prep, case = PREPOSITIONAL_VERBS[c.verb]
      yield obj, case, prep
    else:
      yield obj, 'dat' if c.verb in DATIVE_VERBS else 'acc', None
  if c.recipient is not None:
    yield c.recipient, 'dat', None
  if c.pp is not None:
    prep, case = PREPOSITIONS[c.pp.prep]
    yield c.pp.np, case, prep
  for np in (c.subject, c.obj, c.recipient):
    if np is not None and np.relative is not None:
      yield from clause_noun_phrases(np.relative)
  if c.complement is not None:
    yield from clause_noun_phrases(c.complement)


def sentence_clauses(s):
  return [c for c in (s.main, s.second) if c is not None]


def contains_phrase(text, phrase):
  """Whether `phrase` occurs as whole words (capitalised or not at the sentence start)."""
  for variant in (phrase, phrase[0].upper() + phrase[1:]):
    if re.search(r'(?<!\w)' + re.escape(variant) + r'(?!\w)', text):
      return True
  return False


def finite_forms():
  forms = set(FINITE_AUXILIARIES)
  for v in dc.VERBS.values():
    forms |= {v.de_3sg, v.de_pl, v.prefix + v.de_3sg, v.prefix + v.de_pl}
  return forms


@pytest.fixture(scope='module')
def sampled():
  rng = random.Random(1234)
  structures = [dc.sample_sentence(rng) for _ in range(1500)]
  return [(s, dc.render_english(s), dc.translate(s)) for s in structures]


def test_article_and_adjective_agreement(sampled):
  checked = 0
  for s, _, german in sampled:
    for c in sentence_clauses(s):
      for np, case, prep in clause_noun_phrases(c):
        expected = expected_np(np, case, prep)
        assert contains_phrase(german, expected), (expected, german)
        checked += 1
  assert checked > 3000


def test_relative_pronoun_agreement(sampled):
  checked = 0
  for s, _, german in sampled:
    for c in sentence_clauses(s):
      for np, case, prep in clause_noun_phrases(c):
        if np.relative is None:
          continue
        rel = np.relative
        rel_case = ('nom' if rel.gap == 'subject' else
                    'dat' if rel.verb in DATIVE_VERBS else 'acc')
        g = 'pl' if np.plural else dc.NOUNS[np.noun].gender
        pronoun = RELATIVE_PRONOUNS[g][CASE_INDEX[rel_case]]
        assert contains_phrase(german, f'{expected_np(np, case, prep)}, {pronoun}'), german
        checked += 1
  assert checked > 50


def test_subordinate_and_relative_clauses_are_verb_final(sampled):
  finite = finite_forms()
  relative_pronouns = {p for forms in RELATIVE_PRONOUNS.values() for p in forms}
  checked = 0
  for _, _, german in sampled:
    segments = [seg.split() for seg in re.split(r',\s*', german.rstrip('.?'))]
    for i, words in enumerate(segments):
      first = words[0].lower()
      if first in SUBORDINATORS or (i > 0 and first in relative_pronouns):
        assert words[-1] in finite, (words, german)
        checked += 1
  assert checked > 600


def test_verb_second_after_fronted_adverb_or_clause(sampled):
  finite = finite_forms()
  adverbs = {de.capitalize() for de, _ in dc.ADVERBS.values()}
  checked = 0
  for s, english, german in sampled:
    words = german.rstrip('.?').split()
    if words[0] in adverbs:
      assert words[1] in finite, german
      assert english.split()[0].lower() in dc.ADVERBS, english
      checked += 1
    if s.sub_first:
      after = german.split(', ')[1].split()[0]
      assert after in finite, german
      checked += 1
  assert checked > 100


def test_questions_put_the_finite_verb_first(sampled):
  finite = finite_forms()
  questions = [(e, g) for s, e, g in sampled if s.question]
  assert len(questions) > 50
  for english, german in questions:
    assert english.endswith('?') and german.endswith('?')
    assert german.split()[0].lower() in {f.lower() for f in finite}, german


def test_surface_form(sampled):
  for _, english, german in sampled:
    for text in (english, german):
      assert text[0].isupper() and text[-1] in '.?' and '  ' not in text, text
      assert not re.search(r'\s[,.?]|,,|,[^ ]', text), text
    assert english[-1] == german[-1]
  lengths = [len(e.split()) for e, _ in dc.generate_pairs(2000, 3)]
  assert min(lengths) >= dc.MIN_WORDS and max(lengths) <= dc.MAX_WORDS
  assert sum(lengths) / len(lengths) > 8  # a mix of simple and complex sentences


def test_english_determines_german():
  german_for = {}
  for english, german in dc.generate_pairs(20_000, 5):
    assert german_for.setdefault(english, german) == german, english


# ---------------------------------------------------------------------------------------
# Determinism, splits and files.
# ---------------------------------------------------------------------------------------

def test_generate_pairs_is_deterministic():
  first = dc.generate_pairs(300, seed=7)
  assert first == dc.generate_pairs(300, seed=7)
  assert first != dc.generate_pairs(300, seed=8)
  assert len(set(first)) > 290  # duplicates are rare
  random.seed(0)  # the global RNG must play no part
  assert dc.generate_pairs(300, seed=7) == first


def test_generation_is_fast():
  start = time.perf_counter()
  dc.generate_pairs(5000, seed=0)
  assert time.perf_counter() - start < 3.0  # 50k pairs in well under 10 s


def read_lines(path):
  with open(path, encoding='utf-8') as f:
    return f.read().splitlines()


def corpus_files(directory):
  return [os.path.join(directory, f'{split}.{lang}') for split in ('train', 'dev', 'test')
          for lang in ('en', 'de')] + [os.path.join(directory, 'corpus.json')]


def test_write_corpus_held_out_and_aligned(tmp_path):
  prefixes = dc.write_corpus(str(tmp_path), num_train=2000, num_dev=200, num_test=300,
                             seed=3)
  assert prefixes == {split: str(tmp_path / split) for split in ('train', 'dev', 'test')}
  expected = dc.split_pairs(2000, 200, 300, seed=3)
  english = {}
  for split, prefix in prefixes.items():
    en, de = read_lines(prefix + '.en'), read_lines(prefix + '.de')
    # Line i of .de translates line i of .en.
    assert list(zip(en, de, strict=True)) == expected[split]
    english[split] = set(en)
  assert [len(expected[s]) for s in ('train', 'dev', 'test')] == [2000, 200, 300]
  assert not english['dev'] & english['train']
  assert not english['test'] & english['train']
  assert not english['test'] & english['dev']
  # Train is exactly generate_pairs, independent of the held-out sizes.
  assert expected['train'] == dc.generate_pairs(2000, 3)


def test_write_corpus_reuses_matching_files(tmp_path):
  kwargs = dict(num_train=300, num_dev=50, num_test=50, seed=1)
  dc.write_corpus(str(tmp_path), **kwargs)
  mtimes = [os.stat(p).st_mtime_ns for p in corpus_files(tmp_path)]
  time.sleep(0.01)
  dc.write_corpus(str(tmp_path), **kwargs)
  assert [os.stat(p).st_mtime_ns for p in corpus_files(tmp_path)] == mtimes
  assert not [f for f in os.listdir(tmp_path) if '.tmp' in f]  # no temporary files left


def test_write_corpus_regenerates_on_change(tmp_path):
  kwargs = dict(num_train=300, num_dev=50, num_test=50, seed=1)
  prefixes = dc.write_corpus(str(tmp_path), **kwargs)
  original = read_lines(prefixes['train'] + '.de')
  dc.write_corpus(str(tmp_path), **{**kwargs, 'seed': 2})  # other parameters
  assert read_lines(prefixes['train'] + '.de') != original
  dc.write_corpus(str(tmp_path), **kwargs)
  assert read_lines(prefixes['train'] + '.de') == original
  with open(prefixes['train'] + '.de', 'w', encoding='utf-8') as f:
    f.write('damaged\n')  # a damaged file fails its checksum
  dc.write_corpus(str(tmp_path), **kwargs)
  assert read_lines(prefixes['train'] + '.de') == original


def test_write_corpus_files_are_readable_by_all(tmp_path):
  umask = os.umask(0o077)  # a private umask must not hide a shared workdir's corpus
  try:
    dc.write_corpus(str(tmp_path), num_train=50, num_dev=5, num_test=5, seed=1)
  finally:
    os.umask(umask)
  assert {os.stat(p).st_mode & 0o777 for p in corpus_files(tmp_path)} == {0o644}


def test_cli_writes_corpus_and_prints_summary(tmp_path, capsys):
  dc.main(['--out', str(tmp_path), '--num_train', '400', '--num_dev', '20',
           '--num_test', '20', '--samples', '3'])
  out = capsys.readouterr().out
  assert 'word types en' in out and out.count('EN: ') == 3 and out.count('DE: ') == 3
  assert len(read_lines(str(tmp_path / 'train.en'))) == 400


@pytest.mark.e2e
def test_python_dash_m_runs_the_cli(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 't2t_jax.data.demo_corpus', '--out', str(tmp_path),
       '--num_train', '50', '--num_dev', '5', '--num_test', '5', '--samples', '1'],
      capture_output=True, text=True, check=True)
  assert 'word types en' in result.stdout and 'EN: ' in result.stdout
  assert len(read_lines(str(tmp_path / 'dev.de'))) == 5
