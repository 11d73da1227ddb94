"""A generated English→German corpus for the built-in demo.

WMT14 is far too big for a 2-core CPU, so the demo trains on sentences drawn from a small
grammar instead. Each sentence is first sampled as an abstract structure (`Sentence`, built
from `Clause` and `NounPhrase`), then rendered twice: `render_english` and `translate`
(German). The German is therefore a deterministic function of the structure, and the
grammar avoids English ambiguities that would need two German renderings, so near-perfect
BLEU is reachable; yet the German differs from the English in the ways that make
translation need attention (Vaswani et al., 2017, §1):

* grammatical gender and case: der/den/dem alte(n) Mann, ein/einen/einem, weak nouns
  (den Jungen), dative plurals (den Kindern), preposition contractions (im, zum, ins);
* word order: verb-second after a fronted adverbial or subordinate clause, verb-final
  subordinate and relative clauses, participles, infinitives and separable prefixes at
  the end of the clause (hat ... gesehen, kann ... sehen, ruft ... an);
* negation as "nicht" or "kein", dative verbs (hilft dem Kind), prepositional objects
  (wartet auf den Bus), adverbs before objects (sieht heute den Hund).

Deviation from real data: the semantics is only roughly plausible (an elephant may read
a newspaper), and the English is in a restricted register (no pronouns, no "you").

The subpackage, in import order: lexicon.py (the words and their forms), grammar.py (the
structures and both renderers), sampling.py (random structures, pairs and splits),
writer.py (the corpus files and the command line `python -m t2t_jax.data.demo_corpus --out
DIR`). This module re-exports what the rest of t2t_jax and the tests use.
"""
from __future__ import annotations

from t2t_jax.data.demo_corpus.grammar import (
  Clause,
  NounPhrase,
  PrepPhrase,
  Sentence,
  render_english,
  translate,
)
from t2t_jax.data.demo_corpus.lexicon import ADJECTIVES, ADVERBS, NOUNS, VERBS
from t2t_jax.data.demo_corpus.sampling import (
  MAX_WORDS,
  MIN_WORDS,
  generate_pairs,
  sample_sentence,
  split_pairs,
)
from t2t_jax.data.demo_corpus.writer import main, write_corpus

__all__ = [
    'ADJECTIVES', 'ADVERBS', 'MAX_WORDS', 'MIN_WORDS', 'NOUNS', 'VERBS', 'Clause',
    'NounPhrase', 'PrepPhrase', 'Sentence', 'generate_pairs', 'main', 'render_english',
    'sample_sentence', 'split_pairs', 'translate', 'write_corpus',
]
