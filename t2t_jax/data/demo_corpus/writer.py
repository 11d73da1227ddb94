"""Writing the demo corpus: `write_corpus`, and `main`, the command line
`python -m t2t_jax.data.demo_corpus --out DIR`, which also prints statistics and samples."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import time
from collections.abc import Sequence

from t2t_jax.data.demo_corpus.sampling import split_pairs
from t2t_jax.platform import files

# Bump whenever the grammar or lexicon changes: cached corpora are then regenerated.
GENERATOR_VERSION = 1

SPLITS = ('train', 'dev', 'test')
MARKER = 'corpus.json'


def _write(path: str, text: str) -> None:
  """Writes `path` whole or not at all, readable by every user (mode 0o644) whatever the
  umask (files.write_text leaves it to): a shared workdir's users must read the corpus."""
  files.write_text(path, text)
  os.chmod(path, 0o644)


def _sha256(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def _is_current(directory: str, params: dict, names: Sequence[str]) -> bool:
  """Whether the marker matches `params` and the files still have their checksums."""
  try:
    with open(os.path.join(directory, MARKER), encoding='utf-8') as f:
      marker = json.load(f)
    return marker['params'] == params and all(
        _sha256(os.path.join(directory, n)) == marker['sha256'][n] for n in names)
  except (OSError, ValueError, KeyError, TypeError):
    return False


def write_corpus(directory: str, *, num_train: int = 50_000, num_dev: int = 1000,
                 num_test: int = 1000, seed: int = 0, source_lang: str = 'en',
                 target_lang: str = 'de') -> dict[str, str]:
  """Writes <directory>/{train,dev,test}.{source_lang,target_lang}; returns the prefixes.

  Skips the work if a marker (corpus.json: the parameters and checksums) shows the files
  were written with the same parameters and GENERATOR_VERSION and are unchanged since.
  """
  prefixes = {split: os.path.join(directory, split) for split in SPLITS}
  names = [f'{split}.{lang}' for split in SPLITS for lang in (source_lang, target_lang)]
  params = {'generator_version': GENERATOR_VERSION, 'num_train': num_train,
            'num_dev': num_dev, 'num_test': num_test, 'seed': seed,
            'source_lang': source_lang, 'target_lang': target_lang}
  if _is_current(directory, params, names):
    return prefixes
  files.make_folder(directory, os.path.dirname(directory), 'the demo corpus')
  checksums = {}
  for split, pairs in split_pairs(num_train, num_dev, num_test, seed).items():
    for lang, side in ((source_lang, 0), (target_lang, 1)):
      path = f'{prefixes[split]}.{lang}'
      _write(path, ''.join(pair[side] + '\n' for pair in pairs))
      checksums[os.path.basename(path)] = _sha256(path)
  # The marker goes last: a crash before this point leaves no marker to trust.
  _write(os.path.join(directory, MARKER),
         json.dumps({'params': params, 'sha256': checksums}, indent=2) + '\n')
  return prefixes


def corpus_stats(pairs: Sequence[tuple[str, str]]) -> dict[str, float]:
  """Distinct word types and mean words per sentence on each side (punctuation excluded)."""
  stats = {}
  for lang, side in (('en', 0), ('de', 1)):
    words = [word for pair in pairs for word in re.findall(r'\w+', pair[side])]
    stats[f'{lang}_types'] = len(set(words))
    stats[f'{lang}_mean_words'] = len(words) / max(len(pairs), 1)
  return stats


def _read_pairs(prefix: str, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
  with (open(f'{prefix}.{source_lang}', encoding='utf-8') as src,
        open(f'{prefix}.{target_lang}', encoding='utf-8') as tgt):
    # The sides are written aligned: a length mismatch is a damaged corpus.
    return [(s.rstrip('\n'), t.rstrip('\n')) for s, t in zip(src, tgt, strict=True)]


def main(argv: Sequence[str] | None = None) -> None:
  """The command line: writes a corpus, then prints where, its statistics and samples."""
  parser = argparse.ArgumentParser(
      description='A generated English→German corpus for the built-in demo.')
  parser.add_argument('--out', required=True, help='directory for the corpus files')
  parser.add_argument('--num_train', type=int, default=50_000)
  parser.add_argument('--num_dev', type=int, default=1000)
  parser.add_argument('--num_test', type=int, default=1000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--samples', type=int, default=8, help='sample pairs to print')
  args = parser.parse_args(argv)
  start = time.perf_counter()
  prefixes = write_corpus(args.out, num_train=args.num_train, num_dev=args.num_dev,
                          num_test=args.num_test, seed=args.seed)
  print(f'corpus in {args.out} ({time.perf_counter() - start:.1f} s): '
        + ', '.join(f'{split} {prefix}.{{en,de}}' for split, prefix in prefixes.items()))
  train = _read_pairs(prefixes['train'], 'en', 'de')
  stats = corpus_stats(train)
  print(f'train: {len(train)} pairs; word types en {stats["en_types"]}, '
        f'de {stats["de_types"]}; mean words per sentence en {stats["en_mean_words"]:.1f}, '
        f'de {stats["de_mean_words"]:.1f}')
  for en, de in random.Random(args.seed).sample(train, min(args.samples, len(train))):
    print(f'  EN: {en}\n  DE: {de}')
