"""Where parallel text comes from: PREFIX.<lang> files or a tfds WMT14 split (§5.1).

A `Source` is one split (train, dev or test), checked before any work: files exist, line
counts agree, the text is UTF-8 (a bad byte is named by file and line), and tfds data is
prepared or downloadable (`prepare_tfds`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from absl import logging

from t2t_jax.data.id_cache import Pairs
from t2t_jax.platform import errors

CHUNK_PAIRS = 50_000  # sentence pairs read and encoded at a time: bounds memory on WMT
_PROBE_TIMEOUT_S = 3.0
SPLITS = ('train', 'dev', 'test')


class DataUnavailableError(errors.MissingFileError):
  """The tfds data is neither prepared nor downloadable from here."""


@dataclasses.dataclass(frozen=True)
class Source:
  """One split of parallel text: what identifies it, and how to read it."""
  name: str  # 'train', 'dev' or 'test'
  key: dict[str, Any]  # identifies the text, for the id cache
  read: Callable[[], Iterator[Pairs]]  # yields chunks of (sources, targets)
  label: str  # where the text is, for messages: a file, or a tfds split
  size: int | None = None  # sentence pairs, where known cheaply: progress shows done/total


def _files_source(name: str, prefix: str, config: Any) -> Source:
  """PREFIX.<source_lang> and PREFIX.<target_lang>, checked before any work."""
  flag = f'--config.{name}_files={prefix}'
  paths = [f'{prefix}.{lang}' for lang in (config.source_lang, config.target_lang)]
  for path in paths:
    if not os.path.isfile(path):
      raise errors.MissingFileError(f'{path}: no such file (from {flag}; expected {paths[0]} '
                                    f'and {paths[1]}, UTF-8 text with one sentence a line)')
  counts = [_count_lines(path) for path in paths]
  if counts[0] != counts[1]:
    raise errors.UserError(f'{paths[0]} has {counts[0]} lines but {paths[1]} has {counts[1]}: '
                           f'parallel files ({flag}) need one sentence pair a line')
  if not counts[0]:
    raise errors.UserError(f'{paths[0]} and {paths[1]} are empty: the {name} set has no '
                           f'sentence pair (from {flag})')
  stats = [os.stat(path) for path in paths]
  key = {'kind': 'files', 'paths': [os.path.abspath(p) for p in paths],
         'sizes': [s.st_size for s in stats], 'mtimes': [s.st_mtime_ns for s in stats]}
  return Source(name, key, functools.partial(_read_file_pairs, *paths), paths[0],
                size=counts[0])


def _count_lines(path: str) -> int:
  count, last = 0, b'\n'
  with open(path, 'rb') as f:
    while block := f.read(1 << 24):
      count += block.count(b'\n')
      last = block[-1:]
  return count + (last != b'\n')  # a last line without its newline


def _read_file_pairs(source_path: str, target_path: str) -> Iterator[Pairs]:
  with open(source_path, 'rb') as fs, open(target_path, 'rb') as ft:
    for first_line in itertools.count(1, CHUNK_PAIRS):
      raw_s = list(itertools.islice(fs, CHUNK_PAIRS))
      raw_t = list(itertools.islice(ft, CHUNK_PAIRS))
      if not raw_s and not raw_t:
        return
      yield (decode_lines(source_path, first_line, raw_s),
             decode_lines(target_path, first_line, raw_t))


def decode_lines(path: str, first_line: int, raw: list[bytes]) -> list[str]:
  """Decodes lines as UTF-8, naming the file and 1-based line of any bad byte."""
  blob = b''.join(raw)
  try:
    text = blob.decode('utf-8')
  except UnicodeDecodeError as e:
    line = first_line + blob.count(b'\n', 0, e.start)
    column = e.start - (blob.rfind(b'\n', 0, e.start) + 1) + 1
    raise errors.UserError(
        f'{path}, line {line}: invalid UTF-8 ({e.reason}: byte '
        f'0x{blob[e.start]:02x} at byte {column} of the line); the file must be '
        'UTF-8 text') from None
  lines = [line.removesuffix('\r') for line in text.split('\n')[:len(raw)]]
  if first_line == 1 and lines:
    lines[0] = lines[0].removeprefix('\ufeff')  # a byte-order mark is not text
  return lines


def _tfds_sources(config: Any, names: tuple[str, ...], *,
                  prepare: bool) -> dict[str, Source | None]:
  """Splits `names` of `config.tfds_name`, prepared (downloaded) first if `prepare`; without
  it (--mode=eval), an unprepared dataset is an error: evaluating must not start a download
  and preparation of the whole training corpus."""
  builder = tfds_builder(config)
  languages = getattr(builder.info.features, 'languages', None) or []
  for flag in ('source_lang', 'target_lang'):
    if config[flag] not in languages:
      raise errors.UserError(f'config.{flag}={config[flag]!r} is not a language of '
                             f'{config.tfds_name} ({languages})')
  if not builder.is_prepared():
    if not prepare:
      raise DataUnavailableError(
          f'{config.tfds_name} is not prepared in {builder.data_dir_root}: evaluation '
          'reads prepared data only and never downloads; pass the '
          '--config.tfds_data_dir the training run used')
    prepare_tfds(builder, config)
  sources = {}
  for name in names:
    split = config[f'{name}_split']
    key = {'kind': 'tfds', 'name': config.tfds_name, 'version': str(builder.version),
           'data_dir': str(builder.data_dir), 'split': split}
    read = functools.partial(read_tfds_pairs, builder, split, config.source_lang,
                             config.target_lang)
    label = f'{config.tfds_name} split {split!r} (config.{name}_split)'
    sources[name] = (Source(name, key, read, label, size=_tfds_size(builder, split))
                     if split else None)
  return sources


def _tfds_size(builder: Any, split: str) -> int | None:
  """The pairs in `split` (a slice like 'train[:1%]' too), from the prepared dataset's info."""
  try:
    return builder.info.splits[split].num_examples or None
  # The size only gives progress lines their total: a split or builder that tfds cannot
  # size (no split info, an unusual slice) shows none rather than stop the run.
  except (KeyError, ValueError, AttributeError, AssertionError):
    return None


@contextlib.contextmanager
def _wmt_extra() -> Iterator[None]:
  """Around the lazy imports of TensorFlow and tfds: they take seconds to import, and only
  dataset='tfds' needs them. The optional extra `wmt` installs them (pyproject.toml), so that
  the demo and dataset='files' install without TensorFlow's download; a missing extra is the
  user's to fix: one line naming it."""
  try:
    yield
  except ImportError as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise errors.UserError(
        f"config.dataset='tfds' needs TensorFlow Datasets and TensorFlow, an optional extra "
        f"(here: {reason}): pip install 't2t_jax[wmt]' (in a clone: .venv/bin/python -m pip "
        "install -e '.[wmt]'); or train on text files with --config.dataset=files") from e


def tfds_builder(config: Any) -> Any:
  with _wmt_extra():
    import tensorflow as tf  # noqa: PLC0415 (lazily: see _wmt_extra)
    import tensorflow_datasets as tfds  # noqa: PLC0415 (lazily: see _wmt_extra)
  try:
    tf.config.set_visible_devices([], 'GPU')  # accelerator memory belongs to JAX
  except RuntimeError:  # TF already initialised its devices (an earlier call)
    pass
  return tfds.builder(config.tfds_name, data_dir=config.tfds_data_dir or None)


def read_tfds_pairs(builder: Any, split: str, source_lang: str,
                     target_lang: str) -> Iterator[Pairs]:
  with _wmt_extra():
    import tensorflow_datasets as tfds  # noqa: PLC0415 (lazily: see _wmt_extra)
  # tfds stores each pair non-English first; the languages are picked by name.
  dataset = builder.as_dataset(split=split, shuffle_files=False).batch(CHUNK_PAIRS)
  for chunk in tfds.as_numpy(dataset):
    yield ([s.decode('utf-8') for s in chunk[source_lang]],
           [t.decode('utf-8') for t in chunk[target_lang]])


def prepare_tfds(builder: Any, config: Any) -> None:
  """Downloads and prepares the dataset, or fails at once if that is impossible: offline,
  tfds would retry each download for minutes; a quick connection probe says at once what
  to do (prepare it elsewhere, download the archives by hand, or use files)."""
  with _wmt_extra():
    import tensorflow_datasets as tfds  # noqa: PLC0415 (lazily: see _wmt_extra)
  manual_dir = config.tfds_manual_dir or None
  needed = _urls_to_download(builder, manual_dir)
  hosts = sorted({_host_port(url) for url in needed})
  unreachable = [host for host in hosts if not reachable(host)]
  if unreachable:
    raise DataUnavailableError(_offline_message(builder, config, needed, unreachable))
  logging.info('Downloading and preparing %s in %s', config.tfds_name, builder.data_dir_root)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))


def _required_urls(builder: Any) -> list[str]:
  """The archives `download_and_prepare` would fetch."""
  if hasattr(builder, 'subsets'):  # the WMT builders: only this pair's corpora
    with _wmt_extra():
      from tensorflow_datasets.translate import wmt  # noqa: PLC0415 (lazily: see _wmt_extra)
    source = builder.builder_config.language_pair[0]
    return sorted({url for names in builder.subsets.values() for name in names
                   for url in wmt.DATASET_MAP[name].get_url(source)})
  return sorted(builder.url_infos or {})


def _urls_to_download(builder: Any, manual_dir: str | None) -> list[str]:
  """Required archives that are not already in the manual download folder (where tfds
  looks only for archives whose checksum it knows)."""
  url_infos = builder.url_infos or {}
  return [url for url in _required_urls(builder)
          if not (manual_dir and (info := url_infos.get(url)) and info.filename
                  and os.path.exists(os.path.join(manual_dir, info.filename)))]


def _host_port(url: str) -> str:
  parts = urllib.parse.urlsplit(url)
  return f'{parts.hostname}:{parts.port or (443 if parts.scheme == "https" else 80)}'


def reachable(host: str) -> bool:
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
  """The UTF-8 lines of one file (e.g. --mode=translate --input), naming any bad line. '-'
  reads standard input, split exactly like a file: only at '\\n' (str.splitlines would also
  split at U+2028, NEL, form feeds and lone '\\r', shifting later lines against their
  translations)."""
  if path == '-':
    return decode_lines('<stdin>', 1, sys.stdin.buffer.readlines())
  if not os.path.isfile(path):
    raise errors.MissingFileError(f'{path}: no such file')
  with open(path, 'rb') as f:
    return decode_lines(path, 1, f.readlines())


def make_sources(config: Any, names: tuple[str, ...] = SPLITS, *,
                 prepare: bool = True) -> dict[str, Source | None]:
  """The splits `names`, checked; tfds data is prepared first only if `prepare`."""
  if config.dataset == 'tfds':
    return _tfds_sources(config, names, prepare=prepare)
  if 'train' in names and not config.train_files:
    raise errors.UserError('config.dataset=files needs --config.train_files=PREFIX '
                           f'(reads PREFIX.{config.source_lang}, PREFIX.{config.target_lang})')
  return {name: _files_source(name, config[f'{name}_files'], config)
          if config[f'{name}_files'] else None
          for name in names}


def read_eval_text(source: Source) -> Pairs:
  """All of a dev or test set; an empty one fails now, not at its first evaluation."""
  text = _read_all(source)
  if not text[0]:
    raise errors.UserError(f'{source.label}: the {source.name} set has no sentence pair')
  return text


def _read_all(source: Source) -> Pairs:
  sources, targets = [], []
  for chunk_s, chunk_t in source.read():
    sources += chunk_s
    targets += chunk_t
  return sources, targets


def both_sides(source: Source) -> Iterator[str]:
  for chunk_s, chunk_t in source.read():
    yield from chunk_s
    yield from chunk_t
