"""Input pipeline of §5.1: WMT14 or local files -> sub-word ids -> length buckets.

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens." (§5.1)

  text (tfds `wmt14_translate` or PREFIX.<lang> files)
    -> ids with EOS appended (the shared SentencePiece model, tokenizer.py),
       encoded once and cached in <workdir>/data_cache/
    -> drop pairs with an empty side or a side over `max_length` (logged)
    -> each pair goes to a cell (source bucket, target bucket) of a fixed grid
       of padded lengths
    -> per epoch, seeded by (config.seed, epoch): shuffle within cells, cut
       batches, shuffle the batches
    -> each process gathers its own block of rows of each batch and pads them with 0.

The pipeline is plain numpy, so its position is just (epoch, batch): restoring
it replays exactly the batches an uninterrupted run would have produced.

Choices the paper leaves open:
  * padded lengths are multiples of 4 growing ~10% a step (`bucket_growth`);
    a batch of cell (S, T) has the most rows with rows*S and rows*T both within
    `tokens_per_batch`, whatever the number of devices or processes: the batches
    (which pairs, in which order) are the same on any topology, so a run resumes
    on another one. Padding rows (all PAD: weight 0 in the loss) then make a
    batch's rows divisible by the devices (times `grad_accum_steps`);
  * the shorter side of a pair is padded up to within `bucket_band` buckets of
    the longer one: fewer distinct shapes (compilations) for a little padding.
    `bucket_band=0` pads both sides to the longer one, as tensor2tensor did;
  * a cell's left-over pairs join the next cell (both sides one bucket longer)
    when the cell filled at least one batch, else they form one smaller batch;
    every kept pair is in exactly one batch per epoch. On WMT nearly every batch
    is full; on a corpus of a few thousand pairs most cells hold less than a
    batch, so most batches are smaller than `tokens_per_batch`;
  * lengths count the EOS; eval sets are never length-filtered.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import os
import shutil
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from absl import logging

from t2t_jax import id_cache
from t2t_jax import tokenizer as tokenizer_lib
from t2t_jax.id_cache import Encoded, Pairs
from t2t_jax.tokenizer import PAD_ID, Tokenizer

Batch = dict[str, np.ndarray]

_QUANTUM = 4  # padded lengths are multiples of this
_CHUNK = 50_000  # sentence pairs read and encoded at a time: bounds memory on WMT
# Pairs whose lengths are looked at a time when filtering and bucketing: bounds the
# int64 temporaries (WMT EN-FR has 36M pairs).
_SLICE = 1 << 20
_PROBE_TIMEOUT_S = 3.0
# The batch plan's version, saved with the input-pipeline state. 2: rows per batch no
# longer rounded to the device count (the same batches on any topology). States of
# version 1 (no 'plan' key) cannot continue exactly: their batches are not this plan's.
_PLAN_VERSION = 2


# ----------------------------------------------------------------- sources


class DataUnavailableError(FileNotFoundError):
  """The tfds data is neither prepared nor downloadable from here."""


@dataclasses.dataclass(frozen=True)
class _Source:
  """One split of parallel text: what identifies it, and how to read it."""
  name: str  # 'train', 'dev' or 'test'
  key: dict[str, Any]  # identifies the text, for the id cache
  read: Callable[[], Iterator[Pairs]]  # yields chunks of (sources, targets)
  label: str  # where the text is, for messages: a file, or a tfds split


def _files_source(name: str, prefix: str, config: Any) -> _Source:
  """PREFIX.<source_lang> and PREFIX.<target_lang>, checked before any work."""
  flag = f'--config.{name}_files={prefix}'
  paths = [f'{prefix}.{lang}' for lang in (config.source_lang, config.target_lang)]
  for path in paths:
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f'{path}: no such file (from {flag}; expected {paths[0]} and '
          f'{paths[1]}, UTF-8 text with one sentence a line)')
  counts = [_count_lines(path) for path in paths]
  if counts[0] != counts[1]:
    raise ValueError(
        f'{paths[0]} has {counts[0]} lines but {paths[1]} has {counts[1]}: '
        f'parallel files ({flag}) need one sentence pair a line')
  if not counts[0]:
    raise ValueError(f'{paths[0]} and {paths[1]} are empty: the {name} set has no '
                     f'sentence pair (from {flag})')
  stats = [os.stat(path) for path in paths]
  key = {'kind': 'files', 'paths': [os.path.abspath(p) for p in paths],
         'sizes': [s.st_size for s in stats], 'mtimes': [s.st_mtime_ns for s in stats]}
  return _Source(name, key, functools.partial(_read_file_pairs, *paths), paths[0])


def _count_lines(path: str) -> int:
  count, last = 0, b'\n'
  with open(path, 'rb') as f:
    while block := f.read(1 << 24):
      count += block.count(b'\n')
      last = block[-1:]
  return count + (last != b'\n')  # a last line without its newline


def _read_file_pairs(source_path: str, target_path: str) -> Iterator[Pairs]:
  with open(source_path, 'rb') as fs, open(target_path, 'rb') as ft:
    for first_line in itertools.count(1, _CHUNK):
      raw_s, raw_t = list(itertools.islice(fs, _CHUNK)), list(itertools.islice(ft, _CHUNK))
      if not raw_s and not raw_t:
        return
      yield (_decode_lines(source_path, first_line, raw_s),
             _decode_lines(target_path, first_line, raw_t))


def _decode_lines(path: str, first_line: int, raw: list[bytes]) -> list[str]:
  """Decodes lines as UTF-8, naming the file and 1-based line of any bad byte."""
  blob = b''.join(raw)
  try:
    text = blob.decode('utf-8')
  except UnicodeDecodeError as e:
    line = first_line + blob.count(b'\n', 0, e.start)
    column = e.start - (blob.rfind(b'\n', 0, e.start) + 1) + 1
    raise ValueError(
        f'{path}, line {line}: invalid UTF-8 ({e.reason}: byte '
        f'0x{blob[e.start]:02x} at byte {column} of the line); the file must be '
        'UTF-8 text') from None
  lines = [line.removesuffix('\r') for line in text.split('\n')[:len(raw)]]
  if first_line == 1 and lines:
    lines[0] = lines[0].removeprefix('\ufeff')  # a byte-order mark is not text
  return lines


def _tfds_sources(config: Any, names: tuple[str, ...], *,
                  prepare: bool) -> dict[str, _Source | None]:
  """Splits `names` of `config.tfds_name`, prepared (downloaded) first if `prepare`.

  Without `prepare` (--mode=eval) an unprepared dataset is an error: evaluating
  must not start a download and preparation of the whole training corpus.
  """
  builder = _tfds_builder(config)
  languages = getattr(builder.info.features, 'languages', None) or []
  for flag in ('source_lang', 'target_lang'):
    if config[flag] not in languages:
      raise ValueError(f'config.{flag}={config[flag]!r} is not a language of '
                       f'{config.tfds_name} ({languages})')
  if not builder.is_prepared():
    if not prepare:
      raise DataUnavailableError(
          f'{config.tfds_name} is not prepared in {builder.data_dir_root}: evaluation '
          'reads prepared data only and never downloads; pass the '
          '--config.tfds_data_dir the training run used')
    _prepare_tfds(builder, config)
  sources = {}
  for name in names:
    split = config[f'{name}_split']
    key = {'kind': 'tfds', 'name': config.tfds_name, 'version': str(builder.version),
           'data_dir': str(builder.data_dir), 'split': split}
    read = functools.partial(_read_tfds_pairs, builder, split, config.source_lang,
                             config.target_lang)
    label = f'{config.tfds_name} split {split!r} (config.{name}_split)'
    sources[name] = _Source(name, key, read, label) if split else None
  return sources


def _tfds_builder(config: Any) -> Any:
  # TF and tfds are imported only here: they are slow to import, and
  # dataset='files' must not need them.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    tf.config.set_visible_devices([], 'GPU')  # accelerator memory belongs to JAX
  except RuntimeError:  # TF already initialised its devices (an earlier call)
    pass
  return tfds.builder(config.tfds_name, data_dir=config.tfds_data_dir or None)


def _read_tfds_pairs(builder: Any, split: str, source_lang: str,
                     target_lang: str) -> Iterator[Pairs]:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  # tfds stores each pair non-English first; the languages are picked by name.
  dataset = builder.as_dataset(split=split, shuffle_files=False).batch(_CHUNK)
  for chunk in tfds.as_numpy(dataset):
    yield ([s.decode('utf-8') for s in chunk[source_lang]],
           [t.decode('utf-8') for t in chunk[target_lang]])


def _prepare_tfds(builder: Any, config: Any) -> None:
  """Downloads and prepares the dataset, or fails at once if that is impossible.

  Offline, tfds would retry each download for minutes before failing; a quick
  connection probe turns that into an immediate error saying what to do.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  manual_dir = config.tfds_manual_dir or None
  needed = _urls_to_download(builder, manual_dir)
  hosts = sorted({_host_port(url) for url in needed})
  unreachable = [host for host in hosts if not _reachable(host)]
  if unreachable:
    raise DataUnavailableError(_offline_message(builder, config, needed, unreachable))
  logging.info('Downloading and preparing %s in %s', config.tfds_name,
               builder.data_dir_root)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))


def _required_urls(builder: Any) -> list[str]:
  """The archives `download_and_prepare` would fetch."""
  if hasattr(builder, 'subsets'):  # the WMT builders: only this pair's corpora
    from tensorflow_datasets.translate import wmt  # pylint: disable=g-import-not-at-top
    source = builder.builder_config.language_pair[0]
    return sorted({url for names in builder.subsets.values() for name in names
                   for url in wmt.DATASET_MAP[name].get_url(source)})
  return sorted(builder.url_infos or {})


def _urls_to_download(builder: Any, manual_dir: str | None) -> list[str]:
  """Required archives that are not already in the manual download folder."""
  url_infos = builder.url_infos or {}
  missing = []
  for url in _required_urls(builder):
    info = url_infos.get(url)
    # tfds looks in manual_dir only for archives whose checksum it knows.
    if not (manual_dir and info and info.filename and
            os.path.exists(os.path.join(manual_dir, info.filename))):
      missing.append(url)
  return missing


def _host_port(url: str) -> str:
  parts = urllib.parse.urlsplit(url)
  return f'{parts.hostname}:{parts.port or (443 if parts.scheme == "https" else 80)}'


def _reachable(host: str) -> bool:
  """Whether 'name[:port]' accepts a TCP connection within a few seconds."""
  hostname, _, port = host.partition(':')
  try:
    with socket.create_connection((hostname, int(port or 80)), _PROBE_TIMEOUT_S):
      return True
  except OSError:
    return False


def _offline_message(builder: Any, config: Any, urls: list[str],
                     unreachable: list[str]) -> str:
  url_infos = builder.url_infos or {}
  archives = '\n'.join(
      f'      {url_infos[u].filename}  <- {u}' if u in url_infos else
      f'      {u}  (tfds knows no checksum for it, so it cannot come from DIR: use 1.)'
      for u in urls)
  return (
      f'{config.tfds_name} is not prepared in {builder.data_dir_root}, and '
      f'{", ".join(unreachable)} cannot be reached to download it. Either:\n'
      f'  1. prepare it on a machine with internet (`tfds build {config.tfds_name} '
      f'--data_dir=DIR`), copy DIR here and pass --config.tfds_data_dir=DIR;\n'
      f'  2. or download these archives by hand into a folder DIR and pass '
      f'--config.tfds_manual_dir=DIR:\n{archives}\n'
      f'  3. or train on your own text files: --config.dataset=files '
      f'--config.train_files=PREFIX --config.dev_files=PREFIX '
      f'--config.test_files=PREFIX (reads PREFIX.{config.source_lang} and '
      f'PREFIX.{config.target_lang}, one sentence a line).')


def read_lines(path: str) -> list[str]:
  """The UTF-8 lines of one file (e.g. --mode=translate --input), naming any bad line.

  '-' reads standard input, as bytes split exactly like a file: only at '\\n'
  (str.splitlines would also split at U+2028, NEL, form feeds and lone '\\r',
  shifting every later line against its translation).
  """
  if path == '-':
    return _decode_lines('<stdin>', 1, sys.stdin.buffer.readlines())
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no such file')
  with open(path, 'rb') as f:
    return _decode_lines(path, 1, f.readlines())


def resolve_demo(config: Any, workdir: str) -> Any:
  """config.dataset='demo': writes the generated corpus (demo_corpus.py) into the workdir
  once, then reads it as dataset='files'. Other datasets pass through unchanged."""
  if config.dataset != 'demo':
    return config
  import ml_collections  # pylint: disable=g-import-not-at-top
  from t2t_jax import demo_corpus  # pylint: disable=g-import-not-at-top
  prefixes = demo_corpus.write_corpus(
      os.path.join(workdir, 'demo_corpus'), num_train=config.demo_num_train,
      num_dev=config.demo_num_eval, num_test=config.demo_num_eval, seed=config.demo_seed,
      source_lang=config.source_lang, target_lang=config.target_lang)
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.dataset = 'files'
  for split in ('train', 'dev', 'test'):
    resolved[f'{split}_files'] = prefixes[split]
  return resolved


def load_tokenizer(config: Any, workdir: str) -> Any:
  """The vocabulary a training run in `workdir` made (for decoding): never trains one."""
  if config.dataset == 'synthetic':
    from t2t_jax import synthetic  # pylint: disable=g-import-not-at-top
    return synthetic.IdTokenizer(config.vocab_size)
  model_path = os.path.join(workdir, 'vocab', 'spm.model')
  if not os.path.exists(model_path):
    raise FileNotFoundError(f'{model_path}: no vocabulary in the workdir; train first '
                            '(--mode=train) or point --workdir at a trained run')
  tokenizer = Tokenizer(model_path)
  if tokenizer.vocab_size != config.vocab_size:
    raise ValueError(f'config.vocab_size={config.vocab_size}, but {model_path} has '
                     f'{tokenizer.vocab_size} pieces')
  return tokenizer


def load_eval_set(config: Any, workdir: str, split: str, *, tokenizer: Any) -> Any:
  """The raw sources and references of split 'dev' or 'test' (for BLEU)."""
  if split not in ('dev', 'test'):
    raise ValueError(f"config.eval_split={split!r}: choose 'dev' or 'test'")
  if config.dataset == 'synthetic':
    from t2t_jax import synthetic  # pylint: disable=g-import-not-at-top
    return getattr(synthetic.get_datasets(config, num_devices=1), split)
  config = resolve_demo(config, workdir)
  # Only this split: eval needs neither the training files nor a prepared train split.
  source = _make_sources(config, (split,), prepare=False)[split]
  if source is None:
    key = f'{split}_split' if config.dataset == 'tfds' else f'{split}_files'
    raise ValueError(f'No {split} set: config.{key} is empty')
  return _eval_set(split, _read_eval_text(source), tokenizer, config)


def _make_sources(config: Any, names: tuple[str, ...] = ('train', 'dev', 'test'), *,
                  prepare: bool = True) -> dict[str, _Source | None]:
  """The splits `names`, checked; tfds data is prepared first only if `prepare`."""
  if config.dataset == 'tfds':
    return _tfds_sources(config, names, prepare=prepare)
  if 'train' in names and not config.train_files:
    raise ValueError('config.dataset=files needs --config.train_files=PREFIX '
                     f'(reads PREFIX.{config.source_lang}, PREFIX.{config.target_lang})')
  return {name: _files_source(name, config[f'{name}_files'], config)
                if config[f'{name}_files'] else None
          for name in names}


def _read_eval_text(source: _Source) -> Pairs:
  """All of a dev or test set; an empty one fails now, not at its first evaluation."""
  text = _read_all(source)
  if not text[0]:
    raise ValueError(f'{source.label}: the {source.name} set has no sentence pair')
  return text


def _read_all(source: _Source) -> Pairs:
  sources, targets = [], []
  for chunk_s, chunk_t in source.read():
    sources += chunk_s
    targets += chunk_t
  return sources, targets


def _both_sides(source: _Source) -> Iterator[str]:
  for chunk_s, chunk_t in source.read():
    yield from chunk_s
    yield from chunk_t


# ------------------------------------------------------------ pairs kept


def _index_dtype(num_pairs: int) -> type:
  """int32 pair indices while they fit: half the memory of int64 on WMT's 4.5M-36M pairs."""
  return np.int32 if num_pairs < np.iinfo(np.int32).max else np.int64


def _length_filter(encoded: Encoded, max_length: int, name: str) -> np.ndarray:
  """Indices of the pairs kept for training; the dropped ones are counted."""
  num_pairs = len(encoded.offsets[0]) - 1
  empty, too_long = np.empty(num_pairs, bool), np.empty(num_pairs, bool)
  for start in range(0, num_pairs, _SLICE):
    part = slice(start, start + _SLICE)
    src, tgt = (np.diff(offsets[start:start + _SLICE + 1]) for offsets in encoded.offsets)
    empty[part] = (src <= 1) | (tgt <= 1)  # only the EOS
    too_long[part] = ~empty[part] & ((src > max_length) | (tgt > max_length))
  kept = np.flatnonzero(~empty & ~too_long).astype(_index_dtype(num_pairs))
  logging.info(
      '%s: %d pairs; dropped %d with an empty side and %d with a side longer '
      'than max_length=%d tokens; kept %d', name, num_pairs, empty.sum(),
      too_long.sum(), max_length, len(kept))
  if not len(kept):
    raise ValueError(f'{name}: no sentence pair left after dropping empty pairs '
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
  """Grid indices (source, target) of each kept pair's padded lengths.

  int16 (a grid has tens of lengths), computed a slice of pairs at a time: 4 bytes
  a pair instead of 16, and no int64 temporaries the size of the corpus.
  """
  cells = np.empty((2, len(kept)), np.int16)
  band = min(band, len(grid))  # a wider band changes nothing, and stays an int16
  for start in range(0, len(kept), _SLICE):
    pairs = kept[start:start + _SLICE]
    i, j = (np.searchsorted(grid, offsets[pairs + 1] - offsets[pairs]).astype(np.int16)
            for offsets in encoded.offsets)
    longer = np.maximum(i, j)
    cells[:, start:start + len(pairs)] = np.maximum(i, longer - band), np.maximum(j, longer - band)
  return cells[0], cells[1]


def _rows(grid: np.ndarray, tokens_per_batch: int) -> np.ndarray:
  """[S, T] -> most rows with rows*S and rows*T in budget.

  Not rounded to the device count: the plan must not depend on the topology.
  """
  longer = np.maximum(grid[:, None], grid[None, :])
  return tokens_per_batch // longer


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
  sizes = np.array([len(batches[b]) for b in perm], np.int64)
  return _Plan(order=np.concatenate([batches[b] for b in perm]),
               starts=np.concatenate([[0], np.cumsum(sizes)]),
               shapes=np.array(shapes, np.int64).reshape(-1, 3)[perm])


# ----------------------------------------------------------------- training


class TrainIterator:
  """Endless process-local training batches, epoch after epoch (§5.1).

  Yields {'inputs': int32 [rows, S], 'targets': int32 [rows, T]}: this process's
  contiguous block of a global batch. The plan's batches (which pairs, in which
  order) do not depend on the topology; all-PAD rows at the end of each global
  batch make its rows divisible by num_devices × grad_accum_steps, so that every
  device gets as many rows and the train step can cut them into micro-batches.
  `get_state`/`set_state` save and restore the position exactly, also into an
  iterator of another topology.
  """

  def __init__(self, encoded: Encoded, kept: np.ndarray, config: Any, *,
               num_devices: int, process_index: int, process_count: int,
               data_key: str, grad_accum_steps: int = 1):
    self._encoded, self._kept = encoded, kept
    self._grid = bucket_lengths(config.max_length, config.bucket_growth)
    self._cell_i, self._cell_j = _cells(encoded, kept, self._grid, config.bucket_band)
    self._rows = _rows(self._grid, config.tokens_per_batch)
    # Rows shrink as the longer side grows, so the longest cell decides.
    last = max(self._cell_i.max(), self._cell_j.max())
    if not self._rows[last, last]:
      longest = int(self._grid[last])
      raise ValueError(
          f'config.tokens_per_batch={config.tokens_per_batch} cannot hold one '
          f'{longest}-token row; raise it or lower config.max_length')
    self._seed = config.seed
    self._row_multiple = num_devices * grad_accum_steps  # global rows are padded to it
    self._process_index, self._process_count = process_index, process_count
    # No topology here: a state saved on 8 devices resumes on 1 (the same batches).
    settings = [data_key, config.max_length, config.tokens_per_batch, config.seed,
                config.bucket_growth, config.bucket_band, len(kept), _PLAN_VERSION]
    self._fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
    self._epoch, self._batch = 0, 0
    self._plan: _Plan | None = None
    self._plan_epoch = -1

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
    return {'epoch': self._epoch, 'batch': self._batch,
            'fingerprint': self._fingerprint, 'plan': _PLAN_VERSION}

  def set_state(self, state: dict[str, Any]) -> None:
    if state.get('fingerprint') != self._fingerprint and state.get('plan') != _PLAN_VERSION:
      raise ValueError(
          f'The saved input-pipeline state (fingerprint {state.get("fingerprint")}) was '
          f'made by an older t2t_jax, whose batch plan (version {state.get("plan", 1)}) '
          'rounded the rows of each batch to the number of devices; this version\'s plan '
          f'(version {_PLAN_VERSION}) is the same on any number of devices, so its batches '
          'differ and that position cannot be continued exactly. Resume with the version '
          'that made the checkpoint, or start again (--config.restart=True).')
    if state.get('fingerprint') != self._fingerprint:
      raise ValueError(
          'The saved input-pipeline state was made for different data or settings '
          '(data files, vocabulary, max_length, tokens_per_batch, seed or bucketing), '
          'so its position cannot be restored exactly: saved fingerprint '
          f'{state.get("fingerprint")}, now {self._fingerprint}.')
    epoch, batch = int(state['epoch']), int(state['batch'])
    if not 0 <= batch < self.plan(epoch).num_batches:
      raise ValueError(f'Input-pipeline state {state}: epoch {epoch} has '
                       f'{self.plan(epoch).num_batches} batches')
    self._epoch, self._batch = epoch, batch

  def plan(self, epoch: int) -> _Plan:
    """The batches of `epoch`, a pure function of (config.seed, epoch)."""
    if self._plan_epoch != epoch:
      rng = np.random.default_rng([self._seed, epoch])
      self._plan = _epoch_plan(self._cell_i, self._cell_j, self._grid, self._rows, rng)
      self._plan_epoch = epoch
    return self._plan

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

  def batches(self) -> Iterator[Batch]:
    """Process-local batches, shortest first, in few distinct shapes.

    Pairs are grouped by the length bucket L of their longer side: 'inputs' and 'targets'
    int32 [rows, L], 'index' int32 [rows] (position in sources/references; -1 for padding
    rows). A bucket's full batches all have the budget's rows for L, and its last one a
    power-of-two fraction of them, so evaluation compiles a few times per bucket, not once
    per batch. Nothing is dropped: a pair too long for the budget gets num_devices rows.
    """
    for pairs, rows, length in self._groups():
      local_rows = rows // self.process_count
      mine = pairs[self.process_index * local_rows:(self.process_index + 1) * local_rows]
      index = np.full(local_rows, -1, np.int32)
      index[:len(mine)] = mine
      yield {'inputs': _gather(self.encoded, 0, mine, local_rows, length),
             'targets': _gather(self.encoded, 1, mine, local_rows, length),
             'index': index}

  def _groups(self) -> Iterator[tuple[np.ndarray, int, int]]:
    """(pairs, rows, L) per batch: buckets in increasing L, sources by length within."""
    src, tgt = self.encoded.lengths
    if not len(src):
      return
    grid = bucket_lengths(int(max(src.max(), tgt.max())), self.bucket_growth)
    joint = grid[np.searchsorted(grid, np.maximum(src, tgt))]  # [pairs] L of each pair
    order = np.lexsort((src, joint))
    for length in np.unique(joint):
      members = order[joint[order] == length]
      full = max(1, self.tokens_per_batch // int(length) // self.num_devices)  # per device
      for start in range(0, len(members), full * self.num_devices):
        pairs = members[start:start + full * self.num_devices]
        per_device = -(-len(pairs) // self.num_devices)
        rows = min(full, 1 << (per_device - 1).bit_length()) * self.num_devices
        yield pairs, rows, int(length)


def _eval_set(name: str, text: Pairs, tokenizer: Tokenizer, config: Any, **topology: int
              ) -> EvalSet:
  encoded = id_cache.encode(iter([text]), tokenizer)
  too_long = (np.maximum(*encoded.lengths) > config.max_length).sum()
  logging.info('%s: %d pairs, %d longer than max_length=%d (kept: eval sets are '
               'not filtered)', name, len(text[0]), too_long, config.max_length)
  return EvalSet(text[0], text[1], encoded, config.eval_tokens_per_batch,
                 config.bucket_growth, **topology)


# -------------------------------------------------------------- entry point


def _check_settings(config: Any, num_devices: int, process_index: int,
                    process_count: int) -> None:
  if num_devices % process_count or not 0 <= process_index < process_count:
    raise ValueError(f'{num_devices} devices cannot be split evenly over '
                     f'{process_count} processes (this is process {process_index})')
  for key in ('max_length', 'tokens_per_batch', 'eval_tokens_per_batch'):
    if not config[key] > 0:
      raise ValueError(f'config.{key} must be positive, got {config[key]!r}')
  if not config.bucket_band >= 0:
    raise ValueError(f'config.bucket_band must be >= 0, got {config.bucket_band!r}')
  if not config.bucket_growth >= 1:
    raise ValueError(f'config.bucket_growth must be >= 1, got {config.bucket_growth!r}')


@dataclasses.dataclass
class Datasets:
  tokenizer: Tokenizer | None
  train: TrainIterator  # endless; process-local batches
  dev: EvalSet | None
  test: EvalSet | None


def _at_once(name: str, make: Callable[[], Any]) -> Any:
  return make()


def get_datasets(config: Any, workdir: str, *, num_devices: int,
                 process_index: int = 0, process_count: int = 1,
                 once: Callable[[str, Callable[[], Any]], Any] = _at_once,
                 grad_accum_steps: int = 1) -> Datasets:
  """The tokenizer, training batches and dev/test sets of `config.dataset`.

  Training batches are padded with all-PAD rows to a multiple of num_devices ×
  grad_accum_steps (config.grad_accum_steps: the train step's micro-batches).

  Every input is checked (files exist, line counts agree, the text is UTF-8,
  tfds data is available, dev and test sets are not empty) before the vocabulary
  is trained or anything encoded. What is written to disk (the demo corpus, the
  tfds preparation, the vocabulary, the id cache) goes through `once(name, make)`:
  a multi-process run passes distributed.first_then_others, so that process 0
  builds each and the others, waiting, load it.
  """
  if config.dataset == 'synthetic':
    from t2t_jax import synthetic  # pylint: disable=g-import-not-at-top
    return synthetic.get_datasets(config, num_devices=num_devices,
                                  process_index=process_index,
                                  process_count=process_count,
                                  grad_accum_steps=grad_accum_steps)
  if config.dataset not in ('tfds', 'files', 'demo'):
    raise ValueError(f"config.dataset={config.dataset!r}: choose 'tfds', "
                     "'files', 'demo' or 'synthetic'")
  config = once('demo_corpus', lambda: resolve_demo(config, workdir))
  _check_settings(config, num_devices, process_index, process_count)
  sources = once('sources', lambda: _make_sources(config))  # tfds: prepared once
  eval_text = {name: _read_eval_text(sources[name]) for name in ('dev', 'test')
               if sources[name]}
  tokenizer = once('vocabulary', lambda: tokenizer_lib.load_or_train(
      config, workdir, lambda: _both_sides(sources['train'])))
  source = sources['train']
  encoded = once('data_cache', lambda: id_cache.load_or_encode(
      source.name, source.key, source.read, tokenizer, workdir))
  kept = _length_filter(encoded, config.max_length, 'train')
  topology = dict(num_devices=num_devices, process_index=process_index,
                  process_count=process_count)
  # By content, not paths or times: a restart on a machine that re-downloaded
  # the same data must still resume exactly.
  data_key = hashlib.sha256(np.ascontiguousarray(encoded.offsets[0]).tobytes()
                            + np.ascontiguousarray(encoded.offsets[1]).tobytes()
                            + tokenizer.fingerprint.encode()).hexdigest()
  train = TrainIterator(encoded, kept, config, data_key=data_key,
                        grad_accum_steps=grad_accum_steps, **topology)
  evals = {name: _eval_set(name, text, tokenizer, config, **topology)
           for name, text in eval_text.items()}
  return Datasets(tokenizer, train, evals.get('dev'), evals.get('test'))
