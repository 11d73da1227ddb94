"""A token-level toy translation task that needs no tokenizer: fast tests and smoke runs.

Target = the source reversed, each token relabelled by a fixed permutation of the
vocabulary, then EOS. Solving it needs attention to a moving source position.
Batches are a pure function of (seed, batch number), so resuming is exact, on any number
of devices or processes: padding rows (all PAD) make the rows divisible by the devices.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator

import ml_collections
import numpy as np

from t2t_jax.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from t2t_jax.platform import errors

FIRST_WORD_ID = UNK_ID + 1  # the ids below are reserved, as in the SentencePiece vocabulary
HELD_OUT_BATCH = 2**40  # the dev set's batch number: far beyond any training run


def _permutation(vocab_size: int, seed: int) -> np.ndarray:
  words = np.random.default_rng([seed, 7]).permutation(np.arange(FIRST_WORD_ID, vocab_size))
  return np.concatenate([np.arange(FIRST_WORD_ID), words])  # the reserved ids stay


def make_batch(rows: int, vocab_size: int, max_length: int, seed: int, batch_number: int,
               ) -> dict[str, np.ndarray]:
  """A global batch [rows, max_length] of pairs, PAD_ID-padded on the right."""
  rng = np.random.default_rng([seed, batch_number])
  permutation = _permutation(vocab_size, seed)
  inputs = np.full((rows, max_length), PAD_ID, np.int32)
  targets = np.full((rows, max_length), PAD_ID, np.int32)
  for r in range(rows):
    length = int(rng.integers(1, max_length))  # words; EOS makes it ≤ max_length
    words = rng.integers(FIRST_WORD_ID, vocab_size, size=length)
    inputs[r, :length + 1] = np.append(words, EOS_ID)
    targets[r, :length + 1] = np.append(permutation[words[::-1]], EOS_ID)
  return {'inputs': inputs, 'targets': targets}


class IdTokenizer:
  """Text of the synthetic task is its ids written out ('5 17 9'); EOS is appended."""

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size
    self.fingerprint = f'ids-{vocab_size}'

  def encode(self, text: str) -> list[int]:
    return [int(t) for t in text.split()] + [EOS_ID]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def banned_ids(self, *, sampling: bool) -> tuple[int, ...]:
    return (PAD_ID,)  # every other id is a token of the task

  def pieces(self, ids) -> list[str]:
    return ['</s>' if int(i) == EOS_ID else str(int(i)) for i in ids]

  def decode(self, ids) -> str:
    ids = list(np.asarray(ids).reshape(-1))
    ids = ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids
    return ' '.join(str(i) for i in ids if i > EOS_ID)


def _global_rows(config: ml_collections.ConfigDict) -> int:
  """Pairs a batch: the most rows of max_length within tokens_per_batch, on any topology
  (as batching.py's plan: the same batches on 1 or 8 devices, 1 or 2 processes)."""
  rows = config.tokens_per_batch // config.max_length
  if rows < 1:
    raise errors.UserError(f'config.tokens_per_batch={config.tokens_per_batch} is too small '
                           f'for one row of config.max_length={config.max_length} tokens')
  return rows


def _process_block(batch: dict[str, np.ndarray], multiple: int, process_index: int,
                   process_count: int) -> dict[str, np.ndarray]:
  """This process's contiguous block of `batch`, once padding rows have made its rows a
  multiple of `multiple` (devices × micro-batches): all PAD (weight 0 in the loss), and
  index -1 where the batch has an 'index'."""
  rows = len(batch['inputs'])
  padded = -(-rows // multiple) * multiple
  local = padded // process_count
  mine = slice(local * process_index, local * (process_index + 1))
  return {key: np.pad(value, [(0, padded - rows)] + [(0, 0)] * (value.ndim - 1),
                      constant_values=-1 if key == 'index' else PAD_ID)[mine]
          for key, value in batch.items()}


class SyntheticIterator:
  """Endless process-local training batches; its state is the next batch number."""
  packed = False  # one pair a row: the task has no packed form

  def __init__(self, config: ml_collections.ConfigDict, *, num_devices: int,
               process_index: int, process_count: int, grad_accum_steps: int = 1):
    self._config = config
    self._rows = _global_rows(config)
    self._multiple = num_devices * grad_accum_steps
    self._process_index, self._process_count = process_index, process_count
    self._batch_number = 0
    settings = [config.vocab_size, config.max_length, config.tokens_per_batch, config.seed]
    self.fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    c = self._config
    batch = make_batch(self._rows, c.vocab_size, c.max_length, c.seed, self._batch_number)
    self._batch_number += 1
    return _process_block(batch, self._multiple, self._process_index, self._process_count)

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """The one global batch shape (rows, S, T), padding rows included."""
    rows, length = -(-self._rows // self._multiple) * self._multiple, self._config.max_length
    return [(rows, length, length)]

  def get_state(self) -> dict:
    return {'batch_number': self._batch_number}

  def set_state(self, state: dict) -> None:
    self._batch_number = int(state['batch_number'])


@dataclasses.dataclass
class SyntheticEvalSet:
  """Held-out pairs (a batch number no training run reaches); id strings as text."""
  inputs: np.ndarray
  targets: np.ndarray
  num_devices: int
  process_index: int
  process_count: int
  packed = False

  @property
  def sources(self) -> list[str]:
    return [' '.join(map(str, row[row > EOS_ID])) for row in self.inputs]

  @property
  def references(self) -> list[str]:
    return [' '.join(map(str, row[row > EOS_ID])) for row in self.targets]

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """The one global shape (rows, S, T) of `batches()`."""
    rows = -(-len(self.inputs) // self.num_devices) * self.num_devices
    return [(rows, self.inputs.shape[1], self.targets.shape[1])]

  def batches(self) -> Iterator[dict[str, np.ndarray]]:
    """One batch of every pair, padding rows (index -1) up to a multiple of the devices."""
    batch = {'inputs': self.inputs, 'targets': self.targets,
             'index': np.arange(len(self.inputs), dtype=np.int32)}
    yield _process_block(batch, self.num_devices, self.process_index, self.process_count)


def eval_set(config: ml_collections.ConfigDict, *, num_devices: int, process_index: int = 0,
             process_count: int = 1) -> SyntheticEvalSet:
  """The held-out set (dev and test alike): one batch number no training run reaches."""
  held_out = make_batch(_global_rows(config), config.vocab_size, config.max_length, config.seed,
                        HELD_OUT_BATCH)
  return SyntheticEvalSet(held_out['inputs'], held_out['targets'], num_devices, process_index,
                          process_count)
