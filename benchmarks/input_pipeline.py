"""Speed and padding of the §5.1 input pipeline on a local parallel corpus.

  python benchmarks/input_pipeline.py [--data=PREFIX] [--epochs=3]

Builds the pipeline in a temporary workdir (SentencePiece training and encoding
are timed separately, as is a restart that reuses both), then draws whole
epochs of ~25000-token batches. The last line printed is one JSON object:
batches_per_s, tokens_per_s (real source + target tokens drawn per second) and
padding_efficiency (real tokens / padded slots): the pipeline should feed the train step
(benchmarks/train_step.py's tokens_per_s) many times over.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import numpy as np

from t2t_jax.data import batching, pipeline, tokenizer


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--data', default=None,
                      help='PREFIX of PREFIX.en and PREFIX.de (default: the WMT sample\'s '
                      'train, from $T2T_WMT_SAMPLE)')
  # A 10k-pair sample cannot support the paper's 37000 pieces.
  parser.add_argument('--vocab_size', type=int, default=8000)
  parser.add_argument('--tokens_per_batch', type=int, default=25000)  # §5.1
  parser.add_argument('--num_devices', type=int, default=1)
  parser.add_argument('--bucket_band', type=int, default=None,
                      help='default: the experiment config')
  parser.add_argument('--epochs', type=int, default=20)
  return parser.parse_args()


def make_config(args: argparse.Namespace):
  config = common.get_config('base')
  config.dataset = 'files'
  config.train_files = os.path.normpath(args.data or common.wmt_sample('train'))
  config.dev_files = config.test_files = ''
  config.vocab_size = args.vocab_size
  config.tokens_per_batch = args.tokens_per_batch
  if args.bucket_band is not None:
    config.bucket_band = args.bucket_band
  return config


def read_both_sides(config) -> Iterator[str]:
  for lang in (config.source_lang, config.target_lang):
    with open(f'{config.train_files}.{lang}', encoding='utf-8') as f:
      yield from (line.rstrip('\n') for line in f)


def draw(train: batching.TrainIterator, num_batches: int) -> dict[str, float]:
  real = slots = 0
  shapes = set()
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(train)
    inputs, targets = batch['inputs'], batch['targets']
    real += np.count_nonzero(inputs) + np.count_nonzero(targets)
    slots += inputs.size + targets.size
    shapes.add(inputs.shape + targets.shape[1:])
  seconds = time.perf_counter() - start
  return {'batches_per_s': num_batches / seconds, 'tokens_per_s': real / seconds,
          'padding_efficiency': real / slots,
          'real_tokens_per_batch': real / num_batches, 'distinct_shapes': len(shapes)}


def main() -> None:
  args = parse_args()
  config = make_config(args)
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    # Trained here, ahead of get_datasets (which then reuses it), to time it alone.
    tokenizer.load_or_train(config, workdir, lambda: read_both_sides(config))
    vocab_s = time.perf_counter() - start
    start = time.perf_counter()
    datasets = pipeline.get_datasets(config, workdir, num_devices=args.num_devices)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    datasets = pipeline.get_datasets(config, workdir, num_devices=args.num_devices)
    restart_s = time.perf_counter() - start
    train = datasets.train
    per_epoch = train.plan(0).num_batches
    result = draw(train, args.epochs * per_epoch)
  result.update({
      'data': config.train_files, 'pairs_kept': len(train.plan(0).order),
      'batches_per_epoch': per_epoch, 'epochs': args.epochs,
      'tokens_per_batch': config.tokens_per_batch, 'num_devices': args.num_devices,
      'bucket_band': config.bucket_band, 'bucket_growth': config.bucket_growth,
      'vocab_size': config.vocab_size, 'setup_vocab_s': vocab_s,
      'setup_encode_s': encode_s, 'restart_setup_s': restart_s})
  common.emit({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()})


if __name__ == '__main__':
  main()
