"""The shared source-target sub-word vocabulary of §5.1.

The paper encodes EN-DE with "byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens" and EN-FR with "a 32000 word-piece vocabulary".
Both become one SentencePiece BPE model here, trained on a bounded sample of both
sides of the training data, saved in the workdir and reused on every restart.

Choices the paper leaves open:
  * id 0 is padding (the model also feeds it as the decoder's start symbol),
    1 is end-of-sentence, 2 is unknown; there is no beginning-of-sentence id;
  * byte fallback: a character outside the vocabulary becomes its UTF-8 bytes,
    so decode(encode(s)) returns s instead of ' ⁇ ';
  * text is normalised with SentencePiece's default `nmt_nfkc` rule (NFKC,
    whitespace runs collapsed, leading/trailing whitespace removed).
"""
from __future__ import annotations

import hashlib
import itertools
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm
from absl import logging

from t2t_jax.platform import errors, files, progress

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2

# Rare characters (0.01% of the sample) go to byte pieces instead of using up
# vocabulary entries; byte fallback keeps them decodable.
_CHARACTER_COVERAGE = 0.9999
# Fixed, so that runs differing only in config.seed train the same vocabulary.
_SAMPLE_SEED = 0


class Tokenizer:
  """A SentencePiece model with EOS appended on encode and stripped on decode."""

  def __init__(self, model_path: str):
    self.model_path = model_path
    try:
      self._sp = spm.SentencePieceProcessor(model_file=model_path)
    except RuntimeError as e:  # e.g. a file truncated by a full disk outside t2t_jax
      raise errors.UserError(f'{model_path}: not a readable SentencePiece model ({e}); delete it '
                             'to train a new one (checkpoints trained with it need its ids)') from e
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID):
      raise errors.UserError(
          f'{model_path}: (pad, eos, unk) ids are {ids}, expected '
          f'{(PAD_ID, EOS_ID, UNK_ID)}; it was not trained by t2t_jax.data.tokenizer. '
          'Delete it or use a fresh --workdir.')
    self.vocab_size: int = self._sp.get_piece_size()
    # Of the pieces, not the file: the file also records the temporary path it
    # was trained in, and identical vocabularies must match (e.g. across hosts).
    pieces = '\n'.join(self._sp.id_to_piece(i) for i in range(self.vocab_size))
    self.fingerprint: str = hashlib.sha256(pieces.encode()).hexdigest()[:16]

  def encode(self, text: str) -> list[int]:
    """Sub-word ids of `text`, with EOS appended."""
    return self._sp.encode(text, add_eos=True)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of many sentences at once, on all cores (much faster than a loop)."""
    return self._sp.encode(list(texts), add_eos=True, num_threads=os.cpu_count() or 1)

  def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
    """`encode_batch` as int32 arrays: far less memory than lists (benchmarks/data_memory.py)."""
    return self._sp.encode(list(texts), add_eos=True, num_threads=os.cpu_count() or 1,
                           out_type='numpy')

  def banned_ids(self, *, sampling: bool) -> tuple[int, ...]:
    """Ids a decoder never emits, as they decode to no text: the control symbols but EOS
    (PAD too), unknown and unused pieces; for `sampling` also the byte-fallback pieces: a
    search takes them only to spell a rare character whole, a draw at a high temperature
    one at a time (U+FFFD, control bytes)."""
    sp = self._sp
    return tuple(i for i in range(self.vocab_size) if i != EOS_ID and (
        sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or (sampling and sp.is_byte(i))))

  def pieces(self, ids: Any) -> list[str]:
    """The sub-word strings of `ids` (EOS shown as '</s>'), for plots."""
    return [self._sp.id_to_piece(int(i)) for i in ids]

  def decode(self, ids: Any) -> str:
    """Text of `ids` up to the first EOS; PAD is ignored. Ids beyond the vocabulary (a model
    may pad its embedding table) decode as unknown rather than crash an evaluation."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    eos = np.flatnonzero(ids == EOS_ID)
    if eos.size:
      ids = ids[:eos[0]]
    ids = ids[ids != PAD_ID]
    ids = np.where((ids < 0) | (ids >= self.vocab_size), UNK_ID, ids)
    return self._sp.decode(ids.tolist())


def load_or_train(config: Any, workdir: str, sample_texts: Callable[[], Iterable[str]], *,
                  total_texts: int | None = None) -> Tokenizer:
  """Loads <workdir>/vocab/spm.model (and .vocab), training it first if it does not exist.

  `sample_texts` is called only to train; it yields sentences of both languages, of which at
  most `config.vocab_sample_sentences` are kept by a seeded uniform (reservoir) sample, so
  memory stays bounded on WMT. `total_texts`, how many it yields if known, is the total its
  progress lines count towards. A model already there whose size is not `config.vocab_size`
  raises errors.UserError: it is never retrained silently, as checkpoints depend on its ids.
  """
  vocab_dir = os.path.join(workdir, 'vocab')
  model_path = os.path.join(vocab_dir, 'spm.model')
  if not files.exists(model_path, 'the vocabulary'):
    # The whole text is read to sample it uniformly: on WMT that is minutes.
    with progress.Progress('Reading the training text for the vocabulary', total_texts,
                           'sentences') as bar:
      sample = reservoir_sample(bar.iterate(sample_texts()), config.vocab_sample_sentences,
                                seed=_SAMPLE_SEED)
    train_bpe(sample, config.vocab_size, vocab_dir)
  tokenizer = Tokenizer(model_path)
  if tokenizer.vocab_size != config.vocab_size:
    raise errors.UserError(
        f'config.vocab_size={config.vocab_size}, but the vocabulary already in the workdir, '
        f'{model_path}, has {tokenizer.vocab_size} pieces. Set --config.vocab_size='
        f'{tokenizer.vocab_size} to keep it, or use a fresh --workdir (checkpoints there '
        'depend on its ids).')
  logging.info('Vocabulary: %s (%d pieces, sha256 %s)', model_path,
               tokenizer.vocab_size, tokenizer.fingerprint)
  return tokenizer


def reservoir_sample(items: Iterable[str], k: int, *, seed: int) -> list[str]:
  """A uniform sample of k items in one pass (Li's "Algorithm L"): it skips geometrically many
  items between replacements, so it costs one pass plus O(k log(n / k)) random draws."""
  rng = random.Random(seed)
  iterator = iter(items)
  reservoir = list(itertools.islice(iterator, k))
  if len(reservoir) < k:
    return reservoir

  def uniform() -> float:  # in (0, 1): keeps the logarithms finite
    return min(max(rng.random(), 1e-300), 1 - 1e-16)

  w = math.exp(math.log(uniform()) / k)
  while True:
    skip = math.floor(math.log(uniform()) / math.log1p(-w))
    item = next(itertools.islice(iterator, skip, None), None)
    if item is None:
      return reservoir
    reservoir[rng.randrange(k)] = item
    w *= math.exp(math.log(uniform()) / k)


def train_bpe(sample: list[str], vocab_size: int, vocab_dir: str) -> None:
  """Trains the BPE model into a temporary folder, then moves it into place, the .model file
  last: its existence means the vocabulary is complete. Any error or interrupt removes the
  temporary folder; a killed run's is swept by the next one (`files.sweep_temp_dirs`)."""
  # SentencePiece's trainer takes no progress callback (its own log, silenced below by
  # minloglevel, is internals, not progress): the start and the time taken are all we can say.
  logging.info('Training a %d-piece BPE vocabulary on %d sentences (SentencePiece reports '
               'no progress; it can take minutes)', vocab_size, len(sample))
  start = time.monotonic()
  tmp_dir = None
  try:
    with files.disk_write_errors(vocab_dir, 'the vocabulary'):
      files.make_folder(vocab_dir, os.path.dirname(vocab_dir), 'the vocabulary')
      files.sweep_temp_dirs(vocab_dir)
      tmp_dir = files.make_temp_dir(vocab_dir)
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=iter(sample), model_prefix=os.path.join(tmp_dir, 'spm'),
          model_type='bpe', vocab_size=vocab_size, byte_fallback=True,
          pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
          character_coverage=_CHARACTER_COVERAGE, num_threads=os.cpu_count() or 1,
          minloglevel=1)
    except RuntimeError as e:
      raise errors.UserError(
          f'SentencePiece could not train a vocabulary of config.vocab_size='
          f'{vocab_size} pieces from {len(sample)} sentences: {e}') from e
    with files.disk_write_errors(vocab_dir, 'the vocabulary'):
      for name in ('spm.vocab', 'spm.model'):  # the model last: it means complete
        files.publish(os.path.join(tmp_dir, name), os.path.join(vocab_dir, name))
    logging.info('Trained the vocabulary in %s',
                 progress.format_duration(time.monotonic() - start))
  finally:
    if tmp_dir:
      shutil.rmtree(tmp_dir, ignore_errors=True)
