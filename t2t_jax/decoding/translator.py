"""From a trained run to translations (§6.1): the Python API, which `--mode=translate` runs
(translate_command.py: files and streams).

    from t2t_jax import Translator
    tr = Translator.from_workdir('runs/demo')
    tr.translate(['A sentence.', 'Another one.'])            # -> ['Ein Satz.', ...]
    tr.translate(['A sentence.'], beam_size=8, n_best=3)     # -> [[Hypothesis(text, score)] * 3]
    tr.translate(['A sentence.'], method='sample', seed=1)   # a sample (sampling.py)

Sentences are encoded, sorted by length and cut into decoding batches whose shapes come
from a fixed set (source-length buckets × a row count per bucket), so short sentences
don't pay for long ones' padding and beam search compiles a bounded number of times.
Each device decodes its own rows (shard_map, no communication); outputs return to input
order. A call of a few sentences (a stream's batch) decodes in small batches of fixed
shapes instead (interactive_shapes), which `compile_ahead` compiles.

config.decode_method chooses the search: 'beam' (§6.1), 'greedy' (beam search with one beam)
or 'sample' (sampling.py: config.sample_temperature, sample_top_k, sample_seed; a sentence's
draws are keyed by its number in the input). config.ensemble adds other runs of the same
vocabulary and languages ('DIR[:STEP],...'): every search then runs over the mean of the
models' log-probabilities (decode.py, "Ensembles"), weighted by config.ensemble_weights
if given.

A hypothesis's score is the beam search's: log P(Y|X) / lp(Y), lp(Y) = ((5 + |Y|) / 6)^α,
|Y| counting the EOS (decode.py); a sample's is log P(Y|X), without lp (sampling.py). With
an ensemble, log P is the (weighted) mean of the models'. An empty (or all-space) input
line is not decoded: its translation is the empty line, with score 0.0.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from t2t_jax.config import recorded_run, rules
from t2t_jax.data import pipeline
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.decoding import decode, sampling, scoring
from t2t_jax.decoding.batch_plan import (
  INTERACTIVE_ROWS,
  batch_shapes,
  decoding_batches,
  interactive_shapes,
)
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import errors, xla
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.platform.mesh import AXIS, make_mesh, replicated, shard_batch
from t2t_jax.platform.progress import Progress
from t2t_jax.training import ahead, checkpoints

# (params, src [rows, S], settings: α for beam search, a Sampling to sample) -> (ids, scores)
Decoder = Callable[[Any, jax.Array, Any], tuple[jax.Array, jax.Array]]
METHODS = rules.DECODE_METHODS  # config.decode_method's choices


class Hypothesis(NamedTuple):
  """One translation of an n-best list: its text and its score."""
  text: str
  score: float  # beam search: log P(Y|X) / lp(Y), §6.1; a sample: log P(Y|X) (higher: better)


class Sampling(NamedTuple):
  """A sampling decoder's settings, its third argument (beam search's is α): traced, so
  another temperature or seed needs no recompilation."""
  index: Any  # [rows] each row's sentence number in the input, its draws' key (-1: no row)
  temperature: Any  # [] T
  key: Any  # jax.random.PRNGKey(config.sample_seed)


# Each device gets the numbers of its own rows of src; the rest is replicated.
SAMPLING_SPECS = Sampling(P(AXIS), P(), P())
# Samples of a sentence (--n_best with sampling) are rows of its decoding batch, each as
# large as a sentence of its own: more than this would outgrow any decoding batch.
MAX_SAMPLES = 1024


def make_sharded_decoder(model_config: ModelConfig | decode.Ensemble,
                         config: ml_collections.ConfigDict, mesh: Mesh, *,
                         beam_size: int | None = None, n_best: int | None = None,
                         method: str = 'beam', top_k: int | None = None,
                         top_p: float | None = None, vocabulary: Any = None) -> Decoder:
  """(params, src [rows, S], settings) -> (ids [rows, T], scores [rows]), each device on its
  own rows; with n_best=n, ids [rows, n, T] and scores [rows, n].

  method 'beam' (beam_size defaults to config.beam_size) and 'greedy' (one beam) take α as
  settings, an argument, not a constant: another α needs no recompilation. 'sample' takes a
  Sampling and draws n_best samples (top_k and top_p default to config.sample_top_k and
  sample_top_p). model_config and the params may be an ensemble's tuples (decode.search,
  weighted by config.ensemble_weights). `vocabulary`'s banned_ids (pieces that decode to no
  text) are never emitted; None bans PAD alone.
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
    return shard_rows(draw, mesh, SAMPLING_SPECS)
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
  # Each device's beam search stops when its own sentences are done: no collectives, and
  # no replication to check.
  settings_specs = P() if settings_specs is None else settings_specs
  sharded = jax.shard_map(search, mesh=mesh, in_specs=(P(), P(AXIS), settings_specs),
                          out_specs=(P(AXIS), P(AXIS)), check_vma=False)
  return jax.jit(sharded)


def translate_ids(decoder: Decoder, params: Any, token_ids: Sequence[Sequence[int]],
                  config: ml_collections.ConfigDict, mesh: Mesh, *,
                  alpha: float | None = None, sampling: Sampling | None = None,
                  max_rows: int = 0, max_length: int = 0, show_progress: bool = True,
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Output ids (up to EOS) and scores for each input in `token_ids`, in input order: per
  input, ids [T] and a score [] (n-best decoders: [n, T] and [n]).

  alpha defaults to config.beam_alpha; a sampling decoder takes `sampling` instead, its
  index [len(token_ids)] each input's number. max_rows: small batches; max_length: the
  longest bucket (default config.max_decode_input_length; decoding_batches). Process 0
  logs the sentences done, the rate and the ETA (progress.py).
  """
  alpha = np.float32(config.beam_alpha if alpha is None else alpha)
  outputs: list[np.ndarray] = [np.zeros(0, np.int32)] * len(token_ids)
  scores: list[np.ndarray] = [np.zeros((), np.float32)] * len(token_ids)
  batches = list(decoding_batches(
      [len(t) for t in token_ids], tokens_per_batch=rules.decode_tokens_of(config),
      num_devices=mesh.size, bucket_growth=config.decode_bucket_growth, max_rows=max_rows,
      max_length=max_length or config.max_decode_input_length))
  # A batch's cost: its rows (empty ones too) times the most steps its beam search may take.
  # The ETA follows that, not the sentences: short ones go first, and a sentence count would
  # promise too early an end.
  cost = lambda rows, length: rows * (length + config.decode_extra_length)  # noqa: E731
  with Progress('Translating', len(token_ids), 'sentences',
                work=sum(cost(rows, length) for _, rows, length in batches),
                enabled=show_progress and jax.process_index() == 0) as bar:
    for indices, rows, length in batches:
      settings = alpha if sampling is None else sampling._replace(
          index=_row_numbers(sampling.index, indices, rows))
      ids, score = _decode_batch(decoder, params, [token_ids[i] for i in indices], rows,
                                 length, settings, mesh)
      for r, i in enumerate(indices):
        outputs[i], scores[i] = ids[r], score[r]
      bar.update(len(indices), work=cost(rows, length))
  return outputs, scores


def _row_numbers(numbers: Sequence[int], indices: np.ndarray, rows: int) -> np.ndarray:
  """[rows] the numbers of a batch's inputs (`indices` into `numbers`), -1 for empty rows."""
  index = np.full(rows, -1, np.int32)
  index[:len(indices)] = np.asarray(numbers)[indices]
  return index


def _decode_batch(decoder: Decoder, params: Any, token_ids: Sequence[Sequence[int]], rows: int,
                  length: int, settings: Any, mesh: Mesh) -> tuple[np.ndarray, np.ndarray]:
  """One batch: `token_ids` in the first rows of a [rows, length] source, the rest empty;
  each process feeds its own share of the rows, and all get every row's output back."""
  src = np.full((rows, length), PAD_ID, np.int32)
  for r, ids in enumerate(token_ids):
    src[r, :len(ids)] = ids
  share = rows // jax.process_count()
  mine = slice(share * jax.process_index(), share * (jax.process_index() + 1))
  if isinstance(settings, Sampling):  # the rows' numbers, split over devices as src is
    settings = settings._replace(index=shard_batch({'index': settings.index[mine]},
                                                   mesh)['index'])
  ids, scores = decoder(params, shard_batch({'src': src[mine]}, mesh)['src'], settings)
  return _gather_rows(ids), _gather_rows(scores)


def _gather_rows(x: jax.Array) -> np.ndarray:
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
  """`text` with line breaks made spaces: output line i always belongs to input line i.

  A hypothesis can contain one (byte-fallback pieces decode to any character), and a
  reference file can too; written out, it would shift every later line.
  """
  return _LINE_BREAKS.sub(' ', text)


def max_input_length(model_config: ModelConfig | decode.Ensemble,
                     config: ml_collections.ConfigDict) -> int:
  """Sub-words of an input decoded, EOS included; longer ones are truncated (encode_inputs).
  Learned positions end at max_len, which must also hold input + extra outputs (in every
  model of an ensemble)."""
  length = max(config.max_decode_input_length, 1)
  for member in decode.members(model_config):
    if member.positional == 'learned':
      length = min(length, member.max_len - config.decode_extra_length)
  return length


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


class Translator:
  """A trained run, loaded once for decoding: config, tokenizer, parameters, mesh, and a
  compiled decoder per (method, beam size, n-best, top-k) asked for.

  The parameters are config.decode_params ('auto': averaged/ if there, else checkpoints/)
  at config.restore_step (0: the newest). config.ensemble's runs (`ensemble`, each a Member)
  decode together with them as one model (`decoding_params`, `decoding_config`). `mode` is
  the --mode the config is checked for (rules.validate): 'translate', 'eval' or
  'attention'. `from_workdir` builds one from the config the run recorded.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, mode: str = 'translate'):
    self.config = config
    rules.validate(config, mode)
    # The command line's cache too: what one process compiled, the next one loads.
    xla.enable_compilation_cache(config.compilation_cache_dir)
    self.model_config = ModelConfig.from_config(config)
    self.mesh = make_mesh()
    self.tokenizer = pipeline.load_tokenizer(config, workdir)
    loaded = checkpoints.load_params(workdir, which=config.decode_params,
                                     step=config.restore_step)
    self.source, self.kind, self.step = loaded.source, loaded.kind, loaded.step
    # The checkpoints behind the parameters (an average's, as recorded; None if unrecorded).
    self.covers = (checkpoints.averaged_steps(workdir, loaded.step)
                   if loaded.kind == 'averaged' else [loaded.step])
    check_params_match(loaded.params, config, self.model_config, self.source, workdir)
    self.params = jax.device_put(loaded.params, replicated(self.mesh))
    self.ensemble = [m._replace(params=jax.device_put(m.params, replicated(self.mesh)))
                     for m in load_ensemble(config, workdir, self.tokenizer)]
    self._decoders: dict[tuple, Decoder] = {}
    self._scorer: scoring.Scorer | None = None  # made on score()'s first call
    self._pools: list[Any] = []  # compile_ahead's background threads, until close()
    with_others = ''.join(f' + {m.workdir}/{m.source}' for m in self.ensemble)
    logging.info('Decoding with the parameters of %s%s on %d device%s (%s).', self.source,
                 with_others, self.mesh.size, 's' if self.mesh.size > 1 else '',
                 describe_method(config))

  @classmethod
  def from_workdir(cls, workdir: str, overrides: Mapping[str, Any] | None = None) -> Translator:
    """The run trained in `workdir`, with the config it recorded (DIR/config.json).

    `overrides` ({'decode_params': 'checkpoint', 'model.dtype': 'bfloat16'}, or nested:
    {'model': {'dtype': 'bfloat16'}}) change keys of that config as --config.KEY=VALUE
    would; one that contradicts the trained model (recorded_run.TRAINED_KEYS) is refused
    with an errors.UserError naming it.
    """
    if overrides is not None and not isinstance(overrides, Mapping):
      raise errors.UserError(f'overrides: a dict of config keys, got {type(overrides).__name__}')
    workdir_lib.check_local(workdir)
    where = f'{workdir.rstrip("/")}/{workdir_lib.CONFIG}'
    recorded = workdir_lib.load_config(workdir)
    if recorded is None:
      raise errors.UserError(f'{where}: no recorded run there (training records it)')
    pairs = [f'config.{key}={value}' for key, value in _flat(overrides or {})]
    return cls(recorded_run.from_recorded(recorded, pairs, where), workdir)

  @property
  def decoding_params(self) -> Any:
    """The parameters the decoders take: this run's, or a tuple of the ensemble's."""
    if not self.ensemble:
      return self.params
    return (self.params, *(m.params for m in self.ensemble))

  @property
  def decoding_config(self) -> ModelConfig | decode.Ensemble:
    """The model the decoders run: this run's, or a tuple of the ensemble's."""
    if not self.ensemble:
      return self.model_config
    return (self.model_config, *(m.model_config for m in self.ensemble))

  @property
  def max_input_length(self) -> int:
    return max_input_length(self.decoding_config, self.config)

  @property
  def ahead_length(self) -> int:
    """The longest input compile_ahead prepares for: the longest pair training kept
    (config.max_length) with the search's own margin (config.decode_extra_length), at most
    max_input_length. Longer inputs are rare, and compile when met."""
    return min(self.max_input_length, self.config.max_length + self.config.decode_extra_length)

  def decoder(self, beam_size: int | None = None, n_best: int | None = None, *,
              method: str | None = None, top_k: int | None = None,
              top_p: float | None = None) -> Decoder:
    """The sharded search of `method` (default config.decode_method) for this beam size
    (default config.beam_size; greedy: 1) or sampling's top_k and top_p (default
    config.sample_top_k and sample_top_p), and n-best, compiled once per input shape and
    kept."""
    key = self._decoder_key(beam_size, n_best, method, top_k, top_p)
    if key not in self._decoders:
      self._decoders[key] = make_sharded_decoder(
          self.decoding_config, self.config, self.mesh, method=key[0], beam_size=key[1],
          n_best=n_best, top_k=key[3], top_p=key[4], vocabulary=self.tokenizer)
    return self._decoders[key]

  def _decoder_key(self, beam_size: int | None, n_best: int | None, method: str | None,
                   top_k: int | None, top_p: float | None = None) -> tuple:
    """(method, beam size, n-best, top-k, top-p) of a decoder, the defaults resolved."""
    method = method or self.config.decode_method
    if method == 'sample':
      return (method, None, n_best, self.config.sample_top_k if top_k is None else top_k,
              self.config.sample_top_p if top_p is None else float(top_p))
    return (method, 1 if method == 'greedy' else beam_size or self.config.beam_size, n_best,
            None, None)

  def compile_ahead(self, *, max_rows: int = INTERACTIVE_ROWS, threads: int | None = None,
                    wait: bool = True, method: str | None = None, beam_size: int | None = None,
                    n_best: int | None = None, top_k: int | None = None,
                    top_p: float | None = None, max_length: int | None = None,
                    ) -> ahead.Precompiled:
    """Compiles the decoder of these settings (translate's arguments) for every shape a
    call of at most `max_rows` sentences of at most `max_length` sub-words (default:
    ahead_length) can meet (interactive_shapes: each length bucket, with one row a device
    and with max_rows), the likeliest first, on `threads` threads (default: a quarter of the
    cores, at least 1), so that such calls, and streams of at most max_rows lines a batch,
    never wait for a compilation. The log shows its progress and when it is done.

    wait=True returns when all are compiled; wait=False at once, compiling in the
    background: a call that needs a shape still queued compiles it then, and close() (or
    leaving `with translator:`) drops the queue. The compilation cache keeps them for the
    next process (config.compilation_cache_dir), whose compile_ahead then loads them.
    """
    check_search(method or self.config.decode_method, beam_size, n_best, self.config)
    for name, value in (('max_rows', max_rows), ('max_length', max_length)):
      if value is not None and not rules.POSITIVE_INT.test(value):
        raise errors.UserError(f'{name}={value!r}: must be a positive integer')
    key = self._decoder_key(beam_size, n_best, method, top_k, top_p)
    decoder = self.decoder(beam_size, n_best, method=method, top_k=top_k, top_p=top_p)
    if isinstance(decoder, ahead.Precompiled):
      return decoder
    shapes = interactive_shapes(self.config, self.mesh.size, max_rows=max_rows,
                                max_length=self.max_input_length,
                                up_to=min(max_length or self.ahead_length, self.max_input_length))
    pool = ahead.make_pool(threads or max(ahead.default_threads(), 1))
    self._pools.append(pool)
    settings = self._abstract_sampling if key[0] == 'sample' else None
    self._decoders[key] = ahead.searches(decoder, self.decoding_params, shapes, self.mesh,
                                         pool=pool, name=f'{key[0]} search', settings=settings)
    if wait:
      pool.shutdown(wait=True)
      self._pools.remove(pool)
    return self._decoders[key]

  def _abstract_sampling(self, rows: int) -> Sampling:
    """A sampling decoder's settings for a batch of `rows`, as shapes (compile_ahead)."""
    return Sampling(index=jax.ShapeDtypeStruct((rows,), np.int32,
                                               sharding=NamedSharding(self.mesh, P(AXIS))),
                    temperature=jax.ShapeDtypeStruct((), np.float32),
                    key=jax.ShapeDtypeStruct((2,), np.uint32))

  def close(self) -> None:
    """Drops the compilations compile_ahead has queued and not started."""
    for pool in self._pools:
      pool.shutdown(wait=False, cancel_futures=True)
    self._pools.clear()

  def __enter__(self) -> Translator:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def translate(self, sentences: Sequence[str] | str, *, method: str | None = None,
                beam_size: int | None = None, alpha: float | None = None,
                n_best: int | None = None, temperature: float | None = None,
                top_k: int | None = None, top_p: float | None = None,
                seed: int | None = None, first_line: int = 1,
                max_rows: int = 0, show_progress: bool = True,
                ) -> list[str] | list[list[Hypothesis]] | str | list[Hypothesis]:
    """Translations of `sentences`, in order, by beam search (§6.1), greedy decoding or
    sampling (`method`: 'beam', 'greedy' or 'sample'; default config.decode_method).

    Each is a str; with n_best=n, a list of up to n Hypothesis, best first: the n best of
    the search (1 ≤ n ≤ beam size; greedy: 1), or n samples. beam_size and alpha default to
    config.beam_size and config.beam_alpha (4 and 0.6, §6.1); temperature, top_k, top_p and
    seed to config.sample_temperature, sample_top_k, sample_top_p and sample_seed. One str in
    gives one translation (or list) out. first_line numbers the sentences in warnings and keys their
    samples (sentence i: first_line - 1 + i). max_rows caps a decoding batch's rows and
    makes its shape one of interactive_shapes' (streams); a call of at most
    INTERACTIVE_ROWS sentences does so by itself, so that after compile_ahead none waits
    for a compilation.
    """
    single = isinstance(sentences, str)
    sentences = [sentences] if single else sentences
    method = method or self.config.decode_method
    check_sentences(sentences)
    check_search(method, beam_size, n_best, self.config)
    check_settings(method, alpha=alpha, temperature=temperature, top_k=top_k, top_p=top_p,
                   seed=seed, max_rows=max_rows)
    nonempty, inputs = encode_inputs(sentences, self.tokenizer, self.max_input_length,
                                     first_line=first_line)
    draws = (self._sampling([first_line - 1 + i for i in nonempty], temperature, top_k, seed,
                            top_p)
             if method == 'sample' else None)
    if not max_rows and len(inputs) <= INTERACTIVE_ROWS:
      max_rows = INTERACTIVE_ROWS  # a few sentences: small batches, not 4096 tokens' worth
    decoder = self.decoder(beam_size, n_best, method=method, top_k=top_k, top_p=top_p)
    with self._shapes_ahead(decoder, [] if max_rows else inputs, method) as decoder:
      outputs, scores = translate_ids(
          decoder, self.decoding_params, inputs, self.config, self.mesh, alpha=alpha,
          sampling=draws, max_rows=max_rows,
          max_length=self.max_input_length if max_rows else 0, show_progress=show_progress)
    results = self._results(len(sentences), nonempty, outputs, scores, n_best)
    return results[0] if single else results

  @contextlib.contextmanager
  def _shapes_ahead(self, decoder: Decoder, inputs: Sequence[Sequence[int]],
                    method: str) -> Iterator[Decoder]:
    """`decoder` compiled ahead for the batch shapes of `inputs` (batch_shapes), as the
    trainer does for dev BLEU, with config.compile_ahead on a host with cores to spare
    (ahead.default_threads): each length bucket is a compilation of the search, and on an
    accelerator they, not the decoding, take most of an evaluation's time. Elsewhere
    `decoder` as it is."""
    threads = ahead.default_threads() if self.config.compile_ahead else 0
    shapes = batch_shapes(inputs, self.config, self.mesh.size) if threads else []
    if len(set(shapes)) < 2 or isinstance(decoder, ahead.Precompiled):
      yield decoder
      return
    pool = ahead.make_pool(threads)
    with ahead.cancelled_on_exit(pool):
      yield ahead.searches(decoder, self.decoding_params, shapes, self.mesh, pool=pool,
                           name=f'{method} search',
                           settings=self._abstract_sampling if method == 'sample' else None)

  def _sampling(self, numbers: list[int], temperature: float | None, top_k: int | None,
                seed: int | None, top_p: float | None = None) -> Sampling:
    """The settings of a sampling decoder for inputs of these `numbers`, each argument
    checked as its config key is (None: the config's)."""
    config = self.config
    temperature = config.sample_temperature if temperature is None else temperature
    seed = config.sample_seed if seed is None else seed
    for name, key, value in (('temperature', 'sample_temperature', temperature),
                             ('top_k', 'sample_top_k', top_k), ('seed', 'sample_seed', seed),
                             ('top_p', 'sample_top_p', top_p)):
      rule = rules.RULES[key]
      if value is not None and not rule.test(value):
        raise errors.UserError(f'{name}={value!r}: must be {rule.allowed} (as config.{key})')
    if top_k is not None and top_k > config.vocab_size:
      raise errors.UserError(f'top_k={top_k}: must be ≤ config.vocab_size ({config.vocab_size})')
    # Host arrays, as α is: every process of a multi-host run passes the same values.
    return Sampling(index=np.asarray(numbers, np.int32), temperature=np.float32(temperature),
                    key=np.asarray(jax.random.PRNGKey(seed)))

  def _results(self, count: int, nonempty: list[int], outputs: list[np.ndarray],
               scores: list[np.ndarray], n_best: int | None,
               ) -> list[str] | list[list[Hypothesis]]:
    """The texts (n_best None), else the Hypothesis lists, of `count` sentences of which
    those at `nonempty` were decoded."""
    if n_best is None:
      texts = [''] * count
      for i, ids in zip(nonempty, outputs, strict=True):
        texts[i] = one_line(self.tokenizer.decode(ids))
      return texts
    lists = [[Hypothesis('', 0.0)] for _ in range(count)]  # an empty line: the empty one
    for i, ids, score in zip(nonempty, outputs, scores, strict=True):
      # A slot that no hypothesis finished into holds -inf (decode.beam_search): dropped.
      lists[i] = [Hypothesis(one_line(self.tokenizer.decode(row)), float(s))
                  for row, s in zip(ids, score, strict=True) if np.isfinite(s)]
    return lists

  def score(self, sources: Sequence[str], targets: Sequence[str], *,
            alpha: float | None = None) -> list[scoring.Scored]:
    """log P(target | source) of each given pair, as beam search scores an output
    (scoring.py): a Scored each, in order, with `score` = log P / lp(Y) (α: alpha, default
    config.beam_alpha), `logprob` = log P and each target token's log-probability. A
    source over max_input_length sub-words is truncated, as translate truncates it."""
    check_sentences(sources, 'sources')
    check_sentences(targets, 'targets')
    if len(sources) != len(targets):
      raise errors.UserError(f'sources and targets: {len(sources)} and {len(targets)} '
                             'sentences; give one target for each source')
    check_settings('beam', alpha=alpha)
    nonempty, encoded = encode_inputs(sources, self.tokenizer, self.max_input_length)
    src = [[EOS_ID]] * len(sources)  # an empty source: EOS alone
    for i, ids in zip(nonempty, encoded, strict=True):
      src[i] = ids
    if self._scorer is None:
      self._scorer = scoring.make_scorer(
          self.decoding_config, self.mesh,
          weights=rules.ensemble_weights(self.config) if self.ensemble else None)
    return scoring.score_ids(self._scorer, self.decoding_params, src,
                             self.tokenizer.encode_batch(list(targets)), self.config, self.mesh,
                             alpha=self.config.beam_alpha if alpha is None else alpha)

  def __call__(self, sentences: Sequence[str]) -> list[str]:
    return self.translate(sentences)


def _flat(overrides: Mapping[str, Any], prefix: str = '') -> Iterator[tuple[str, Any]]:
  """('model.dtype', value) pairs of nested overrides, as --config.model.dtype names them."""
  for key, value in overrides.items():
    if isinstance(value, Mapping):
      yield from _flat(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def describe_method(config: ml_collections.ConfigDict) -> str:
  """config's decoding in words, for logs: 'beam 4, alpha 0.60', 'greedy (beam 1), alpha
  0.60' or 'sampling, temperature 1, top-k all, seed 0'."""
  if config.decode_method == 'sample':
    return (f'sampling, temperature {config.sample_temperature:g}, top-k '
            f'{config.sample_top_k or "all"}, top-p {config.sample_top_p:g}, seed '
            f'{config.sample_seed}')
  if config.decode_method == 'greedy':
    return f'greedy (beam 1), alpha {config.beam_alpha:.2f}'
  return f'beam {config.beam_size}, alpha {config.beam_alpha:.2f}'


def check_sentences(sentences: Any, name: str = 'sentences') -> None:
  """A str or a sequence of str (errors.UserError naming what was given)."""
  if isinstance(sentences, (bytes, bytearray)) or not isinstance(sentences, Sequence):
    raise errors.UserError(f'{name}: a str or a list of str, got {type(sentences).__name__}')
  for i, sentence in enumerate(sentences):
    if not isinstance(sentence, str):
      raise errors.UserError(f'{name}[{i}]: a str, got {type(sentence).__name__}')


def check_settings(method: str, *, alpha: Any = None, temperature: Any = None, top_k: Any = None,
                   top_p: Any = None, seed: Any = None, max_rows: Any = 0) -> None:
  """The Python API's search settings: alpha a number ≥ 0 (as config.beam_alpha), sampling's
  settings only when sampling (never silently ignored), max_rows ≥ 0 (0: no cap)."""
  if alpha is not None and not rules.RULES['beam_alpha'].test(alpha):
    raise errors.UserError(f'alpha={alpha!r}: must be {rules.RULES["beam_alpha"].allowed} '
                           '(as config.beam_alpha)')
  if method != 'sample':
    for name, value in (('temperature', temperature), ('top_k', top_k), ('top_p', top_p),
                        ('seed', seed)):
      if value is not None:
        raise errors.UserError(f"{name}={value!r}: only sampling (method='sample') has it; "
                               f'method={method!r} would ignore it')
  if not rules.int_at_least(0).test(max_rows):
    raise errors.UserError(f'max_rows={max_rows!r}: must be an integer ≥ 0 (0: no cap)')


def check_search(method: Any, beam_size: Any, n_best: Any,
                 config: ml_collections.ConfigDict) -> None:
  """The Python API's method, beam_size and n_best (errors.UserError naming the argument)."""
  if method not in METHODS:
    raise errors.UserError(f'method={method!r}: must be one of {METHODS}')
  for name, value in (('beam_size', beam_size), ('n_best', n_best)):
    if value is not None and not rules.POSITIVE_INT.test(value):
      raise errors.UserError(f'{name}={value!r}: must be a positive integer (or None)')
  if method == 'greedy' and beam_size not in (None, 1):
    raise errors.UserError(f'beam_size={beam_size}: greedy decoding is beam search with one '
                           "beam; use method='beam' for a wider one")
  if n_best is not None and n_best > n_best_bound(method, beam_size, config):
    raise errors.UserError(f'n_best={n_best}: {n_best_limit(method, beam_size, config)}')


def n_best_bound(method: str, beam_size: int | None, config: ml_collections.ConfigDict) -> int:
  """The most hypotheses a search gives a sentence for n-best: its beam (greedy decoding:
  one), or MAX_SAMPLES samples."""
  if method == 'sample':
    return MAX_SAMPLES
  return 1 if method == 'greedy' else beam_size or config.beam_size


def n_best_limit(method: str, beam_size: int | None, config: ml_collections.ConfigDict) -> str:
  """The bound on n-best in words, for an error message."""
  most = n_best_bound(method, beam_size, config)
  if method == 'greedy':
    return 'must be 1: greedy decoding keeps one hypothesis (beam search with one beam)'
  if method == 'sample':
    return (f'must be between 1 and {most} samples a sentence (each is a row of its decoding '
            'batch)')
  return f'must be between 1 and the beam size ({most}; config.beam_size)'


def check_params_match(params: Any, config: ml_collections.ConfigDict,
                        model_config: ModelConfig, source: str, workdir: str) -> None:
  """A checkpoint from another config fails here with the parameter named, not in XLA."""
  dummy = np.ones((1, 1), np.int32)
  expected = jax.eval_shape(lambda: Transformer(model_config).init(
      jax.random.PRNGKey(0), dummy, dummy)['params'])
  differences = checkpoints.shape_differences(checkpoints.shapes(params),
                                              checkpoints.shapes(expected))
  if differences:
    recorded = workdir_lib.load_config(workdir)
    changes = (workdir_lib.config_differences(recorded, workdir_lib.config_dict(config))
               if recorded is not None else None)
    error = checkpoints.CheckpointMismatch(source, differences)
    raise errors.UserError(f'{checkpoints.mismatch_message(error, model_config, changes)} Decode '
                           'with the config the run was trained with.')


# ------------------------------------------------------------------ ensembles


class Member(NamedTuple):
  """Another run decoded with the workdir's (config.ensemble)."""
  workdir: str
  source: str  # its parameters: 'averaged/1000' or 'checkpoints/1000'
  covers: list[int] | None  # the checkpoints behind them (as Translator.covers)
  model_config: ModelConfig
  params: Any


def ensemble_runs(spec: str) -> list[tuple[str, int]]:
  """config.ensemble 'DIR[:STEP],...' -> [(DIR, STEP)], STEP 0 when not given."""
  runs = []
  for item in (part.strip() for part in spec.split(',') if part.strip()):
    folder, colon, step = item.rpartition(':') if ':' in item else (item, '', '')
    if not folder or (colon and not step.isdigit()):
      raise errors.UserError(f'config.ensemble={spec!r}: {item!r} is not DIR or DIR:STEP '
                             '(runs separated by commas)')
    runs.append((folder, int(step) if colon else 0))
  return runs


def load_ensemble(config: ml_collections.ConfigDict, workdir: str, tokenizer: Any,
                  ) -> list[Member]:
  """config.ensemble's runs, each with the parameters config.init_from would read (its
  average if it has one, else its newest checkpoint; at STEP if given), after checking
  that it shares the workdir's languages and vocabulary."""
  return [load_member(config, folder, step, workdir, tokenizer)
          for folder, step in ensemble_runs(config.ensemble)]


def load_member(config: ml_collections.ConfigDict, folder: str, step: int, workdir: str,
                tokenizer: Any) -> Member:
  """One run of an ensemble. Its model keys are its own recorded ones (sizes may differ
  from the workdir's), but the compute dtype and hardware forms are this invocation's."""
  workdir_lib.check_local(folder)
  where = os.path.join(folder, workdir_lib.CONFIG)
  recorded = workdir_lib.load_config(folder)
  if recorded is None:
    raise errors.MissingFileError(f'config.ensemble: {where}: no recorded run there '
                                  '(training records it)')
  member = recorded_run.from_recorded(recorded, [], where)
  member.model.dtype, member.model.kernels = config.model.dtype, config.model.kernels
  check_same_vocabulary(config, member, folder, workdir, tokenizer)
  model_config = ModelConfig.from_config(member)
  loaded = checkpoints.load_params(folder, step=step)
  check_params_match(loaded.params, member, model_config, f'{folder}/{loaded.source}', folder)
  covers = (checkpoints.averaged_steps(folder, loaded.step) if loaded.kind == 'averaged'
            else [loaded.step])
  return Member(folder, loaded.source, covers, model_config, loaded.params)


def check_same_vocabulary(config: ml_collections.ConfigDict, member: ml_collections.ConfigDict,
                          folder: str, workdir: str, tokenizer: Any) -> None:
  """An ensemble averages log-probabilities of the same pieces in the same languages: the
  member's vocabulary must have the workdir's fingerprint (as every host's must in a
  multi-process run)."""
  pairs = [f'{c.source_lang}→{c.target_lang}' for c in (member, config)]
  if pairs[0] != pairs[1]:
    raise errors.UserError(f'config.ensemble: {folder} translates {pairs[0]}, {workdir} '
                           f'{pairs[1]}; the runs of an ensemble translate the same pair')
  theirs = pipeline.load_tokenizer(member, folder)
  if theirs.fingerprint != tokenizer.fingerprint:
    raise errors.UserError(f'config.ensemble: {folder} has another vocabulary than {workdir} '
                           f'(fingerprint {theirs.fingerprint}, not {tokenizer.fingerprint}); '
                           'the runs of an ensemble share one vocabulary')
