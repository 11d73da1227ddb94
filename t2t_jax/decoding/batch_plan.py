"""The decoding batch plan: which sentences go into which batch, of which shape (§6.1).

Sentences are sorted by length and cut into batches whose shapes come from a fixed set:
source-length buckets (config.decode_bucket_growth, up to config.max_decode_input_length) ×
a row count per bucket (config.decode_tokens_per_batch padded source tokens, 0: per
platform; a multiple of the devices). Short sentences don't pay for long ones' padding, and
the search compiles once per shape met, a handful for any text. translate_ids runs a search
by it (make_sharded_decoder's), each device on its own rows; scoring.py scores pairs by it.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from t2t_jax.config import rules
from t2t_jax.data import batching
from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.decoding import decode, sampling
from t2t_jax.model.transformer import ModelConfig
from t2t_jax.platform.mesh import AXIS, shard_batch
from t2t_jax.platform.progress import Progress

# A call of at most this many sentences decodes in small batches of fixed shapes
# (interactive_shapes), the ones Translator.compile_ahead compiles; --stream_lines' default.
INTERACTIVE_ROWS = 16


def decoding_batches(lengths: Sequence[int], *, tokens_per_batch: int, num_devices: int,
                     bucket_growth: float, max_rows: int = 0, max_length: int = 0,
                     ) -> Iterator[tuple[np.ndarray, int, int]]:
  """(indices, rows, padded length) of each batch.

  A bucket of padded length S always uses the same number of rows (tokens_per_batch / S,
  at most max_rows if given, a multiple of num_devices); a batch's last rows may be empty.
  Without max_rows (a file), each bucket's sentences are cut into batches, shortest first.
  With max_rows (a few sentences: a stream's lines, a server's requests), the longest
  sentences left go together at their longest's bucket, as many as its rows hold, so that a
  few sentences of several lengths are one search, not one per bucket; sentences that fit one
  row a device get one row a device. The buckets are those up to max_length whatever the
  longest input: a fixed set of shapes (`interactive_shapes` lists those of small batches).
  """
  lengths = np.asarray(lengths)
  grid = batching.bucket_lengths(max(int(lengths.max(initial=1)), max_length, 1),
                                 bucket_growth)
  padded = grid[np.searchsorted(grid, lengths)]
  order = np.argsort(lengths, kind='stable')

  def rows_of(length: int, count: int) -> int:
    per_device = max(tokens_per_batch // length // num_devices, 1)
    if max_rows:  # small batches: no rows beyond what they have
      per_device = 1 if count <= num_devices else min(per_device, -(-max_rows // num_devices))
    return per_device * num_devices

  if max_rows:
    end = len(order)
    while end > 0:  # the longest left, at their longest's bucket
      length = int(padded[order[end - 1]])
      rows = rows_of(length, end)
      yield order[max(end - rows, 0):end], rows, length
      end -= rows
    return
  for length in np.unique(padded):
    members = order[padded[order] == length]
    rows = rows_of(int(length), len(members))
    for start in range(0, len(members), rows):
      yield members[start:start + rows], rows, int(length)


def config_batches(lengths: Sequence[int], config: ml_collections.ConfigDict, num_devices: int,
                   *, max_rows: int = 0, max_length: int = 0,
                   ) -> Iterator[tuple[np.ndarray, int, int]]:
  """decoding_batches by config's settings, max_length 0: config.max_decode_input_length."""
  return decoding_batches(lengths, tokens_per_batch=rules.decode_tokens_of(config),
                          num_devices=num_devices, bucket_growth=config.decode_bucket_growth,
                          max_rows=max_rows,
                          max_length=max_length or config.max_decode_input_length)


def batch_shapes(token_ids: Sequence[Sequence[int]], config: ml_collections.ConfigDict,
                 num_devices: int) -> list[tuple[int, int]]:
  """The global (rows, S) of translate_ids's batches for these inputs, in decoding order:
  the shapes its beam search is compiled for."""
  batches = config_batches([len(t) for t in token_ids], config, num_devices)
  return [(rows, length) for _, rows, length in batches]


def interactive_shapes(config: ml_collections.ConfigDict, num_devices: int, *, max_rows: int,
                       max_length: int, up_to: int = 0) -> list[tuple[int, int]]:
  """Every global (rows, S) decoding_batches gives with max_rows and max_length, whatever the
  sentences: one row a device, then the most rows, for each bucket up to max_length (or up
  to the one that holds `up_to` sub-words); the likeliest (one sentence, short) first."""
  max_length = max(max_length, 1)
  grid = batching.bucket_lengths(max_length, config.decode_bucket_growth)
  if up_to:
    grid = grid[:int(np.searchsorted(grid, up_to)) + 1]
  shapes = []
  for count in (1, max_rows + num_devices):  # a bucket's sentences: one, then more than fit
    for length in grid:
      [(_, rows, _), *_] = config_batches([int(length)] * count, config, num_devices,
                                          max_rows=max_rows, max_length=max_length)
      shapes.append((rows, int(length)))
  return list(dict.fromkeys(shapes))


# (params, src [rows, S], settings: α for beam search, a Sampling to sample) -> (ids, scores)
Decoder = Callable[[Any, jax.Array, Any], tuple[jax.Array, jax.Array]]


class Sampling(NamedTuple):
  """A sampling decoder's settings (beam search's: α), traced: another needs no recompilation."""
  index: Any  # [rows] each row's sentence number in the input, its draws' key (-1: no row)
  temperature: Any  # [] T
  key: Any  # jax.random.PRNGKey(config.sample_seed)


# Samples of a sentence (--n_best with sampling) are rows of its batch, each as large as a
# sentence: more than this would outgrow any decoding batch.
MAX_SAMPLES = 1024


def make_sharded_decoder(model_config: ModelConfig | decode.Ensemble,
                         config: ml_collections.ConfigDict, mesh: Mesh, *,
                         beam_size: int | None = None, n_best: int | None = None,
                         method: str = 'beam', top_k: int | None = None,
                         top_p: float | None = None, vocabulary: Any = None) -> Decoder:
  """(params, src [rows, S], settings) -> (ids [rows, T], scores [rows]), each device on its
  own rows; with n_best=n, ids [rows, n, T] and scores [rows, n].

  method 'beam' (beam_size default config.beam_size) and 'greedy' take α as settings, so
  that another α needs no recompilation; 'sample' takes a Sampling and draws n_best samples
  (top_k, top_p default config.sample_top_k, sample_top_p). model_config and the params may
  be an ensemble's tuples (config.ensemble_weights); `vocabulary`'s banned_ids never come out.
  """
  def banned(sampling: bool) -> tuple[int, ...]:
    return () if vocabulary is None else vocabulary.banned_ids(sampling=sampling)
  weights = rules.ensemble_weights(config) if isinstance(model_config, tuple) else None

  if method == 'sample':
    def draw(params, src, settings):
      return sampling.draw(params, src, settings.index, settings.key, config=model_config,
                           temperature=settings.temperature,
                           top_k=config.sample_top_k if top_k is None else top_k,
                           top_p=config.sample_top_p if top_p is None else top_p,
                           n_samples=n_best, extra_length=config.decode_extra_length,
                           banned_ids=banned(True), weights=weights)
    return shard_rows(draw, mesh, Sampling(P(AXIS), P(), P()))  # each device its rows' numbers
  beam_size = 1 if method == 'greedy' else beam_size or config.beam_size

  def search(params, src, alpha):
    beams = decode.search(params, src, config=model_config, beam_size=beam_size, alpha=alpha,
                          extra_length=config.decode_extra_length, n_best=n_best,
                          banned_ids=banned(False), weights=weights)
    return beams.finished_seq[..., 1:], beams.finished_score
  return shard_rows(search, mesh)


def shard_rows(search: Decoder, mesh: Mesh, settings_specs: Any = None) -> Decoder:
  """`search(params, src, settings) -> (ids, scores)` jitted with each device on its own
  rows of src (params replicated, settings as `settings_specs` says; None: replicated, α)."""
  # Each device's search stops when its own sentences are done: nothing to communicate.
  return jax.jit(jax.shard_map(search, mesh=mesh, in_specs=(P(), P(AXIS), settings_specs or P()),
                               out_specs=(P(AXIS), P(AXIS)), check_vma=False))


def translate_ids(decoder: Decoder, params: Any, token_ids: Sequence[Sequence[int]],
                  config: ml_collections.ConfigDict, mesh: Mesh, *,
                  alpha: float | None = None, sampling: Sampling | None = None,
                  max_rows: int = 0, max_length: int = 0, show_progress: bool = True,
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Output ids (up to EOS) and scores for each input in `token_ids`, in input order: per
  input, ids [T] and a score [] (n-best decoders: [n, T] and [n]).

  alpha defaults to config.beam_alpha; a sampling decoder takes `sampling` instead, its
  index [len(token_ids)] each input's number. max_rows and max_length: config_batches's.
  Process 0 logs the sentences done, the rate and the ETA (progress.py).
  """
  alpha = np.float32(config.beam_alpha if alpha is None else alpha)
  outputs: list[np.ndarray] = [np.zeros(0, np.int32)] * len(token_ids)
  scores: list[np.ndarray] = [np.zeros((), np.float32)] * len(token_ids)
  batches = list(config_batches([len(t) for t in token_ids], config, mesh.size,
                                max_rows=max_rows, max_length=max_length))
  # The ETA follows a batch's rows (empty ones too) times its most steps, not the sentences,
  # which would promise too early an end: short ones go first.
  cost = lambda rows, length: rows * (length + config.decode_extra_length)  # noqa: E731
  with Progress('Translating', len(token_ids), 'sentences',
                work=sum(cost(rows, length) for _, rows, length in batches),
                enabled=show_progress and jax.process_index() == 0) as bar:
    for indices, rows, length in batches:
      ids, score = _decode_batch(decoder, params, token_ids, indices, rows, length,
                                 alpha if sampling is None else sampling, mesh)
      for r, i in enumerate(indices):
        outputs[i], scores[i] = ids[r], score[r]
      bar.update(len(indices), work=cost(rows, length))
  return outputs, scores


def _decode_batch(decoder: Decoder, params: Any, token_ids: Sequence[Sequence[int]],
                  indices: np.ndarray, rows: int, length: int, settings: Any, mesh: Mesh,
                  ) -> tuple[np.ndarray, np.ndarray]:
  """One batch: the inputs `indices` in the first rows of a [rows, length] source, the rest
  empty (a Sampling's row number -1); each process feeds its own share of the rows, and all
  get every row's output back."""
  src = np.full((rows, length), PAD_ID, np.int32)
  for r, i in enumerate(indices):
    src[r, :len(token_ids[i])] = token_ids[i]
  mine = process_rows(rows)
  if isinstance(settings, Sampling):  # the rows' numbers, split over devices as src is
    index = np.full(rows, -1, np.int32)
    index[:len(indices)] = np.asarray(settings.index)[indices]
    settings = settings._replace(index=shard_batch({'index': index[mine]}, mesh)['index'])
  ids, scores = decoder(params, shard_batch({'src': src[mine]}, mesh)['src'], settings)
  return gather_rows(ids), gather_rows(scores)


def process_rows(rows: int) -> slice:
  """This process's share of a batch's rows: each feeds its own (gather_rows: all, to each)."""
  share = rows // jax.process_count()
  return slice(share * jax.process_index(), share * (jax.process_index() + 1))


def gather_rows(x: jax.Array) -> np.ndarray:
  """Every process's rows of x, on each."""
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def encode_inputs(sentences: Sequence[str], tokenizer: Any, max_input_length: int, *,
                  first_line: int = 1) -> tuple[list[int], list[list[int]]]:
  """(indices of the non-empty sentences, their ids): an empty (or all-space) line is not
  decoded; an input over `max_input_length` sub-words is truncated, with a warning naming
  its line (first_line: the number of sentences[0])."""
  nonempty = [i for i, s in enumerate(sentences) if s.strip()]
  encoded = tokenizer.encode_batch([sentences[i] for i in nonempty])
  for i, ids in zip(nonempty, encoded, strict=True):
    if len(ids) > max_input_length:
      logging.warning('Input line %d has %d sub-words; decoding its first %d.', first_line + i,
                      len(ids), max_input_length)
      ids[max_input_length - 1:] = ids[-1:]  # keep the EOS
  return nonempty, encoded


# Every character str.splitlines() breaks at: \n \r \v \f FS GS RS NEL LS PS.
_LINE_BREAKS = re.compile('[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]')


def one_line(text: str) -> str:
  """`text` with line breaks made spaces, so that output line i belongs to input line i: a
  hypothesis can hold one (byte-fallback pieces decode to any character), a reference too."""
  return _LINE_BREAKS.sub(' ', text)


def max_input_length(model_config: ModelConfig | decode.Ensemble,
                     config: ml_collections.ConfigDict) -> int:
  """Sub-words of an input decoded, EOS included, longer ones truncated (encode_inputs):
  learned positions' max_len must hold input + extra outputs, in every model."""
  return min([max(config.max_decode_input_length, 1),
              *(m.max_len - config.decode_extra_length for m in decode.members(model_config)
                if m.positional == 'learned')])


def translate(decoder: Decoder, params: Any, sentences: Sequence[str], tokenizer: Any,
              config: ml_collections.ConfigDict, mesh: Mesh, *, max_input_length: int,
              alpha: float | None = None) -> list[str]:
  """Detokenized translations of raw sentences, in input order (the single best of a
  decoder without n_best). Empty lines stay empty; long ones are truncated (encode_inputs)."""
  nonempty, inputs = encode_inputs(sentences, tokenizer, max_input_length)
  outputs, _ = translate_ids(decoder, params, inputs, config, mesh, alpha=alpha)
  translations = [''] * len(sentences)
  for i, ids in zip(nonempty, outputs, strict=True):
    translations[i] = one_line(tokenizer.decode(ids))
  return translations
