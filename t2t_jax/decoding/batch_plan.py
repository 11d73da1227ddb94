"""The decoding batch plan: which sentences go into which batch, of which shape (§6.1).

Sentences are sorted by length and cut into batches whose shapes come from a fixed set:
source-length buckets (config.decode_bucket_growth: each twice the one before, up to
config.max_decode_input_length) × a row count per bucket (config.decode_tokens_per_batch
padded source tokens, 0: per platform; a multiple of the devices). Short sentences don't
pay for long ones' padding, and the search compiles once per shape met: a handful for any
text. translator.py decodes by this plan; scoring.py scores pairs by it.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import ml_collections
import numpy as np

from t2t_jax.config import rules
from t2t_jax.data import batching

# A call of at most this many sentences decodes in small batches of fixed shapes
# (interactive_shapes), the ones Translator.compile_ahead compiles; --stream_lines' default.
INTERACTIVE_ROWS = 16


def decoding_batches(lengths: Sequence[int], *, tokens_per_batch: int, num_devices: int,
                     bucket_growth: float, max_rows: int = 0, max_length: int = 0,
                     ) -> Iterator[tuple[np.ndarray, int, int]]:
  """(indices, rows, padded length) of each batch, shortest sentences first.

  A bucket of padded length S always uses the same number of rows (tokens_per_batch / S,
  at most max_rows if given, a multiple of num_devices); its last batch is filled up with
  empty rows. With max_rows (a stream's, or a few sentences': small batches), a bucket
  whose sentences fit one row a device gets one row a device, so that one sentence pays for
  one row. The buckets are those up to max_length whatever the longest input: a fixed set
  of shapes (`interactive_shapes` lists those of small batches), each a compilation of the
  search, few with config.decode_bucket_growth's doubling lengths.
  """
  lengths = np.asarray(lengths)
  grid = batching.bucket_lengths(max(int(lengths.max(initial=1)), max_length, 1),
                                 bucket_growth)
  padded = grid[np.searchsorted(grid, lengths)]
  order = np.argsort(lengths, kind='stable')
  for length in np.unique(padded):
    members = order[padded[order] == length]
    per_device = max(tokens_per_batch // int(length) // num_devices, 1)
    if max_rows:  # small batches: no rows beyond what they have
      per_device = 1 if len(members) <= num_devices else min(per_device,
                                                             -(-max_rows // num_devices))
    rows = per_device * num_devices
    for start in range(0, len(members), rows):
      yield members[start:start + rows], rows, int(length)


def batch_shapes(token_ids: Sequence[Sequence[int]], config: ml_collections.ConfigDict,
                 num_devices: int) -> list[tuple[int, int]]:
  """The global (rows, S) of translate_ids's batches for these inputs, in decoding order:
  the shapes its beam search is compiled for."""
  batches = decoding_batches([len(t) for t in token_ids],
                             tokens_per_batch=rules.decode_tokens_of(config),
                             num_devices=num_devices, bucket_growth=config.decode_bucket_growth,
                             max_length=config.max_decode_input_length)
  return [(rows, length) for _, rows, length in batches]


def interactive_shapes(config: ml_collections.ConfigDict, num_devices: int, *, max_rows: int,
                       max_length: int, up_to: int = 0) -> list[tuple[int, int]]:
  """Every global (rows, S) decoding_batches gives with max_rows and max_length, whatever
  the sentences: one row a device, then the most rows, for each bucket up to max_length (or
  only up to the bucket that holds `up_to` sub-words); the likeliest first (one sentence,
  short ones first)."""
  grid = batching.bucket_lengths(max(max_length, 1), config.decode_bucket_growth)
  if up_to:
    grid = grid[:int(np.searchsorted(grid, up_to)) + 1]
  shapes = []
  for count in (1, max_rows + num_devices):  # a bucket's sentences: one, then more than fit
    for length in grid:
      [(_, rows, _), *_] = decoding_batches(
          [int(length)] * count, tokens_per_batch=rules.decode_tokens_of(config),
          num_devices=num_devices, bucket_growth=config.decode_bucket_growth,
          max_rows=max_rows, max_length=max_length)
      shapes.append((rows, int(length)))
  return list(dict.fromkeys(shapes))
