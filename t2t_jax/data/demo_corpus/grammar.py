"""The demo corpus's grammar: sentence structures and their English and German renderings.

`Sentence`, built from `Clause`, `NounPhrase` and `PrepPhrase`, is the abstract structure;
`render_english` and `translate` turn it into text (the package's docstring says why). Holds
the German inflection tables and contractions; the words themselves are in lexicon.py.
"""
from __future__ import annotations

import dataclasses

from t2t_jax.data.demo_corpus.lexicon import (
  ADJECTIVES,
  ADVERBS,
  CONJUNCTIONS,
  DETERMINERS,
  DIRECTIONAL,
  MODALS,
  NOUNS,
  PREPOSITIONS,
  SUBORDINATORS,
  VERBS,
)

CASES = ('nom', 'acc', 'dat')

# Inflection tables, indexed [gender or 'p'][case index].
_DER = {'m': ('der', 'den', 'dem'), 'f': ('die', 'die', 'der'), 'n': ('das', 'das', 'dem'),
        'p': ('die', 'die', 'den')}
_STRONG = {'m': ('er', 'en', 'em'), 'f': ('e', 'e', 'er'), 'n': ('es', 'es', 'em'),
           'p': ('e', 'e', 'en')}
_WEAK = {'m': ('e', 'en', 'en'), 'f': ('e', 'e', 'en'), 'n': ('e', 'e', 'en'),
         'p': ('en', 'en', 'en')}
_EIN = {'m': ('', 'en', 'em'), 'f': ('e', 'e', 'er'), 'n': ('', '', 'em'),
        'p': ('e', 'e', 'en')}
_RELATIVE = {**_DER, 'p': ('die', 'die', 'denen')}  # the article but for the dative plural

# Standard German fuses these prepositions with the definite article.
_CONTRACTIONS = {('in', 'dem'): 'im', ('in', 'das'): 'ins', ('an', 'dem'): 'am',
                 ('zu', 'dem'): 'zum', ('zu', 'der'): 'zur', ('von', 'dem'): 'vom'}


# ---------------------------------------------------------------------- abstract structure


@dataclasses.dataclass(frozen=True)
class NounPhrase:
  """Determiner, adjectives and noun; optionally a relative clause (`Clause` with a gap)."""
  noun: str  # a key of NOUNS
  det: str = 'the'  # a key of DETERMINERS
  plural: bool = False
  adjectives: tuple[str, ...] = ()
  very: bool = False  # "very" before the first adjective
  relative: Clause | None = None


@dataclasses.dataclass(frozen=True)
class PrepPhrase:
  prep: str  # a key of PREPOSITIONS
  np: NounPhrase


@dataclasses.dataclass(frozen=True)
class Clause:
  """One clause. In a relative clause, `subject` (subject gap) or `obj` (object gap) is None.

  `obj` is the accusative, dative or prepositional object as the verb's frame says;
  `recipient` the dative of a ditransitive verb. A copula clause has `predicate` (an
  adjective key) or a locative `pp`. `complement` is the dass-clause of a 'that' verb.
  """
  subject: NounPhrase | None
  verb: str  # a key of VERBS
  obj: NounPhrase | None = None
  recipient: NounPhrase | None = None
  to_recipient: bool = False  # English "gives the book to the child"
  predicate: str | None = None
  very: bool = False  # "very" before the predicate adjective
  pp: PrepPhrase | None = None
  tense: str = 'present'  # 'present' or 'perfect'
  modal: str | None = None  # a key of MODALS
  negated: bool = False
  adverb: str | None = None  # a key of ADVERBS
  fronted: bool = False  # the adverb opens the (main) clause
  complement: Clause | None = None
  gap: str | None = None  # in a relative clause: 'subject' or 'object'


@dataclasses.dataclass(frozen=True)
class Sentence:
  """A main clause, optionally joined to a second: `link` is a key of CONJUNCTIONS (a second
  main clause) or of SUBORDINATORS (a subordinate clause, which comes first if `sub_first`)."""
  main: Clause
  link: str | None = None
  second: Clause | None = None
  sub_first: bool = False
  question: bool = False


# -------------------------------------------------------------------------- shared helpers


def _gender_key(np: NounPhrase) -> str:
  return 'p' if np.plural else NOUNS[np.noun].gender


def _agreement_plural(clause: Clause, head: NounPhrase | None) -> bool:
  """Plural agreement: the subject's, or the head noun's in a subject-gap relative clause."""
  return (clause.subject or head).plural


def _finish(tokens: list[str], end: str) -> str:
  """Joins tokens, attaching punctuation and dropping commas that close nothing."""
  out: list[str] = []
  for tok in tokens:  # no empty token, and no comma first or after a comma
    if tok and (tok != ',' or (out and out[-1] != ',')):
      out.append(tok)
  while out and out[-1] == ',':
    out.pop()
  text = ' '.join(out).replace(' ,', ',') + end
  return text[0].upper() + text[1:]


# --------------------------------------------------------------------------------- English


def _en_np(np: NounPhrase) -> list[str]:
  noun = NOUNS[np.noun]
  det = DETERMINERS[np.det][1 if np.plural else 0]
  words = ([det] if det else []) + (['very'] if np.very else []) + list(np.adjectives)
  words.append(noun.en_pl if np.plural else noun.en)
  if det == 'a' and words[1][0] in 'aeiou':
    words[0] = 'an'
  if np.relative is not None:
    pronoun = 'who' if np.relative.gap == 'subject' and 'person' in noun.tags else 'that'
    words += [pronoun] + _en_clause(np.relative, head=np)
  return words


def _en_verb_group(c: Clause, plural: bool, question: bool) -> tuple[str | None, list[str]]:
  """(auxiliary, rest): a question puts the subject between them."""
  v = VERBS[c.verb]
  adverb = [c.adverb] if c.adverb and not c.fronted and ADVERBS[c.adverb][1] == 'freq' else []
  neg = ['not'] if c.negated else []
  do = 'do' if plural else 'does'
  if c.modal == 'want':
    if c.negated or question:
      return do, neg + ['want', 'to', v.en]
    return None, ['want' if plural else 'wants', 'to', v.en]
  if c.modal:
    return ('cannot' if c.negated else c.modal), [v.en]
  if c.tense == 'perfect':
    return ('have' if plural else 'has'), neg + adverb + [
        'been' if v.frame == 'cop' else v.en_part]
  if v.frame == 'cop':
    return ('are' if plural else 'is'), neg + adverb
  if c.negated or question:
    return do, neg + adverb + [v.en]
  return None, adverb + [v.en if plural else v.en_3sg]


def _en_complements(c: Clause) -> list[str]:
  """Everything after the verb group, in English order."""
  v = VERBS[c.verb]
  words: list[str] = []
  if c.recipient is not None and not c.to_recipient:
    words += _en_np(c.recipient)
  if c.obj is not None:
    words += _en_np(c.obj)
  if c.recipient is not None and c.to_recipient:
    words += ['to'] + _en_np(c.recipient)
  if c.predicate:
    words += (['very'] if c.very else []) + [c.predicate]
  if c.pp is not None:
    words += [c.pp.prep] + _en_np(c.pp.np)
  if c.adverb and not c.fronted and ADVERBS[c.adverb][1] != 'freq':
    words.append(c.adverb)
  if v.frame == 'that':
    words += ['that'] + _en_clause(c.complement)
  return words


def _en_clause(c: Clause, *, question: bool = False, head: NounPhrase | None = None
               ) -> list[str]:
  """The clause in English; for a relative clause (head given) without the gapped NP."""
  aux, rest = _en_verb_group(c, _agreement_plural(c, head), question)
  subject = _en_np(c.subject) if c.subject is not None else []
  front = [c.adverb] if c.fronted else []
  if question:
    return [aux] + subject + rest + _en_complements(c)
  return front + subject + ([aux] if aux else []) + rest + _en_complements(c)


def render_english(s: Sentence) -> str:
  """The English sentence for a structure."""
  if s.question:
    return _finish(_en_clause(s.main, question=True), '?')
  main = _en_clause(s.main)
  if s.link is None:
    return _finish(main, '.')
  second = _en_clause(s.second)
  if s.sub_first:
    return _finish([s.link] + second + [','] + main, '.')
  return _finish(main + ([','] if s.link == 'but' else []) + [s.link] + second, '.')


# ---------------------------------------------------------------------------------- German


def _de_article(det: str, g: str, ci: int) -> tuple[str, dict[str, tuple[str, ...]]]:
  """The determiner's German form and the adjective endings it requires."""
  _, _, stem, kind = DETERMINERS[det]
  if kind == 'def':
    return _DER[g][ci], _WEAK
  if kind == 'derword':
    return stem + _STRONG[g][ci], _WEAK
  if kind == 'quantifier':
    return stem + _STRONG[g][ci], _STRONG
  if kind == 'einword':
    ending = _EIN[g][ci]
    # Where the ein-word shows no ending, the adjective carries the strong one.
    return stem + ending, (_STRONG if not ending else _WEAK)
  return stem, _STRONG  # bare nouns and numbers: the adjective shows the case


def _de_np(np: NounPhrase, case: str, prep: str | None = None) -> list[str]:
  """The NP in German, after `prep` (fused with the article where German does) if given."""
  g, ci = _gender_key(np), CASES.index(case)
  article, endings = _de_article(np.det, g, ci)
  words = [article] if article else []
  if np.very:
    words.append('sehr')
  words += [ADJECTIVES[adj].de_stem + endings[g][ci] for adj in np.adjectives]
  words.append(NOUNS[np.noun].german(case, np.plural))
  if prep is not None:
    fused = _CONTRACTIONS.get((prep, article)) if np.det == 'the' else None
    words = [fused] + words[1:] if fused else [prep] + words
  if np.relative is not None:
    words += [','] + _de_relative(np.relative, np) + [',']
  return words


def _de_pp(pp: PrepPhrase) -> list[str]:
  de, case, _ = PREPOSITIONS[pp.prep]
  return _de_np(pp.np, case, de)


def _de_relative(c: Clause, head: NounPhrase) -> list[str]:
  case = 'nom' if c.gap == 'subject' else VERBS[c.verb].object_case
  return _de_parts(c, head).verb_final(_RELATIVE[_gender_key(head)][CASES.index(case)])


@dataclasses.dataclass
class _GermanParts:
  """The topological fields of a German clause, to be ordered by clause type."""
  subject: list[str]
  adverb: list[str]
  middle: list[str]  # the rest of the middle field
  finite: str  # the finite verb in second/first position
  bracket: list[str]  # right bracket of a main clause
  final: list[str]  # verb cluster of a verb-final clause
  extraposed: list[str]  # the dass-clause, after the right bracket

  def verb_final(self, first: str) -> list[str]:
    """A verb-final clause opened by `first` (a conjunction or relative pronoun)."""
    return [first] + self.subject + self.adverb + self.middle + self.final


def _de_verbs(c: Clause, plural: bool) -> tuple[str, list[str], list[str]]:
  """(finite verb for V1/V2, right bracket, verb-final cluster)."""
  v = VERBS[c.verb]
  if c.modal:
    finite = MODALS[c.modal][plural]
    return finite, [v.de_inf], [v.de_inf, finite]
  if c.tense == 'perfect':
    finite = {'haben': ('hat', 'haben'), 'sein': ('ist', 'sind')}[v.aux][plural]
    return finite, [v.de_part], [v.de_part, finite]
  finite = v.de_pl if plural else v.de_3sg
  return finite, ([v.prefix] if v.prefix else []), [v.prefix + finite]


def negates_object(c: Clause) -> bool:
  """Whether the negation goes into an indefinite object as "kein", not "nicht"."""
  v = VERBS[c.verb]
  return (c.negated and c.obj is not None and v.frame in ('acc', 'dat', 'ditr')
          and c.obj.det in ('a', 'bare'))


def _de_middle(c: Clause) -> list[str]:
  """Objects, negation, PPs and predicate in German middle-field order."""
  v = VERBS[c.verb]
  keinified = negates_object(c)
  objects = _de_np(c.recipient, 'dat') if c.recipient is not None else []
  complement: list[str] = []
  if c.obj is not None:
    # Negates an indefinite object: "does not see a dog" -> "sieht keinen Hund".
    obj = dataclasses.replace(c.obj, det='no') if keinified else c.obj
    if '.' in v.frame:  # a prepositional object is a complement, like a direction
      prep, case = v.frame.split('.')
      complement = _de_np(obj, case, prep)
    else:
      objects += _de_np(obj, v.object_case)
  adjunct: list[str] = []
  if c.pp is not None:
    if c.pp.prep in DIRECTIONAL or v.frame == 'cop':
      complement = _de_pp(c.pp) + complement
    else:
      adjunct = _de_pp(c.pp)
  if c.predicate:
    complement = (['sehr'] if c.very else []) + [ADJECTIVES[c.predicate].de]
  if not c.negated or keinified:
    return objects + adjunct + complement
  # "nicht" precedes complements (nicht auf den Bus, nicht müde, nicht in den Park) and
  # an adjunct PP of a clause without objects (nicht im Garten); else it ends the field.
  if complement:
    return objects + adjunct + ['nicht'] + complement
  return objects + ['nicht'] + adjunct


def _de_parts(c: Clause, head: NounPhrase | None = None) -> _GermanParts:
  plural = _agreement_plural(c, head)
  finite, bracket, final = _de_verbs(c, plural)
  extraposed: list[str] = []
  if c.complement is not None:
    # The closing comma separates the dass-clause from a following "und ...".
    extraposed = [','] + _de_parts(c.complement).verb_final('dass') + [',']
  return _GermanParts(
      subject=_de_np(c.subject, 'nom') if c.subject is not None else [],
      adverb=[ADVERBS[c.adverb][0]] if c.adverb and not c.fronted else [],
      middle=_de_middle(c), finite=finite, bracket=bracket, final=final,
      extraposed=extraposed)


def _de_main(c: Clause, *, verb_first: bool = False) -> list[str]:
  """A main clause: verb-second, or verb-first after a fronted subordinate clause."""
  p = _de_parts(c)
  if c.fronted:
    prefield, rest = [ADVERBS[c.adverb][0]], p.subject
  elif verb_first:
    prefield, rest = [], p.subject
  else:
    prefield, rest = p.subject, []
  return prefield + [p.finite] + rest + p.adverb + p.middle + p.bracket + p.extraposed


def translate(s: Sentence) -> str:
  """The German sentence for a structure (the reference translation of render_english)."""
  if s.question:
    return _finish(_de_main(s.main, verb_first=True), '?')
  if s.link is None:
    return _finish(_de_main(s.main), '.')
  if s.link in CONJUNCTIONS:
    comma = [','] if s.link == 'but' else []
    return _finish(_de_main(s.main) + comma + [CONJUNCTIONS[s.link]] +
                   _de_main(s.second), '.')
  p = _de_parts(s.second)
  sub = p.verb_final(SUBORDINATORS[s.link]) + p.extraposed  # verb-final, then its dass-clause
  if s.sub_first:
    # The subordinate clause fills the prefield, so the main verb comes next.
    return _finish(sub + [','] + _de_main(s.main, verb_first=True), '.')
  return _finish(_de_main(s.main) + [','] + sub, '.')


def render_pair(s: Sentence) -> tuple[str, str]:
  """(English, German) for a structure."""
  return render_english(s), translate(s)
