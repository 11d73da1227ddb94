"""Sub-word ids of a training split, encoded once and kept in <workdir>/data_cache/ (§5.1).

A split's cache is a folder <split>-<digest>/ of four flat .npy files (`Encoded`'s arrays)
and key.json (what was encoded, and each file's size). It is written chunk by chunk into a
temporary folder, fsynced and renamed, so memory holds one chunk and a crash leaves no half
cache; it is read back memory-mapped, so WMT's ids need not fit in RAM (and hosts sharing a
disk share the page cache), and checked, so a truncated file is rebuilt, not trained on.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from absl import logging

from t2t_jax.data.tokenizer import Tokenizer
from t2t_jax.platform import errors, files, progress

Pairs = tuple[list[str], list[str]]  # a chunk of text: (sources, targets)


@dataclasses.dataclass(frozen=True)
class Encoded:
  """Ids of one split. Pair i's side k is ids[k][offsets[k][i]:offsets[k][i + 1]]."""
  ids: tuple[np.ndarray, np.ndarray]  # flat, EOS included; source then target
  offsets: tuple[np.ndarray, np.ndarray]  # int64 [num_pairs + 1]

  @property
  def lengths(self) -> tuple[np.ndarray, np.ndarray]:
    return np.diff(self.offsets[0]), np.diff(self.offsets[1])


# The .npy files of one split's cache, beside key.json.
_CACHE_FILES = ('source_ids', 'target_ids', 'source_offsets', 'target_offsets')


def _id_dtype(tokenizer: Tokenizer) -> np.dtype:
  # uint16 halves the memory and disk of WMT's ~10^8 ids whenever the vocabulary allows.
  return np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32)


def _encode_texts(texts: list[str], tokenizer: Tokenizer,
                  dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """(flat ids, lengths) of `texts`, each sentence's ids ending with EOS."""
  ids = tokenizer.encode_arrays(texts)
  lengths = np.fromiter(map(len, ids), np.int64, len(ids))
  return (np.concatenate(ids).astype(dtype) if ids else np.zeros(0, dtype)), lengths


def encode(chunks: Iterator[Pairs], tokenizer: Tokenizer) -> Encoded:
  """Ids in memory: for the dev and test sets (training ids go to `_encode_into`)."""
  chunks = list(chunks)
  ids, offsets = [], []
  for side in (0, 1):
    texts = [text for chunk in chunks for text in chunk[side]]
    flat, lengths = _encode_texts(texts, tokenizer, _id_dtype(tokenizer))
    ids.append(flat)
    offsets.append(np.cumsum(np.concatenate([np.zeros(1, np.int64), lengths])))
  return Encoded(tuple(ids), tuple(offsets))


class _NpyWriter:
  """A 1-D .npy file written chunk by chunk; its length goes into the header at the end (numpy
  pads every header so that a growing first axis fits: GROWTH_AXIS_MAX_DIGITS)."""

  def __init__(self, path: str, dtype: Any):
    self._file = open(path, 'wb')  # closed by close(): the writer outlives one block
    self._dtype, self._length = np.dtype(dtype), 0
    self._write_header()
    self._data_start = self._file.tell()

  def _write_header(self) -> None:
    np.lib.format.write_array_header_1_0(self._file, {
        'descr': np.lib.format.dtype_to_descr(self._dtype), 'fortran_order': False,
        'shape': (self._length,)})

  def append(self, array: np.ndarray) -> None:
    self._file.write(np.ascontiguousarray(array, self._dtype).data)
    self._length += len(array)

  def finish(self) -> None:
    """Writes the final header and flushes the file to the disk."""
    self._file.seek(0)
    self._write_header()
    if self._file.tell() != self._data_start:  # never: numpy reserved the room
      raise RuntimeError(f'{self._file.name}: the .npy header changed size')
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    self._file.close()


def _encode_into(folder: str, chunks: Iterator[Pairs], tokenizer: Tokenizer,
                 cache_path: str, bar: progress.Progress) -> None:
  """Encodes chunk by chunk straight into folder/<_CACHE_FILES>.npy. Errors while writing
  name `cache_path`; errors while reading the text stay the reader's. `bar` counts pairs."""
  writing = functools.partial(files.disk_write_errors, cache_path, 'the data cache')
  dtype = _id_dtype(tokenizer)
  writers, ends = [], [0, 0]
  try:
    with writing():
      for name, kind in zip(_CACHE_FILES, (dtype, dtype, np.int64, np.int64), strict=True):
        writers.append(_NpyWriter(os.path.join(folder, f'{name}.npy'), kind))
      for offsets in writers[2:]:
        offsets.append(np.zeros(1, np.int64))
    for chunk in chunks:
      encoded = [_encode_texts(texts, tokenizer, dtype) for texts in chunk]
      with writing():
        for side, (ids, lengths) in enumerate(encoded):
          writers[side].append(ids)
          writers[2 + side].append(ends[side] + np.cumsum(lengths))
          ends[side] += int(lengths.sum())
      bar.update(len(chunk[0]))
    with writing():
      for writer in writers:
        writer.finish()
  finally:
    for writer in writers:
      writer.close()


def load_or_encode(name: str, key: dict[str, Any], read: Callable[[], Iterator[Pairs]],
                   tokenizer: Tokenizer, workdir: str, *, size: int | None = None) -> Encoded:
  """Ids of split `name`, encoded once and kept in <workdir>/data_cache/.

  `key`, `read` and `size` are a sources.Source's: `key` (the file paths, sizes and times;
  or the tfds name, version and split) with the vocabulary's fingerprint names the cache, so
  a change to either re-encodes.
  """
  key = json.dumps({**key, 'vocab': tokenizer.fingerprint}, sort_keys=True)
  digest = hashlib.sha256(key.encode()).hexdigest()[:16]
  path = os.path.join(workdir, 'data_cache', f'{name}-{digest}')
  files.sweep_temp_dirs(os.path.dirname(path))
  if os.path.isdir(path):
    encoded = _load_cache(path)
    if encoded is not None:
      return encoded
    _discard(path)
  logging.info('Encoding the %s split into %s', name, path)
  with progress.Progress(f'Encoding the {name} split', size, 'pairs') as bar:
    save_atomically(path, key, functools.partial(
        _encode_into, chunks=read(), tokenizer=tokenizer, cache_path=path, bar=bar))
  encoded = _load_cache(path)
  if encoded is None:
    raise errors.UserError(f'{path}: the data cache just written reads back damaged')
  return encoded


def _load_cache(path: str) -> Encoded | None:
  """The cache in `path`, memory-mapped; None, with a warning, if it is damaged. Each file's
  size is checked against key.json where it records them (older caches do not)."""
  key_file = os.path.join(path, 'key.json')
  try:
    with open(key_file, encoding='utf-8') as f:
      sizes = json.load(f).get('file_bytes', {})
  except (OSError, ValueError, AttributeError) as e:
    logging.warning('%s: unreadable (%s); encoding the data again', key_file, e)
    return None
  arrays = []
  for name in _CACHE_FILES:
    file = os.path.join(path, f'{name}.npy')
    try:
      if name + '.npy' in sizes and os.path.getsize(file) != sizes[name + '.npy']:
        raise ValueError(f'{os.path.getsize(file)} bytes, {sizes[name + ".npy"]} written')
      arrays.append(np.load(file, mmap_mode='r'))
    except (OSError, ValueError, EOFError) as e:  # missing, truncated, not .npy
      logging.warning('%s: damaged (%s); encoding the data again', file, e)
      return None
  encoded = Encoded(ids=(arrays[0], arrays[1]), offsets=(arrays[2], arrays[3]))
  problem = _inconsistency(encoded)
  if problem:
    logging.warning('%s: damaged (%s); encoding the data again', path, problem)
    return None
  return encoded


def _inconsistency(encoded: Encoded) -> str:
  """What is wrong with the shapes of `encoded` ('' if nothing); O(1) reads."""
  for name, ids, offsets in zip(('source', 'target'), encoded.ids, encoded.offsets, strict=True):
    if ids.ndim != 1 or offsets.ndim != 1 or not len(offsets):
      return f'{name} ids or offsets are not a flat array'
    if offsets[0] != 0 or offsets[-1] != len(ids):
      return f'{name} offsets end at {offsets[-1]}, but there are {len(ids)} ids'
  pairs = [len(offsets) - 1 for offsets in encoded.offsets]
  return f'{pairs[0]} source but {pairs[1]} target sentences' if pairs[0] != pairs[1] else ''


def _discard(path: str) -> None:
  """Removes a damaged cache: renamed away first, so no reader sees half of it."""
  with files.disk_write_errors(path, 'the data cache'):
    doomed = files.make_temp_dir(os.path.dirname(path))
    try:
      os.rename(path, os.path.join(doomed, 'old'))
    except FileNotFoundError:  # another host discarded it first
      pass
    finally:
      shutil.rmtree(doomed, ignore_errors=True)


def save_atomically(path: str, key: str, write: Callable[[str], None]) -> None:
  """Fills a temporary folder with write(folder), then renames it to `path`: the files reach
  the disk before the rename, and the rename before we return. Any error or interrupt
  removes the folder (a killed run's is swept by the next, `load_or_encode`); a full disk
  or a missing permission becomes one line naming `path`."""
  writing = functools.partial(files.disk_write_errors, path, 'the data cache')
  tmp = None
  try:
    with writing():
      folder = os.path.dirname(path)  # WORKDIR/data_cache
      files.make_folder(folder, os.path.dirname(folder), 'the data cache')
      tmp = files.make_temp_dir(folder)
    write(tmp)
    with writing():
      sizes = {f'{name}.npy': os.path.getsize(os.path.join(tmp, f'{name}.npy'))
               for name in _CACHE_FILES}
      with open(os.path.join(tmp, 'key.json'), 'w', encoding='utf-8') as f:
        json.dump({'key': json.loads(key), 'file_bytes': sizes}, f, sort_keys=True)
      if files.publish(tmp, path):
        tmp = None
      # else another process (host) wrote the same cache first: theirs stays, tmp goes.
  finally:
    if tmp:
      shutil.rmtree(tmp, ignore_errors=True)
