"""Batching of §5.1: sub-word ids -> length buckets -> batches of ~25k tokens.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens." (§5.1)

Pairs with an empty side or a side over `max_length` are dropped (and logged); the others
go to cells (source bucket, target bucket) of a grid of padded lengths. Each epoch, seeded
by (config.seed, epoch), shuffles within cells, cuts batches and shuffles the batches. The
plan is plain numpy and its position just (epoch, batch): a restored run replays exactly
the batches an uninterrupted one would have produced.

Choices the paper leaves open:
  * padded lengths are multiples of 4 growing ~10% a step (`bucket_growth`); a batch of
    cell (S, T) has the most rows with rows*S and rows*T within `tokens_per_batch`, which
    caps padded slots, on which memory and compiled shapes depend (§5.1's ~25000 are real
    tokens: the configs set 27000 slots). The batches are the same on any topology, so a
    run resumes on another one; all-PAD rows (weight 0 in the loss) then make a batch's
    rows divisible by the devices (times `grad_accum_steps`);
  * the shorter side is padded up to within `bucket_band` buckets of the longer one: fewer
    shapes (compilations) for a little padding; 0 pads both sides alike, as tensor2tensor;
  * a cell's left-over pairs join the next cell (both sides one bucket longer) if the cell
    filled a batch, else form one smaller batch; each kept pair is in one batch per epoch.
    On a corpus of a few thousand pairs most cells hold less than a batch, so most batches
    are smaller than `tokens_per_batch`;
  * lengths count the EOS; eval sets are never length-filtered.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from absl import logging

from t2t_jax.data import id_cache
from t2t_jax.data.id_cache import Encoded, Pairs
from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.platform import errors

Batch = dict[str, np.ndarray]

_QUANTUM = 4  # padded lengths are multiples of this
# Pairs whose lengths are looked at a time when filtering and bucketing: bounds the
# int64 temporaries (WMT EN-FR has 36M pairs).
_SLICE = 1 << 20
# The batch plan's version, saved in the state. Version 1 (states without 'plan') rounded
# the rows to the device count: its batches are not this plan's, so they cannot continue.
_PLAN_VERSION = 2

# ------------------------------------------------------------ pairs kept


def _index_dtype(num_pairs: int) -> type:
  """int32 pair indices while they fit: half the memory of int64 on WMT's 4.5M-36M pairs."""
  return np.int32 if num_pairs < np.iinfo(np.int32).max else np.int64


def length_filter(encoded: Encoded, max_length: int, name: str) -> np.ndarray:
  """Indices of the pairs kept for training; the dropped ones are counted."""
  num_pairs = len(encoded.offsets[0]) - 1
  empty, too_long = np.empty(num_pairs, bool), np.empty(num_pairs, bool)
  for start in range(0, num_pairs, _SLICE):
    part = slice(start, start + _SLICE)
    src, tgt = (np.diff(offsets[start:start + _SLICE + 1]) for offsets in encoded.offsets)
    empty[part] = (src <= 1) | (tgt <= 1)  # only the EOS
    too_long[part] = ~empty[part] & ((src > max_length) | (tgt > max_length))
  kept = np.flatnonzero(~empty & ~too_long).astype(_index_dtype(num_pairs))
  logging.info('%s: %d pairs; dropped %d with an empty side and %d with a side longer than '
               'max_length=%d tokens; kept %d', name, num_pairs, empty.sum(), too_long.sum(),
               max_length, len(kept))
  if not len(kept):
    raise errors.UserError(f'{name}: no sentence pair left after dropping empty pairs '
                           f'and pairs over config.max_length={max_length} tokens')
  return kept


def _gather(encoded: Encoded, side: int, pairs: np.ndarray, rows: int,
            width: int) -> np.ndarray:
  """Rows of ids right-padded with PAD to `width`; missing rows are all PAD."""
  out = np.full((rows, width), PAD_ID, np.int32)
  starts = np.asarray(encoded.offsets[side][pairs])
  lengths = np.asarray(encoded.offsets[side][pairs + 1]) - starts
  columns = np.arange(width)
  mask = columns < lengths[:, None]
  out[:len(pairs)][mask] = encoded.ids[side][(starts[:, None] + columns)[mask]]
  return out


# ------------------------------------------------------------------ buckets


def bucket_lengths(max_length: int, growth: float) -> np.ndarray:
  """Padded lengths: multiples of 4 growing by `growth`, the last >= max_length."""
  last = _round_up(max(max_length, 1), _QUANTUM)
  lengths = [_QUANTUM]
  while lengths[-1] < last:
    grown = math.ceil(lengths[-1] * growth - 1e-9)  # 1e-9: 40 * 1.1 is 44, not 45
    lengths.append(max(lengths[-1] + _QUANTUM, _round_up(grown, _QUANTUM)))
  lengths[-1] = last
  if len(lengths) > 2 and lengths[-2] * growth > last:
    del lengths[-2]  # no bucket a sliver below the last one
  return np.array(lengths, np.int64)


def _round_up(x: int, multiple: int) -> int:
  return -(-x // multiple) * multiple


def _cells(encoded: Encoded, kept: np.ndarray, grid: np.ndarray,
           band: int) -> tuple[np.ndarray, np.ndarray]:
  """Grid indices (source, target) of each kept pair's padded lengths: int16 (a grid has
  tens of lengths) a slice of pairs at a time, so no int64 array is the corpus's size."""
  cells = np.empty((2, len(kept)), np.int16)
  band = min(band, len(grid))  # a wider band changes nothing, and stays an int16
  for start in range(0, len(kept), _SLICE):
    pairs = kept[start:start + _SLICE]
    i, j = (np.searchsorted(grid, offsets[pairs + 1] - offsets[pairs]).astype(np.int16)
            for offsets in encoded.offsets)
    longer = np.maximum(i, j)
    cells[:, start:start + len(pairs)] = np.maximum(i, longer - band), np.maximum(j, longer - band)
  return cells[0], cells[1]


@dataclasses.dataclass(frozen=True)
class _Plan:
  """One epoch: batch b holds pairs order[starts[b]:starts[b + 1]], in shapes[b]."""
  order: np.ndarray
  starts: np.ndarray
  shapes: np.ndarray  # [num_batches, 3]: global rows (pairs, before padding rows), S, T

  @property
  def num_batches(self) -> int:
    return len(self.shapes)


def _epoch_plan(cell_i: np.ndarray, cell_j: np.ndarray, grid: np.ndarray,
                rows: np.ndarray, rng: np.random.Generator) -> _Plan:
  """Cuts one epoch into batches, cell by cell, then shuffles the batches."""
  n = len(grid)
  cell = cell_i.astype(np.int16 if n * n <= np.iinfo(np.int16).max else np.int32) * n + cell_j
  # = rng.permutation(len(cell)), the same draws, in int32 (shuffle is Fisher-Yates
  # whatever the dtype): resumed runs see the batches of earlier versions.
  shuffled = np.arange(len(cell), dtype=_index_dtype(len(cell)))
  rng.shuffle(shuffled)
  # A stable sort's order depends only on the keys, whatever their dtype.
  grouped = shuffled[np.argsort(cell[shuffled], kind='stable')]
  # (in cell's dtype: searching int64 keys would copy cell[grouped] to int64)
  bounds = np.searchsorted(cell[grouped], np.arange(n * n + 1, dtype=cell.dtype))
  carry: dict[tuple[int, int], np.ndarray] = {}
  batches, shapes = [], []
  # By i + j, so that a cell's left-overs reach (i + 1, j + 1) before it is cut.
  for i, j in sorted(itertools.product(range(n), range(n)), key=sum):
    members = grouped[bounds[i * n + j]:bounds[i * n + j + 1]]
    if (i, j) in carry:
      members = np.concatenate([carry.pop((i, j)), members])
    r = int(rows[i, j])
    full = len(members) // r if len(members) else 0
    batches += [members[b * r:(b + 1) * r] for b in range(full)]
    shapes += [(r, grid[i], grid[j])] * full
    rest = members[full * r:]
    if len(rest) and full and i + 1 < n and j + 1 < n and rows[i + 1, j + 1]:
      carry[(i + 1, j + 1)] = rest
    elif len(rest):
      batches.append(rest)
      shapes.append((len(rest), grid[i], grid[j]))
  perm = rng.permutation(len(batches))
  batches = [batches[b] for b in perm]
  return _Plan(order=np.concatenate(batches), starts=np.cumsum([0] + list(map(len, batches))),
               shapes=np.array(shapes, np.int64).reshape(-1, 3)[perm])


# ----------------------------------------------------------------- training


class PositionMismatch(errors.UserError):
  """A saved input-pipeline position made with other data or batching settings."""

  def __init__(self, message: str, batching: str | None):
    super().__init__(message)
    self.batching = batching  # how the saved position was batched (None: not recorded)


class TrainIterator:
  """Endless process-local training batches, epoch after epoch (§5.1): pipeline.TrainBatches,
  one pair a row; the position (get_state/set_state) restores exactly on any topology."""
  packed = False  # one pair a row (packing.PackedTrainIterator: several)

  def __init__(self, encoded: Encoded, kept: np.ndarray, config: Any, *,
               num_devices: int, process_index: int, process_count: int,
               data_key: str, grad_accum_steps: int = 1):
    self._encoded, self._seed = encoded, config.seed
    self._kept, settings = self._setup(kept, config, data_key)
    self._row_multiple = num_devices * grad_accum_steps  # global rows are padded to it
    self._process_index, self._process_count = process_index, process_count
    # Identifies the data and the plan's settings (hosts must agree on it); no topology:
    # a state saved on 8 devices resumes on 1 (the same batches).
    self.fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
    self._epoch, self._batch = 0, 0
    self._plan: Any = None
    self._plan_epoch = -1

  def _setup(self, kept: np.ndarray, config: Any, data_key: str) -> tuple[np.ndarray, list]:
    """Prepares the plan (packing.PackedTrainIterator: its own); returns the pairs it
    batches and the settings its fingerprint identifies."""
    self._grid = bucket_lengths(config.max_length, config.bucket_growth)
    self._cell_i, self._cell_j = _cells(self._encoded, kept, self._grid, config.bucket_band)
    # [S, T] -> most rows with rows*S and rows*T in budget; not rounded to the device
    # count, so that the plan does not depend on the topology.
    self._rows = config.tokens_per_batch // np.maximum(self._grid[:, None], self._grid)
    # Rows shrink as the longer side grows, so the longest cell decides.
    last = max(self._cell_i.max(), self._cell_j.max())
    if not self._rows[last, last]:
      raise errors.UserError(
          f'config.tokens_per_batch={config.tokens_per_batch} cannot hold one '
          f'{int(self._grid[last])}-token row; raise it or lower config.max_length')
    logging.info("train: §5.1's length buckets (batching 'buckets'), %d lengths of %d to %d "
                 'tokens, up to %d tokens a batch', len(self._grid), self._grid[0],
                 self._grid[-1], config.tokens_per_batch)
    return kept, [data_key, config.max_length, config.tokens_per_batch, config.seed,
                  config.bucket_growth, config.bucket_band, len(kept), _PLAN_VERSION]

  def __iter__(self) -> TrainIterator:
    return self

  def __next__(self) -> Batch:
    plan = self.plan(self._epoch)
    batch = self._local_batch(plan, self._batch)
    self._batch += 1
    if self._batch == plan.num_batches:
      self._epoch, self._batch = self._epoch + 1, 0
    return batch

  def get_state(self) -> dict[str, Any]:
    """The position: the next batch is batch `batch` of epoch `epoch`."""
    return {'epoch': self._epoch, 'batch': self._batch, 'fingerprint': self.fingerprint,
            'plan': _PLAN_VERSION, 'batching': 'packed' if self.packed else 'buckets'}

  def set_state(self, state: dict[str, Any]) -> None:
    saved = state.get('fingerprint')
    if saved != self.fingerprint and state.get('plan') != _PLAN_VERSION:
      raise errors.UserError(
          f'The saved input-pipeline state (fingerprint {saved}) was '
          f'made by an older t2t_jax, whose batch plan (version {state.get("plan", 1)}) '
          'rounded the rows of each batch to the number of devices; this version\'s plan '
          f'(version {_PLAN_VERSION}) is the same on any number of devices, so its batches '
          'differ and that position cannot be continued exactly. Resume with the version '
          'that made the checkpoint, or start again (--config.restart=True).')
    if saved != self.fingerprint:
      now = 'packed' if self.packed else 'buckets'
      batched = (f"; it was batched with config.batching={state['batching']!r}, this run "
                 f'with {now!r}' if state.get('batching', now) != now else '')
      raise PositionMismatch(
          'The saved input-pipeline state was made for different data or settings '
          '(data files, vocabulary, max_length, tokens_per_batch, seed, bucketing or '
          f'packing){batched}, so its position cannot be restored exactly: saved fingerprint '
          f'{saved}, now {self.fingerprint}.', state.get('batching'))
    epoch, batch = int(state['epoch']), int(state['batch'])
    if not 0 <= batch < self.plan(epoch).num_batches:
      raise errors.UserError(f'Input-pipeline state {state}: epoch {epoch} has '
                             f'{self.plan(epoch).num_batches} batches')
    self._epoch, self._batch = epoch, batch

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """The distinct global (rows, S, T), rows padded, in the order the batches from here on
    first need them: the rest of this epoch, then its start (every epoch has the same)."""
    shapes = np.roll(self.plan(self._epoch).shapes, -self._batch, axis=0)
    return list(dict.fromkeys((_round_up(int(r), self._row_multiple), int(s), int(t))
                              for r, s, t in shapes))

  def plan(self, epoch: int) -> _Plan:
    """The batches of `epoch`, a pure function of (config.seed, epoch)."""
    if self._plan_epoch != epoch:
      self._plan = self._make_plan(np.random.default_rng([self._seed, epoch]))
      self._plan_epoch = epoch
    return self._plan

  def _make_plan(self, rng: np.random.Generator) -> _Plan:
    return _epoch_plan(self._cell_i, self._cell_j, self._grid, self._rows, rng)

  def _local_batch(self, plan: _Plan, b: int) -> Batch:
    rows, src_len, tgt_len = (int(x) for x in plan.shapes[b])
    # Padded first, then cut: the processes' blocks are equal, disjoint and together
    # the whole batch; the padding rows fall into the last blocks.
    local_rows = _round_up(rows, self._row_multiple) // self._process_count
    first = plan.starts[b] + self._process_index * local_rows
    # Pairs past the batch's end are padding rows, left all-PAD by _gather.
    stop = min(first + local_rows, plan.starts[b + 1])
    pairs = self._kept[plan.order[first:max(first, stop)]]
    return {'inputs': _gather(self._encoded, 0, pairs, local_rows, src_len),
            'targets': _gather(self._encoded, 1, pairs, local_rows, tgt_len)}


# --------------------------------------------------------------- evaluation


@dataclasses.dataclass
class EvalSet:
  """A dev or test set: raw text for BLEU, and batches for decoding and loss."""
  sources: list[str]  # raw source sentences, original order
  references: list[str]  # raw target sentences, original order
  encoded: Encoded | None = dataclasses.field(default=None, repr=False)
  tokens_per_batch: int = 8192
  bucket_growth: float = 1.1
  num_devices: int = 1
  process_index: int = 0
  process_count: int = 1
  max_length: int = 0  # > 0: pairs with a longer side are left out of the batches
  packed = False  # one pair a row (packing.PackedEvalSet: several)

  def batches(self) -> Iterator[Batch]:
    """Process-local batches, shortest first, by the length bucket L of the longer side:
    'inputs' and 'targets' int32 [rows, L], 'index' int32 [rows] (position in sources; -1 on
    padding rows). A bucket's full batches have the budget's rows for L, its last one a
    power-of-two fraction of them: a few compilations per bucket, not one per batch. A pair
    too long for the budget gets num_devices rows; only a side over max_length (if set:
    learned positions, make_eval_set) leaves a pair out."""
    for pairs, rows, length in self._groups():
      yield self._bucket_batch(pairs, rows, length)

  def _bucket_batch(self, pairs: np.ndarray, rows: int, length: int) -> Batch:
    """This process's rows of a global batch of `rows` rows of `pairs`, padded to `length`."""
    local_rows = rows // self.process_count
    mine = pairs[self.process_index * local_rows:(self.process_index + 1) * local_rows]
    index = np.full(local_rows, -1, np.int32)
    index[:len(mine)] = mine
    return {'inputs': _gather(self.encoded, 0, mine, local_rows, length),
            'targets': _gather(self.encoded, 1, mine, local_rows, length), 'index': index}

  def batch_shapes(self) -> list[tuple[int, int, int]]:
    """The distinct global shapes (rows, L, L) of `batches()`, in their order."""
    return list(dict.fromkeys((rows, length, length) for _, rows, length in self._groups()))

  def _groups(self, among: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, int, int]]:
    """(pairs, rows, L) per batch: buckets in increasing L, sources by length within; of
    the pairs `among` marks (a boolean mask; None: every pair)."""
    src, tgt = self.encoded.lengths
    longer = np.maximum(src, tgt)
    grid = bucket_lengths(int(longer.max(initial=0)), self.bucket_growth)
    joint = grid[np.searchsorted(grid, longer)]  # [pairs] L of each pair
    order = np.lexsort((src, joint))
    if self.max_length:
      order = order[longer[order] <= self.max_length]
    if among is not None:
      order = order[among[order]]
    for length in np.unique(joint):
      members = order[joint[order] == length]
      full = max(1, self.tokens_per_batch // int(length) // self.num_devices)  # per device
      for start in range(0, len(members), full * self.num_devices):
        pairs = members[start:start + full * self.num_devices]
        per_device = -(-len(pairs) // self.num_devices)
        rows = min(full, 1 << (per_device - 1).bit_length()) * self.num_devices
        yield pairs, rows, int(length)


def make_eval_set(name: str, text: Pairs, tokenizer: Any, config: Any, **topology: int,
                  ) -> EvalSet:
  """A dev or test set (`text`: its raw sources and references), encoded whole."""
  encoded = id_cache.encode(iter([text]), tokenizer)
  longest = np.maximum(*encoded.lengths)
  logging.info('%s: %d pairs, %d longer than max_length=%d (kept: eval sets are '
               'not filtered)', name, len(text[0]), (longest > config.max_length).sum(),
               config.max_length)
  # Learned positions (Table 3 row E) end at max_len: a longer pair has no loss to compute.
  # It stays in the text for BLEU, whose inputs are truncated to fit (batch_plan.encode_inputs).
  limit = config.model.max_len if config.model.positional == 'learned' else 0
  if limit and (longest > limit).any():
    logging.warning('%s: %d pairs have a side longer than config.model.max_len=%d, the '
                    'learned positions: left out of the loss', name, (longest > limit).sum(),
                    limit)
  return EvalSet(text[0], text[1], encoded, config.eval_tokens_per_batch,
                 config.bucket_growth, max_length=limit, **topology)
