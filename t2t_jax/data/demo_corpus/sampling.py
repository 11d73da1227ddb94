"""Sampling the demo corpus: random sentence structures, (English, German) pairs, splits.

`sample_sentence` draws a `Sentence` from a seeded `random.Random`, keeping only the
combinations that grammar.py renders correctly and unambiguously in both languages;
`generate_pairs` and `split_pairs` turn that into length-filtered pairs and held-out splits,
a deterministic function of the seed (the global RNG plays no part).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import random
from collections.abc import Iterable

from t2t_jax.data.demo_corpus.grammar import (
  Clause,
  NounPhrase,
  PrepPhrase,
  Sentence,
  negates_object,
  render_pair,
)
from t2t_jax.data.demo_corpus.lexicon import (
  ADJECTIVES,
  ADVERBS,
  CONJUNCTIONS,
  DIRECTIONAL,
  NOUNS,
  NUMBERS,
  PP_GROUPS,
  PREPOSITIONS,
  SUBORDINATORS,
  VERBS,
  Verb,
)

# --------------------------------------------------------------------- sentence structures

_NP_DETS = {
    # (role, plural) -> (determiners, weights)
    ('subject', False): (('the', 'a', 'this', 'my', 'our', 'his', 'her', 'every', 'no'),
                         (8, 4, 1, 1, .5, .5, .5, .4, .3)),
    ('object', False): (('the', 'a', 'this', 'my', 'our', 'his', 'her', 'no'),
                        (8, 4, 1, 1, .5, .5, .5, .3)),
    ('pp', False): (('the', 'a', 'this', 'my', 'our', 'his', 'her'),
                    (8, 3, 1, 1, .5, .5, .5)),
    ('subject', True): (('the', 'bare', 'this', 'my', 'our', 'his', 'her', 'many', 'some',
                         'no') + tuple(NUMBERS), (5, 3, 1, .7, .5, .4, .4, .6, .6, .3) +
                        (.2,) * len(NUMBERS)),
    ('pp', True): (('the', 'bare', 'this', 'my', 'our'), (5, 2, 1, .5, .5)),
    ('mass', False): (('the', 'bare', 'this', 'my', 'our', 'his', 'her'),
                      (5, 3, 1, 1, .5, .5, .5)),
}
_NP_DETS['object', True] = _NP_DETS['subject', True]
_FIXED_DETS = frozenset({'every', 'no', 'many', 'some'} | set(NUMBERS))
# "Always the man sees the dog" is not idiomatic English.
_UNFRONTABLE = frozenset({'always'})


@functools.cache
def _nouns_with(tags: frozenset[str]) -> tuple[str, ...]:
  return tuple(k for k, n in NOUNS.items() if n.tags & tags)


@functools.cache
def _adjectives_for(noun: str) -> tuple[str, ...]:
  return tuple(k for k, a in ADJECTIVES.items() if a.tags & NOUNS[noun].tags)


def _sample_adjectives(rng: random.Random, noun: str) -> tuple[tuple[str, ...], bool]:
  r = rng.random()
  fitting = _adjectives_for(noun)
  if r < 0.62 or not fitting:
    return (), False
  first = rng.choice(fitting)
  adjectives = (first,)
  if r > 0.92:
    second = rng.choice(fitting)
    if ADJECTIVES[second].order != ADJECTIVES[first].order:
      adjectives = tuple(sorted((first, second), key=lambda a: ADJECTIVES[a].order))
  very = ADJECTIVES[adjectives[0]].gradable and rng.random() < 0.15
  return adjectives, very


def _sample_np(rng: random.Random, tags: frozenset[str], role: str) -> NounPhrase:
  """A noun phrase whose noun has one of `tags`; role is subject, object or pp."""
  key = rng.choice(_nouns_with(tags))
  noun = NOUNS[key]
  if 'name' in noun.tags:
    return NounPhrase(key, det='name')
  plural = 'mass' not in noun.tags and rng.random() < 0.3
  dets, weights = _NP_DETS['mass' if 'mass' in noun.tags else role, plural]
  det = rng.choices(dets, weights)[0]
  adjectives, very = _sample_adjectives(rng, key)
  return NounPhrase(key, det, plural, adjectives, very)


def _sample_np_besides(rng: random.Random, tags: frozenset[str], role: str,
                       subject: NounPhrase | None) -> NounPhrase:
  """`_sample_np`, drawn once more if its noun is the subject's ("Peter thanks Peter")."""
  np = _sample_np(rng, tags, role)
  if subject is not None and np.noun == subject.noun:
    np = _sample_np(rng, tags, role)
  return np


@functools.cache
def _verb_pool(kind: str, head_tags: frozenset[str] = frozenset()) -> tuple[str, ...]:
  """Verbs usable in a clause of this kind ('regular', 'cop', 'that', 'relsubj', 'relobj')."""
  if kind in ('cop', 'that'):
    return tuple(k for k, v in VERBS.items() if v.frame == kind)
  if kind == 'regular':
    return tuple(k for k, v in VERBS.items() if v.frame not in ('cop', 'that'))
  if kind == 'relsubj':
    return tuple(k for k, v in VERBS.items() if v.frame != 'that' and v.subj & head_tags)
  # Object relatives: English must not strand a preposition ("that the man waits for").
  return tuple(k for k, v in VERBS.items() if v.frame in ('acc', 'dat', 'ditr')
               and v.obj & head_tags and 'pres' not in v.flags)


def _sample_verb(rng: random.Random, kind: str, head: NounPhrase | None) -> str:
  if kind in ('relsubj', 'relobj'):
    return rng.choice(_verb_pool(kind, NOUNS[head.noun].tags))
  r = rng.random()
  if kind == 'main' and r < 0.12:
    return rng.choice(_verb_pool('that'))
  if r > 0.88:
    return 'be'
  return rng.choice(_verb_pool('regular'))


def _sample_tense(rng: random.Random, v: Verb, kind: str) -> tuple[str, str | None]:
  r = rng.random()
  if r < 0.15 and kind not in ('relsubj', 'relobj') and not {'nomod', 'pres'} & v.flags:
    return 'present', rng.choice(('can', 'want') if kind == 'question' else
                                 ('can', 'must', 'want'))
  if r < 0.45 and 'pres' not in v.flags:
    return 'perfect', None
  return 'present', None


def _sample_adverb(rng: random.Random, c: Clause, kind: str) -> Clause:
  if kind in ('relsubj', 'relobj') or rng.random() > 0.25:
    return c
  adverb = rng.choice(tuple(ADVERBS))
  category = ADVERBS[adverb][1]
  if ((category == 'time_future' and c.tense == 'perfect') or
      (category == 'freq' and c.modal)):
    return c
  frontable = kind == 'main' and adverb not in _UNFRONTABLE
  # A clause-final English time adverb after a that-clause would modify that clause.
  must_front = VERBS[c.verb].frame == 'that' and category != 'freq'
  if must_front and not frontable:
    return c
  fronted = frontable and (must_front or rng.random() < 0.4)
  return dataclasses.replace(c, adverb=adverb, fronted=fronted)


def _negation_ok(c: Clause) -> bool:
  """Whether the clause has an unambiguous, idiomatic negation in both languages."""
  v = VERBS[c.verb]
  if c.modal == 'must' or (c.adverb and ADVERBS[c.adverb][1] == 'freq'):
    return False  # "muss nicht" means "need not"; "oft nicht" is a different claim
  if c.subject is not None and c.subject.det in ('no', 'every'):
    return False
  if any(np is not None and np.det in _FIXED_DETS for np in (c.obj, c.recipient)):
    return False
  if c.recipient is not None and c.recipient.det in ('a', 'bare') and c.obj.det not in (
      'a', 'bare'):
    return False  # "does not give a child the book"
  has_objects = c.obj is not None and v.frame in ('acc', 'dat', 'ditr')
  adjunct = c.pp is not None and c.pp.prep not in DIRECTIONAL and v.frame != 'cop'
  # "sieht den Hund nicht im Park" would deny only the place.
  return not (has_objects and adjunct and not negates_object(
      dataclasses.replace(c, negated=True)))


def _sample_pp(rng: random.Random, v: Verb, kind: str,
               subject: NounPhrase | None) -> PrepPhrase | None:
  if not v.pps or rng.random() > (0.2 if kind in ('relsubj', 'relobj') else 0.35):
    return None
  prep = rng.choice(v.pps)
  return PrepPhrase(prep, _sample_np_besides(rng, frozenset(PREPOSITIONS[prep][2]), 'pp', subject))


def _sample_copula(rng: random.Random, subject: NounPhrase) -> dict:
  """Predicate of a copula clause: an adjective that fits the subject, or a place."""
  # "Is the warm milk warm?" says nothing: skip the subject's own adjectives.
  fitting = [a for a in _adjectives_for(subject.noun) if a not in subject.adjectives]
  if fitting and rng.random() < 0.75:
    predicate = rng.choice(fitting)
    return {'predicate': predicate,
            'very': ADJECTIVES[predicate].gradable and rng.random() < 0.2}
  prep = rng.choice(PP_GROUPS['loc'])
  return {'pp': PrepPhrase(prep, _sample_np(rng, frozenset(PREPOSITIONS[prep][2]), 'pp'))}


def _sample_objects(rng: random.Random, v: Verb, kind: str,
                    subject: NounPhrase | None) -> dict:
  fields = {}
  if v.object_case and kind != 'relobj' and not ('opt' in v.flags and rng.random() < 0.3):
    # "spricht über keine Läden" is odd: prepositional objects get the PP determiners.
    role = 'pp' if '.' in v.frame else 'object'
    fields['obj'] = _sample_np_besides(rng, v.obj, role, subject)
  if v.frame == 'ditr':
    fields['recipient'] = _sample_np_besides(rng, v.recipient, 'object', subject)
    fields['to_recipient'] = rng.random() < 0.4
  return fields


def _sample_clause(rng: random.Random, kind: str, head: NounPhrase | None = None) -> Clause:
  """kind: main, sub, complement, question, relsubj or relobj (head = the modified NP)."""
  key = _sample_verb(rng, kind, head)
  v = VERBS[key]
  tense, modal = _sample_tense(rng, v, kind)
  subject = None if kind == 'relsubj' else _sample_np(rng, v.subj, 'subject')
  fields = _sample_objects(rng, v, kind, subject)
  if v.frame == 'cop':
    fields.update(_sample_copula(rng, subject or head))
  else:
    fields['pp'] = _sample_pp(rng, v, kind, subject)
  if v.frame == 'that':
    fields['complement'] = _sample_clause(rng, 'complement')
  gap = {'relsubj': 'subject', 'relobj': 'object'}.get(kind)
  c = Clause(subject, key, tense=tense, modal=modal, gap=gap, **fields)
  c = _sample_adverb(rng, c, kind)
  if (kind not in ('question', 'relsubj', 'relobj') and rng.random() < 0.18 and
      _negation_ok(c)):
    c = dataclasses.replace(c, negated=True)
  return c


def _with_relative(rng: random.Random, np: NounPhrase) -> NounPhrase:
  tags = NOUNS[np.noun].tags
  kinds = [k for k in ('relobj', 'relsubj') if _verb_pool(k, tags)]
  if not kinds:
    return np
  kind = kinds[0] if rng.random() < 0.4 else kinds[-1]
  return dataclasses.replace(np, relative=_sample_clause(rng, kind, np))


def _relativizable(np: NounPhrase | None) -> bool:
  return np is not None and np.det in ('the', 'a', 'this', 'bare') and np.relative is None


def _maybe_relative(rng: random.Random, c: Clause, *, prefield_subject: bool) -> Clause:
  """Adds a relative clause where German needs no extraposition to keep it in place."""
  r = rng.random()
  if r < 0.10 and prefield_subject and not c.fronted and _relativizable(c.subject):
    return dataclasses.replace(c, subject=_with_relative(rng, c.subject))
  v = VERBS[c.verb]
  # The object must end the German clause: nothing may follow it in the middle field
  # or the right bracket, and no English time adverb may follow it.
  object_last = (v.frame in ('acc', 'dat', 'ditr') and not c.to_recipient and
                 c.tense == 'present' and not c.modal and not v.prefix and
                 not c.negated and c.pp is None and c.complement is None and
                 not (c.adverb and not c.fronted and ADVERBS[c.adverb][1] != 'freq'))
  if 0.10 <= r < 0.22 and object_last and _relativizable(c.obj):
    return dataclasses.replace(c, obj=_with_relative(rng, c.obj))
  return c


def sample_sentence(rng: random.Random) -> Sentence:
  """One random sentence structure (not length-filtered)."""
  r = rng.random()
  if r < 0.08:
    return Sentence(_sample_clause(rng, 'question'), question=True)
  main = _maybe_relative(rng, _sample_clause(rng, 'main'), prefield_subject=True)
  if r < 0.45:
    return Sentence(main)
  if r < 0.62:
    second = _maybe_relative(rng, _sample_clause(rng, 'main'), prefield_subject=True)
    return Sentence(main, rng.choice(tuple(CONJUNCTIONS)), second)
  second = _sample_clause(rng, 'sub')
  link = rng.choice(tuple(SUBORDINATORS))
  if link == 'when' and 'perfect' in (main.tense, second.tense):
    link = 'because'  # past events would need "als", not "wenn"
  if r < 0.82:
    return Sentence(main, link, second)
  # A fronted subordinate clause takes the prefield: no fronted adverb, no relative there.
  main = dataclasses.replace(_sample_clause(rng, 'main'), fronted=False)
  return Sentence(main, link, second, sub_first=True)


# ------------------------------------------------------------------------ pairs and splits

MIN_WORDS, MAX_WORDS = 4, 30


def _pair_stream(rng: random.Random) -> Iterable[tuple[str, str]]:
  while True:
    en, de = render_pair(sample_sentence(rng))
    if MIN_WORDS <= en.count(' ') + 1 <= MAX_WORDS and de.count(' ') + 1 <= MAX_WORDS + 4:
      yield en, de


def generate_pairs(num_pairs: int, seed: int) -> list[tuple[str, str]]:
  """`num_pairs` (English, German) pairs, a deterministic function of `seed`."""
  return list(itertools.islice(_pair_stream(random.Random(seed)), num_pairs))


def split_pairs(num_train: int, num_dev: int, num_test: int, seed: int
                ) -> dict[str, list[tuple[str, str]]]:
  """Train, dev and test pairs; no English sentence of one split occurs in another."""
  train = generate_pairs(num_train, seed)
  seen = {en for en, _ in train}
  splits = {'train': train}
  for split, size in (('dev', num_dev), ('test', num_test)):
    # Own streams, so train does not change with the held-out sizes.
    stream = _pair_stream(random.Random(f'{seed}:{split}'))
    pairs = list(itertools.islice((p for p in stream if p[0] not in seen), size))
    seen.update(en for en, _ in pairs)
    splits[split] = pairs
  return splits

