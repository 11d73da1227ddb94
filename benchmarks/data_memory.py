"""Host memory and disk of the §5.1 input pipeline: encoding, the id cache, the iterator.

  python benchmarks/data_memory.py encode [--pairs=500000] [--vocab_size=4000]
  python benchmarks/data_memory.py iterator [--pairs=36000000]

`encode` repeats the 10k-pair WMT sample ($T2T_WMT_SAMPLE) up to --pairs,
trains a --vocab_size BPE vocabulary on the sample, then encodes the training split three
ways, each in a fresh process, and prints one JSON line per way:
  int_lists        the first encoder's way: Python int lists, all ids in memory, np.save
  numpy_in_memory  sentencepiece's numpy output, all ids in memory, np.save
  streamed         what id_cache.py does: numpy output, each chunk appended to the cache files
with seconds, peak RSS over the process's RSS before encoding, ids per pair and cache bytes
per pair. A small vocabulary cuts words into more pieces than the paper's 37000 (EN-DE) or
32000 (EN-FR), so its ids and bytes per pair are upper bounds for those.

`iterator` builds batching.TrainIterator (length filter, cells, one epoch's plan) on --pairs
pairs whose lengths are drawn from the sample's, with ids and offsets in memory-mapped .npy
files as in a real run, and prints one JSON line: seconds, peak RSS over the RSS before
(which holds the offsets' pages, 16 bytes a pair, shared page cache) and what stays.
Peak RSS is VmHWM after resetting it (/proc/self/clear_refs), Linux.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import common  # benchmarks/common.py: the repository on sys.path

# 4 KiB pages: the peaks below are of this process's own RSS, which huge pages would round up.
common.start(__name__, huge_pages=False)

import numpy as np

from t2t_jax.data import batching, id_cache, sources, tokenizer

VARIANTS = ('int_lists', 'numpy_in_memory', 'streamed')
MB = 1 << 20


def status_mb(key: str) -> float:
  """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
  with open('/proc/self/status', encoding='ascii') as f:
    line = next(row for row in f if row.startswith(key + ':'))
  return int(line.split()[1]) / 1024


def reset_peak() -> float:
  """Starts a new peak-RSS measurement; returns the RSS now (MiB)."""
  with open('/proc/self/clear_refs', 'w', encoding='ascii') as f:
    f.write('5')  # resets VmHWM to VmRSS
  return status_mb('VmRSS')


def make_config(prefix: str, vocab_size: int) -> Any:
  config = common.get_config('base')
  config.dataset, config.train_files = 'files', prefix
  config.vocab_size = vocab_size
  return config


# ------------------------------------------------------------------------ encode


def encode_int_lists(source: Any, tok: tokenizer.Tokenizer) -> id_cache.Encoded:
  """Encoding as it was first written (lists of Python ints, all in memory)."""
  dtype = np.uint16
  flat, lengths = ([], []), ([], [])
  for chunk in source.read():
    for side, texts in enumerate(chunk):
      ids = tok.encode_batch(texts)
      lengths[side].append(np.fromiter(map(len, ids), np.int64, len(ids)))
      flat[side].append(np.fromiter(itertools.chain.from_iterable(ids), dtype,
                                    int(lengths[side][-1].sum())))
  offsets = tuple(np.cumsum(np.concatenate([np.zeros(1, np.int64), *parts]))
                  for parts in lengths)
  return id_cache.Encoded(tuple(np.concatenate(parts) for parts in flat), offsets)


def save_in_memory(encoded: id_cache.Encoded, folder: str) -> None:
  """The cache files as the first encoder wrote them: whole arrays, np.save."""
  os.makedirs(folder)
  for name, array in zip(id_cache._CACHE_FILES, encoded.ids + encoded.offsets, strict=True):
    np.save(os.path.join(folder, f'{name}.npy'), array)


def encode_child(variant: str, prefix: str, workdir: str, vocab_size: int) -> dict[str, Any]:
  tok = tokenizer.Tokenizer(os.path.join(workdir, 'vocab', 'spm.model'))
  source = sources._files_source('train', prefix, make_config(prefix, vocab_size))
  cache = os.path.join(workdir, f'cache-{variant}')
  before = reset_peak()
  start = time.perf_counter()
  if variant == 'int_lists':
    save_in_memory(encode_int_lists(source, tok), os.path.join(cache, 'train'))
  elif variant == 'numpy_in_memory':
    save_in_memory(id_cache.encode(source.read(), tok), os.path.join(cache, 'train'))
  else:
    id_cache.load_or_encode(source.name, source.key, source.read, tok, cache)
  seconds = time.perf_counter() - start
  peak = status_mb('VmHWM')
  [folder] = [root for root, _, files in os.walk(cache) if 'key.json' in files or
              'source_ids.npy' in files]
  arrays = [np.load(os.path.join(folder, f'{n}.npy'), mmap_mode='r') for n in id_cache._CACHE_FILES]
  pairs = len(arrays[2]) - 1
  cache_bytes = sum(os.path.getsize(os.path.join(folder, f'{n}.npy'))
                    for n in id_cache._CACHE_FILES)
  return {'variant': variant, 'pairs': pairs, 'vocab_size': tok.vocab_size,
          'seconds': round(seconds, 1), 'rss_before_mb': round(before),
          'peak_rss_over_before_mb': round(peak - before),
          'peak_bytes_per_pair': round((peak - before) * MB / pairs, 1),
          'source_ids_per_pair': round(len(arrays[0]) / pairs, 2),
          'target_ids_per_pair': round(len(arrays[1]) / pairs, 2),
          'cache_bytes_per_pair': round(cache_bytes / pairs, 1)}


def prepare_encode(pairs: int, vocab_size: int, tmp: str) -> tuple[str, str]:
  """The sample repeated up to `pairs` lines, and a workdir with its vocabulary."""
  prefix = os.path.join(tmp, 'train')
  for lang in ('en', 'de'):
    with open(f"{common.wmt_sample('train')}.{lang}", 'rb') as f:
      lines = f.read().splitlines(keepends=True)
    with open(f'{prefix}.{lang}', 'wb') as f:
      for i in range(0, pairs, len(lines)):
        f.writelines(lines[:pairs - i])
  workdir = os.path.join(tmp, 'workdir')
  sample = common.wmt_sample('train')
  config = make_config(sample, vocab_size)
  source = sources._files_source('train', sample, config)
  tokenizer.load_or_train(config, workdir, lambda: sources.both_sides(source))
  return prefix, workdir


# ---------------------------------------------------------------------- iterator


def sample_lengths(vocab_size: int, tmp: str) -> np.ndarray:
  """[pairs, 2] (source, target) lengths with EOS of the sample, in its vocabulary."""
  sample = common.wmt_sample('train')
  config = make_config(sample, vocab_size)
  source = sources._files_source('train', sample, config)
  tok = tokenizer.load_or_train(config, tmp, lambda: sources.both_sides(source))
  encoded = id_cache.encode(source.read(), tok)
  return np.stack(encoded.lengths, axis=1)


def memory_mapped(lengths: np.ndarray, folder: str) -> id_cache.Encoded:
  """Offsets of `lengths` and all-zero ids, as memory-mapped files like a real cache."""
  arrays = []
  for side in range(2):
    offsets = np.concatenate([[0], np.cumsum(lengths[:, side], dtype=np.int64)])
    path = os.path.join(folder, f'offsets{side}.npy')
    np.save(path, offsets)
    # A sparse file: its pages are read only where a batch's ids are gathered.
    ids = np.lib.format.open_memmap(os.path.join(folder, f'ids{side}.npy'), 'w+',
                                    np.uint16, (int(offsets[-1]),))
    del ids, offsets
    arrays.append((np.load(os.path.join(folder, f'ids{side}.npy'), mmap_mode='r'),
                   np.load(path, mmap_mode='r')))
  return id_cache.Encoded(ids=(arrays[0][0], arrays[1][0]), offsets=(arrays[0][1], arrays[1][1]))


def iterator_child(pairs: int, vocab_size: int, tmp: str) -> dict[str, Any]:
  sample = sample_lengths(vocab_size, tmp)
  rng = np.random.default_rng(0)
  lengths = sample[rng.integers(0, len(sample), pairs)]
  encoded = memory_mapped(lengths, tmp)
  del lengths
  for offsets in encoded.offsets:  # their pages, as a run's first look at them would
    np.asarray(offsets).sum()
  config = common.get_config('base')  # max_length 256, 25000 tokens a batch
  before = reset_peak()
  start = time.perf_counter()
  kept = batching.length_filter(encoded, config.max_length, 'train')
  train = batching.TrainIterator(encoded, kept, config, num_devices=8, process_index=0,
                                 process_count=1, data_key='benchmark')
  plan = train.plan(0)
  seconds = time.perf_counter() - start
  peak, kept_now = status_mb('VmHWM'), status_mb('VmRSS')
  # No batch timing: first reads of this sparse ids file cost far more than a real cache's.
  return {'benchmark': 'iterator', 'pairs': pairs, 'kept': len(kept),
          'batches_per_epoch': plan.num_batches, 'seconds_to_plan': round(seconds, 2),
          'rss_before_mb': round(before), 'peak_rss_over_before_mb': round(peak - before),
          'peak_bytes_per_pair': round((peak - before) * MB / pairs, 1),
          'kept_bytes_per_pair': round((kept_now - before) * MB / pairs, 1),
          'mapped_offsets_bytes_per_pair': 16}


# -------------------------------------------------------------------------- main


def run_child(*args: str) -> dict[str, Any]:
  """This script in a fresh process: each peak is its own."""
  out = subprocess.run([sys.executable, __file__, *args], check=True, text=True,
                       stdout=subprocess.PIPE)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('what', choices=['encode', 'iterator', 'child_encode', 'child_iterator'])
  parser.add_argument('--pairs', type=int, default=None)
  parser.add_argument('--vocab_size', type=int, default=4000)
  parser.add_argument('--variants', default=','.join(VARIANTS))
  parser.add_argument('--tmp', default=None, help='(internal) working folder')
  parser.add_argument('--variant', default=None, help='(internal)')
  args = parser.parse_args()
  if args.what == 'child_encode':
    prefix, workdir = os.path.join(args.tmp, 'train'), os.path.join(args.tmp, 'workdir')
    print(json.dumps(encode_child(args.variant, prefix, workdir, args.vocab_size)))
  elif args.what == 'child_iterator':
    print(json.dumps(iterator_child(args.pairs, args.vocab_size, args.tmp)))
  elif args.what == 'encode':
    with tempfile.TemporaryDirectory() as tmp:
      prepare_encode(args.pairs or 500_000, args.vocab_size, tmp)
      for variant in args.variants.split(','):
        print(json.dumps(run_child('child_encode', f'--variant={variant}', f'--tmp={tmp}',
                                   f'--vocab_size={args.vocab_size}')), flush=True)
  else:
    with tempfile.TemporaryDirectory() as tmp:
      print(json.dumps(run_child('child_iterator', f'--pairs={args.pairs or 36_000_000}',
                                 f'--tmp={tmp}', f'--vocab_size={args.vocab_size}')))


if __name__ == '__main__':
  main()
