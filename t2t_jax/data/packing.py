"""Packed batches: several whole sentence pairs a row, one batch shape for a whole run.

§5.1's length buckets (batching.py) give each cell of the length grid its own batch shape,
each a compilation of the train step. Packing, as tensor2tensor's `*_packed` problems and
flax's examples/wmt do it, puts whole pairs side by side in rows of fixed length instead:

  row r, source side:  [a a a a . b b b . c c c c c c . . .]   pairs a, b, c
  segment ids:          1 1 1 1 1 2 2 2 2 3 3 3 3 3 3 3 0 0    0 = padding
  positions:            0 1 2 3 4 0 1 2 3 0 1 2 3 4 5 6 0 0    restart with each pair

and the same on the target side, pair i of a row in segment i on both. The model masks every
attention to the pair's own segment and takes its positions from the row (transformer.py),
so each pair's loss and gradient are what they are alone (tests/test_packing.py).

Choices the paper leaves open:
  * a row is `config.pack_length` tokens on the side with more tokens, the other side's its
    share (`row_lengths`); a pair too long for a row is left out and counted, as the length
    filter leaves out pairs over config.max_length;
  * pairs go into rows longest first, each into the open row it fills best (`layout`), so a
    batch of consecutive rows holds pairs of about the same length (§5.1). The layout is
    made once a run; each epoch, seeded by (config.seed, epoch), shuffles the pairs of each
    (source, target) length among the places of that length, then the batches;
  * a batch has the rows of config.tokens_per_batch slots a side (`batch_rows`), as a
    bucketed batch, more of them real tokens; an epoch's last batch, the rows left rounded
    up to a multiple of 8 with all-PAD rows, is a second shape at most.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
from absl import logging

from t2t_jax.data import batching
from t2t_jax.data.id_cache import Encoded
from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.platform import errors

Batch = dict[str, np.ndarray]

# The arrays of a packed batch beside 'inputs' and 'targets' (flax examples/wmt's names):
# segment ids (1, 2, ... for the pairs of a row; 0 for padding) and positions within a pair.
SOURCE_KEYS = ('inputs', 'inputs_segmentation', 'inputs_position')
TARGET_KEYS = ('targets', 'targets_segmentation', 'targets_position')
# Rows open for more pairs at a time: more fill them better and keep rows of other lengths
# together longer (benchmarks/compilation.py prints the padding efficiency).
_OPEN_ROWS = 512
# A turn places at most this fraction of what fits an empty row: rows mix pairs of other
# source/target ratios, and fill on both sides.
_TURN_FRACTION = 8
_LAYOUT_PAIRS = 1 << 18  # pairs a layout is worked out for (a larger corpus: see layout)
_ROWS_MULTIPLE = 8  # rows a batch are rounded down to it: 1, 2, 4 or 8 devices divide them
_SIDE_MULTIPLE = 8  # the shorter side's row length is rounded to it
_PLAN_VERSION = 1  # the packed plan's version, in the input pipeline's fingerprint


def row_lengths(lengths: tuple[np.ndarray, np.ndarray], pack_length: int) -> tuple[int, int]:
  """(source, target) tokens a row: pack_length for the side with more tokens in the pairs
  of `lengths`, the other side its share of them, rounded to a multiple of 8."""
  totals = [float(side.sum()) for side in lengths]
  longer = int(np.argmax(totals))
  share = totals[1 - longer] / max(totals[longer], 1.0)
  shorter = round(pack_length * share / _SIDE_MULTIPLE) * _SIDE_MULTIPLE
  shorter = min(pack_length, max(shorter, min(_SIDE_MULTIPLE, pack_length)))
  return (pack_length, shorter) if longer == 0 else (shorter, pack_length)


def batch_rows(tokens_per_batch: int, pack_length: int) -> int:
  """Rows a packed batch: tokens_per_batch // pack_length (at least 1), from 8 on rounded down
  to a multiple of 8."""
  rows = max(1, tokens_per_batch // pack_length)
  return rows - rows % _ROWS_MULTIPLE if rows >= _ROWS_MULTIPLE else rows


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which rows hold which lengths: row r's places are slots row_starts[r]:row_starts[r + 1],
  each for a pair of lengths classes[slot_class[slot]] = (source, target), longest first."""
  classes: np.ndarray  # int64 [classes, 2]
  slot_class: np.ndarray  # int32 [slots]
  row_starts: np.ndarray  # int64 [rows + 1]

  @property
  def num_rows(self) -> int:
    return len(self.row_starts) - 1


def _classes(source: np.ndarray, target: np.ndarray,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The distinct (source, target) lengths [classes, 2], each pair's class, and the counts."""
  base = int(target.max(initial=0)) + 1
  unique, pair_class, counts = np.unique(source.astype(np.int64) * base + target,
                                         return_inverse=True, return_counts=True)
  return np.stack([unique // base, unique % base], axis=1), pair_class.astype(np.int32), counts


def layout(source: np.ndarray, target: np.ndarray, row: tuple[int, int],
           ) -> tuple[Layout, np.ndarray]:
  """Which rows hold which lengths, for pairs of these (source, target) lengths that all fit
  `row`; and each pair's class (its lengths' index in Layout.classes).

  Longest first; the classes of one length (the longer side's) take turns, a few pairs a
  turn, alternately the most source-heavy and the most target-heavy, so that rows fill on
  both sides; a turn's pairs go to the open row they leave the least room in (best fit
  decreasing). A corpus of millions is laid out as `f` copies of the layout of its counts
  over `f`, plus that of the remainders: the same rows, in a time that does not grow.
  """
  classes, pair_class, counts = _classes(source, target)
  copies = max(1, -(-len(source) // _LAYOUT_PAIRS))
  rows = _best_fit(classes, counts // copies, row)
  rows = [r for r in rows for _ in range(copies)] + _best_fit(classes, counts % copies, row)
  # Rows by the longest pairs they hold, longest first (stable: the order they were laid out).
  rows.sort(key=lambda r: -int(classes[r[0][0]].max()))
  runs = [run for r in rows for run in r]
  slot_class = np.repeat([c for c, _ in runs], [n for _, n in runs]).astype(np.int32)
  starts = np.cumsum([0] + [sum(n for _, n in r) for r in rows]).astype(np.int64)
  return Layout(classes, slot_class, starts), pair_class


def _best_fit(classes: np.ndarray, counts: np.ndarray, row: tuple[int, int],
              ) -> list[list[tuple[int, int]]]:
  """Rows, each a list of (class, pairs of it), holding counts[c] pairs of class c (layout)."""
  S, T = row
  counts = counts.copy()
  room = np.zeros((2, _OPEN_ROWS), np.int64)  # of the open rows; 0 where none is open
  open_row = np.full(_OPEN_ROWS, -1, np.int64)
  rows: list[list[tuple[int, int]]] = []
  longest = classes.max(axis=1)
  for length in np.unique(longest[counts > 0])[::-1]:
    group = np.flatnonzero((longest == length) & (counts > 0))
    by_ratio = group[np.argsort(classes[group, 1] * S - classes[group, 0] * T, kind='stable')]
    # Alternately from either end: the most target-heavy, the most source-heavy, ...
    turns = np.empty_like(by_ratio)
    half = (len(by_ratio) + 1) // 2
    turns[0::2], turns[1::2] = by_ratio[::-1][:half], by_ratio[:len(by_ratio) // 2]
    while len(turns):
      for c in turns:
        s, t = (int(x) for x in classes[c])
        turn = min(int(counts[c]), max(1, min(S // s, T // t) // _TURN_FRACTION))
        fit = np.minimum(np.minimum(room[0] // s, room[1] // t), turn)  # [open rows]
        if fit.any():  # best fit: the least room left, each side as a share of its row
          left = (room[0] - fit * s) * T + (room[1] - fit * t) * S
          k = int(np.argmin(np.where(fit > 0, left, np.iinfo(np.int64).max)))
        else:  # a new row, in the place of the fullest open one if none is free
          free = np.flatnonzero(open_row < 0)
          k = int(free[0]) if len(free) else int(np.argmin(room[0] * T + room[1] * S))
          open_row[k], room[:, k] = len(rows), (S, T)
          rows.append([])
        placed = min(turn, int(room[0, k]) // s, int(room[1, k]) // t)
        rows[open_row[k]].append((int(c), placed))
        room[:, k] -= (placed * s, placed * t)
        counts[c] -= placed
        if not room[0, k] or not room[1, k]:  # full on one side: nothing fits any more
          open_row[k], room[:, k] = -1, 0
      turns = turns[counts[turns] > 0]
  return rows


def _places(plan: Layout, pair_class: np.ndarray, pairs: np.ndarray) -> np.ndarray:
  """Slot i's pair: pairs (each pair's class given) dealt to the places of their class in
  slot order, in the order `pairs` lists them."""
  pair_of_slot = np.empty(len(pairs), np.int64)
  pair_of_slot[np.argsort(plan.slot_class, kind='stable')] = pairs[
      np.argsort(pair_class[pairs], kind='stable')]
  return pair_of_slot


def _rows_of(plan: Layout, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
  """The slots of layout rows first..stop-1, and each one's row counted from `first`."""
  first, starts = min(first, stop), plan.row_starts  # none if stop <= first
  return (np.arange(starts[first], starts[stop]),
          np.repeat(np.arange(stop - first), np.diff(starts[first:stop + 1])))


def fill_rows(encoded: Encoded, pairs: np.ndarray, row_of_pair: np.ndarray, num_rows: int,
              row: tuple[int, int]) -> Batch:
  """`num_rows` packed rows: pair pairs[i] (encoded's index) goes into row row_of_pair[i],
  after the pairs before it in that row (row_of_pair is sorted); rows without pairs stay all
  PAD. Source arrays [num_rows, S], target arrays [num_rows, T], int32."""
  batch = {}
  first = np.searchsorted(row_of_pair, row_of_pair)  # [pairs] the first pair of its row
  segment = np.arange(len(pairs)) - first + 1  # 1 + the pair's place in its row
  for side, keys in enumerate((SOURCE_KEYS, TARGET_KEYS)):
    starts = np.asarray(encoded.offsets[side][pairs])
    lengths = np.asarray(encoded.offsets[side][pairs + 1]) - starts
    begins = np.cumsum(lengths) - lengths  # [pairs] of the tokens of all pairs
    position = np.arange(int(lengths.sum())) - np.repeat(begins, lengths)  # [tokens]
    # A pair's first column in its row: the lengths of the pairs before it in the row.
    where = (np.repeat(row_of_pair, lengths),
             np.repeat(begins - begins[first], lengths) + position)
    values = (encoded.ids[side][np.repeat(starts, lengths) + position],
              np.repeat(segment, lengths), position)
    for key, fill, value in zip(keys, (PAD_ID, 0, 0), values, strict=True):
      batch[key] = np.full((num_rows, row[side]), fill, np.int32)
      batch[key][where] = value
  return batch


@dataclasses.dataclass(frozen=True)
class _Plan:
  """One epoch: slot i holds kept pair pair_of_slot[i]; batch b is the layout's rows from
  first_rows[b] on (rows_per_batch of them, fewer in the last)."""
  pair_of_slot: np.ndarray
  first_rows: np.ndarray  # [num_batches], in batch order

  @property
  def num_batches(self) -> int:
    return len(self.first_rows)


class PackedTrainIterator(batching.TrainIterator):
  """Endless process-local packed batches: SOURCE_KEYS arrays int32 [rows, S], TARGET_KEYS
  arrays int32 [rows, T]. The rest (padding rows, position, state, the same batches on any
  topology) is TrainIterator's."""
  packed = True

  def _setup(self, kept: np.ndarray, config: Any, data_key: str) -> tuple[np.ndarray, list]:
    source, target = (np.asarray(offsets[kept + 1] - offsets[kept]) for offsets in
                      self._encoded.offsets)
    self.row = row_lengths((source, target), config.pack_length)
    fits = (source <= self.row[0]) & (target <= self.row[1])
    left_out = int((~fits).sum())
    # Not silently: the shorter side's share of a row can be below config.max_length.
    (logging.warning if left_out else logging.info)(
        'train: packed rows of %d source and %d target tokens (config.pack_length=%d); left '
        'out %d pairs too long for a row%s; kept %d', *self.row, config.pack_length, left_out,
        ' (a longer config.pack_length keeps them)' if left_out else '', fits.sum())
    if not fits.any():
      raise errors.UserError(f'config.pack_length={config.pack_length}: no training pair fits a '
                             f'packed row of {self.row[0]} source and {self.row[1]} target tokens')
    self._rows_per_batch = batch_rows(config.tokens_per_batch, config.pack_length)
    self._layout, self._class = layout(source[fits], target[fits], self.row)
    return kept[fits], ['packed', data_key, config.max_length, config.tokens_per_batch,
                        config.seed, config.pack_length, len(kept), _PLAN_VERSION]

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """The global (rows, S, T) in the order the batches from here on first need them: one,
    and a second for an epoch's last batch if its rows are fewer."""
    plan = self.plan(self._epoch)
    rows = self._padded_rows(np.roll(self._real_rows(plan), -self._batch))
    return [(int(r), *self.row) for r in dict.fromkeys(rows.tolist())]

  def _real_rows(self, plan: _Plan) -> np.ndarray:
    """The layout rows each batch holds: rows_per_batch, fewer in the layout's last."""
    return np.minimum(self._rows_per_batch, self._layout.num_rows - plan.first_rows)

  def _padded_rows(self, rows: np.ndarray) -> np.ndarray:
    """Global rows of batches of `rows` layout rows: rounded up to a multiple of 8 (no more
    than a full batch's), then to one of devices × micro-batches."""
    rounded = np.minimum(batching._round_up(rows, _ROWS_MULTIPLE), self._rows_per_batch)
    return batching._round_up(rounded, self._row_multiple)

  def _make_plan(self, rng: np.random.Generator) -> _Plan:
    """The pairs' places and the batches' order of an epoch."""
    shuffled = rng.permutation(len(self._class)).astype(np.int64)
    first_rows = np.arange(0, self._layout.num_rows, self._rows_per_batch)
    return _Plan(_places(self._layout, self._class, shuffled),
                 first_rows[rng.permutation(len(first_rows))])

  def _local_batch(self, plan: _Plan, b: int) -> Batch:
    real_rows = int(self._real_rows(plan)[b])
    local_rows = int(self._padded_rows(np.array(real_rows))) // self._process_count
    # This process's block of the batch's rows; those past the batch's end stay all PAD.
    batch_first = int(plan.first_rows[b])
    first = batch_first + self._process_index * local_rows
    stop = min(first + local_rows, batch_first + real_rows)
    slots, row_of_slot = _rows_of(self._layout, first, stop)
    pairs = self._kept[plan.pair_of_slot[slots]]
    return fill_rows(self._encoded, pairs, row_of_slot, local_rows, self.row)


# --------------------------------------------------------------- evaluation


@dataclasses.dataclass
class PackedEvalSet(batching.EvalSet):
  """A dev or test set whose loss batches are packed rows, laid out as for training but not
  shuffled, eval_tokens_per_batch // pack_length rows a batch (rounded as training's, then to
  the devices). A pair too long for a row (eval sets are never length-filtered) goes alone
  into a row of its length bucket (EvalSet's batches): other shapes, only for such pairs."""
  pack_length: int = 256
  packed = True

  def _packing(self) -> tuple[tuple[int, int], np.ndarray, int]:
    """The row's (S, T), which pairs fit it, and the global rows a batch."""
    src, tgt = self.encoded.lengths
    row = row_lengths((src, tgt), self.pack_length)
    fits = (src <= row[0]) & (tgt <= row[1])
    if self.max_length:  # learned positions: as EvalSet, a longer pair has no loss
      fits &= np.maximum(src, tgt) <= self.max_length
    rows = batch_rows(self.tokens_per_batch, self.pack_length)
    return row, fits, batching._round_up(rows, self.num_devices)

  def batches(self) -> Iterator[Batch]:
    """Process-local packed batches (SOURCE_KEYS and TARGET_KEYS arrays), then those of the
    pairs too long for a row, one a row."""
    row, fits, packed_rows = self._packing()
    yield from eval_batches(self.encoded, np.flatnonzero(fits), row, packed_rows,
                            process_index=self.process_index, process_count=self.process_count)
    for pairs, rows, length in self._groups(~fits):
      batch = self._bucket_batch(pairs, rows, length)
      del batch['index']
      for ids, segment_key, position_key in (SOURCE_KEYS, TARGET_KEYS):
        real = batch[ids] != PAD_ID
        batch[segment_key] = real.astype(np.int32)
        batch[position_key] = np.where(real, np.arange(length, dtype=np.int32), 0)
      yield batch

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """The distinct global shapes (rows, S, T) of `batches()`, in their order."""
    row, fits, packed_rows = self._packing()
    packed = [(packed_rows, *row)] if fits.any() else []
    return list(dict.fromkeys(packed + [(rows, length, length) for _, rows, length in
                                        self._groups(~fits)]))


def make_eval_set(name: str, text: batching.Pairs, tokenizer: Any, config: Any,
                  **topology: int) -> PackedEvalSet:
  """batching.make_eval_set's set, its loss batches packed (config.pack_length)."""
  bucketed = batching.make_eval_set(name, text, tokenizer, config, **topology)
  fields = {f.name: getattr(bucketed, f.name) for f in dataclasses.fields(bucketed)}
  return PackedEvalSet(**fields, pack_length=config.pack_length)


def eval_batches(encoded: Encoded, pairs: np.ndarray, row: tuple[int, int], rows: int, *,
                 process_index: int, process_count: int) -> Iterator[Batch]:
  """Process-local packed batches of `pairs` (encoded's indices, all fitting `row`), in
  layout order, each of `rows` global rows (the last one filled up with all-PAD rows)."""
  if not len(pairs):
    return
  source, target = (np.asarray(offsets[pairs + 1] - offsets[pairs]) for offsets in
                    encoded.offsets)
  plan, pair_class = layout(source, target, row)
  pair_of_slot = _places(plan, pair_class, np.arange(len(pairs)))
  local_rows = rows // process_count
  for batch_first in range(0, plan.num_rows, rows):
    first = batch_first + process_index * local_rows
    slots, row_of_slot = _rows_of(plan, first, min(first + local_rows, plan.num_rows,
                                                   batch_first + rows))
    yield fill_rows(encoded, pairs[pair_of_slot[slots]], row_of_slot, local_rows, row)
