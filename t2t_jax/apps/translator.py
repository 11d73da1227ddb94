"""From a trained run to translations (§6.1): the Python API, which `--mode=translate` runs
(translate_command.py: files and streams).

    from t2t_jax import Translator
    tr = Translator.from_workdir('runs/demo')
    tr.translate(['A sentence.', 'Another one.'])            # -> ['Ein Satz.', ...]
    tr.translate(['A sentence.'], beam_size=8, n_best=3)     # -> [[Hypothesis(text, score)] * 3]
    tr.translate(['A sentence.'], method='sample', seed=1)   # a sample (sampling.py)

Sentences decode in the batch plan's batches (batch_plan.py: length-sorted, a fixed set of
shapes, each device its own rows); a call of a few sentences (a stream's batch) in small
batches of fixed shapes, which `compile_ahead` compiles.

config.decode_method chooses the search: 'beam' (§6.1), 'greedy' (beam search with one beam)
or 'sample' (sampling.py). config.ensemble adds other runs of the same vocabulary and
languages ('DIR[:STEP],...'): every search then runs over the mean of the models'
log-probabilities (decode.py, "Ensembles"), weighted by config.ensemble_weights if given.
A hypothesis's score is its search's (Hypothesis.score). An empty (or all-space) input line
is not decoded: its translation is the empty line, with score 0.0.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from t2t_jax.apps import arguments
from t2t_jax.config import rules
from t2t_jax.data import pipeline
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.decoding import batch_plan, decode, scoring
from t2t_jax.decoding.batch_plan import INTERACTIVE_ROWS, Decoder, Sampling, one_line
from t2t_jax.model.transformer import ModelConfig
from t2t_jax.platform import ahead, errors, xla
from t2t_jax.platform.mesh import AXIS, make_mesh, replicated
from t2t_jax.run import ensemble, recorded
from t2t_jax.run import params as params_lib


class Hypothesis(NamedTuple):
  """One translation of an n-best list: its text and its score, and what the score is made of
  (the features of a Moses n-best line)."""
  text: str
  score: float  # beam search: log P(Y|X) / lp(Y), §6.1; a sample: log P(Y|X) (higher: better)
  logprob: float = 0.0  # log P(Y|X), EOS included
  length_penalty: float = 1.0  # lp(Y) = ((5 + |Y|) / 6)^α of beam search; 1 for a sample


def _hypothesis(text: str, score: float, ids: np.ndarray, alpha: float) -> Hypothesis:
  """A Hypothesis with the log-probability and length penalty its score is made of (§6.1):
  |Y| counts the output's tokens up to its EOS, included."""
  ends = np.flatnonzero(ids == EOS_ID)
  length = int(ends[0]) + 1 if len(ends) else int((ids != PAD_ID).sum())
  penalty = float(decode.length_penalty(length, alpha))
  return Hypothesis(text, score, score * penalty, penalty)


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
    loaded = params_lib.load_params(workdir, which=config.decode_params, step=config.restore_step)
    self.source, self.kind, self.step = loaded.source, loaded.kind, loaded.step
    self.covers = loaded.covers  # the checkpoints behind the parameters
    self.dev_loss = loaded.dev_loss  # theirs, where it was measured
    self._described = loaded.describe()
    params_lib.check_params_match(loaded.params, config, self.model_config, self.source, workdir)
    self.params = jax.device_put(loaded.params, replicated(self.mesh))
    self.ensemble = [m._replace(params=jax.device_put(m.params, replicated(self.mesh)))
                     for m in ensemble.load(config, workdir, self.tokenizer)]
    self._decoders: dict[tuple, Decoder] = {}
    self._scorer: scoring.Scorer | None = None  # made on score()'s first call
    self._pools: list[Any] = []  # compile_ahead's background threads, until close()
    with_others = ''.join(f' + {m.workdir}/{m.source}' for m in self.ensemble)
    logging.info('Decoding with the parameters of %s%s on %d device%s (%s).', loaded.describe(),
                 with_others, self.mesh.size, 's' if self.mesh.size > 1 else '',
                 arguments.describe_method(config))

  def describe(self) -> str:
    """The parameters decoding uses: 'averaged/1000 (the mean of checkpoints [...]; dev loss
    1.2345)', and an ensemble's other runs."""
    return self._described + ''.join(f' + {m.workdir}/{m.source}' for m in self.ensemble)

  def check_settings(self, *, method: str | None = None, beam_size: int | None = None,
                     alpha: float | None = None, n_best: int | None = None,
                     temperature: float | None = None, top_k: int | None = None,
                     top_p: float | None = None, seed: int | None = None) -> None:
    """translate()'s settings checked as translate checks them (errors.UserError naming the
    first bad one), without decoding anything."""
    method = method or self.config.decode_method
    arguments.check_search(method, beam_size, n_best, self.config)
    arguments.check_settings(method, alpha=alpha, temperature=temperature, top_k=top_k,
                             top_p=top_p, seed=seed)
    if method == 'sample':
      arguments.sampling_settings(self.config, [], temperature, top_k, seed, top_p)

  def search_settings(self, settings: Mapping[str, Any]) -> dict[str, Any]:
    """translate()'s settings (`settings`, the rest the config's) as the search uses them."""
    method = settings.get('method') or self.config.decode_method
    used: dict[str, Any] = {'method': method, 'n_best': settings.get('n_best')}
    if method == 'sample':
      return {**used, **{name: settings.get(name, self.config[f'sample_{name}'])
                         for name in ('temperature', 'top_k', 'top_p', 'seed')}}
    beam = 1 if method == 'greedy' else settings.get('beam_size') or self.config.beam_size
    return {**used, 'beam_size': beam, 'alpha': settings.get('alpha', self.config.beam_alpha)}

  @classmethod
  def from_workdir(cls, workdir: str, overrides: Mapping[str, Any] | None = None) -> Translator:
    """The run trained in `workdir`, with the config it recorded (DIR/config.json).

    `overrides` ({'decode_params': 'checkpoint', 'model.dtype': 'bfloat16'}, or nested:
    {'model': {'dtype': 'bfloat16'}}) change keys of that config as --config.KEY=VALUE
    would; one that contradicts the trained model (recorded.TRAINED_KEYS) is refused
    with an errors.UserError naming it.
    """
    if overrides is not None and not isinstance(overrides, Mapping):
      raise errors.UserError(f'overrides: a dict of config keys, got {type(overrides).__name__}')
    pairs = [f'config.{key}={value}' for key, value in arguments.flat(overrides or {})]
    return cls(recorded.read(workdir, pairs), workdir)

  @property
  def decoding_params(self) -> Any:
    """The parameters the decoders take: this run's, or a tuple of the ensemble's."""
    return (self.params, *(m.params for m in self.ensemble)) if self.ensemble else self.params

  @property
  def decoding_config(self) -> ModelConfig | decode.Ensemble:
    """The model the decoders run: this run's, or a tuple of the ensemble's."""
    members = (self.model_config, *(m.model_config for m in self.ensemble))
    return members if self.ensemble else self.model_config

  @property
  def max_input_length(self) -> int:
    return batch_plan.max_input_length(self.decoding_config, self.config)

  @property
  def ahead_length(self) -> int:
    """The longest input compile_ahead prepares for: the longest pair training kept
    (config.max_length) with the search's own margin (config.decode_extra_length), at most
    max_input_length. Longer inputs are rare, and compile when met."""
    return min(self.max_input_length, self.config.max_length + self.config.decode_extra_length)

  def decoder(self, beam_size: int | None = None, n_best: int | None = None, *,
              method: str | None = None, top_k: int | None = None,
              top_p: float | None = None) -> Decoder:
    """The sharded search of these settings (translate's; None: the config's), compiled once
    per input shape and kept."""
    key = self._decoder_key(beam_size, n_best, method, top_k, top_p)
    if key not in self._decoders:
      self._decoders[key] = batch_plan.make_sharded_decoder(
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
    ahead_length) can meet (batch_plan.interactive_shapes), on `threads` threads (default: a
    quarter of the cores, at least 1), so that such calls, and streams of at most max_rows
    lines a batch, never wait for a compilation. The log shows its progress and its end.

    wait=True returns when all are compiled; wait=False at once, compiling in the
    background: a call that needs a shape still queued compiles it then, and close() (or
    leaving `with translator:`) drops the queue. The compilation cache keeps them for the
    next process (config.compilation_cache_dir), whose compile_ahead then loads them.
    """
    arguments.check_search(method or self.config.decode_method, beam_size, n_best, self.config)
    for name, value in (('max_rows', max_rows), ('max_length', max_length)):
      if value is not None and not rules.POSITIVE_INT.test(value):
        raise errors.UserError(f'{name}={value!r}: must be a positive integer')
    key = self._decoder_key(beam_size, n_best, method, top_k, top_p)
    decoder = self.decoder(beam_size, n_best, method=method, top_k=top_k, top_p=top_p)
    if isinstance(decoder, ahead.Precompiled):
      return decoder
    up_to = min(max_length or self.ahead_length, self.max_input_length)
    shapes = batch_plan.interactive_shapes(self.config, self.mesh.size, max_rows=max_rows,
                                           max_length=self.max_input_length, up_to=up_to)
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
    gives one translation (or list) out. first_line numbers the sentences in warnings and
    keys their samples (sentence i: first_line - 1 + i). max_rows caps a decoding batch's
    rows and makes its shape one of interactive_shapes' (streams); a call of at most
    INTERACTIVE_ROWS sentences does so by itself, so that after compile_ahead none waits.
    """
    single = isinstance(sentences, str)
    sentences = [sentences] if single else sentences
    method = method or self.config.decode_method
    arguments.check_sentences(sentences)
    arguments.check_search(method, beam_size, n_best, self.config)
    arguments.check_settings(method, alpha=alpha, temperature=temperature, top_k=top_k, top_p=top_p,
                             seed=seed, max_rows=max_rows)
    nonempty, inputs = batch_plan.encode_inputs(sentences, self.tokenizer, self.max_input_length,
                                                first_line=first_line)
    draws = (arguments.sampling_settings(self.config, [first_line - 1 + i for i in nonempty],
                                         temperature, top_k, seed, top_p)
             if method == 'sample' else None)
    if not max_rows and len(inputs) <= INTERACTIVE_ROWS:
      max_rows = INTERACTIVE_ROWS  # a few sentences: small batches, not 4096 tokens' worth
    decoder = self.decoder(beam_size, n_best, method=method, top_k=top_k, top_p=top_p)
    with self._shapes_ahead(decoder, [] if max_rows else inputs, method) as decoder:
      outputs, scores = batch_plan.translate_ids(
          decoder, self.decoding_params, inputs, self.config, self.mesh, alpha=alpha,
          sampling=draws, max_rows=max_rows,
          max_length=self.max_input_length if max_rows else 0, show_progress=show_progress)
    penalized = method != 'sample'
    alpha = (self.config.beam_alpha if alpha is None else alpha) if penalized else 0.0
    results = self._results(len(sentences), nonempty, outputs, scores, n_best, alpha)
    return results[0] if single else results

  @contextlib.contextmanager
  def _shapes_ahead(self, decoder: Decoder, inputs: Sequence[Sequence[int]],
                    method: str) -> Iterator[Decoder]:
    """`decoder` compiled ahead for the batch shapes of `inputs` (batch_shapes), as the
    training loop does for dev BLEU, with config.compile_ahead on a host with cores to spare
    (ahead.default_threads): each length bucket is a compilation of the search, and on an
    accelerator they, not the decoding, take most of an evaluation's time. Elsewhere
    `decoder` as it is."""
    threads = ahead.default_threads() if self.config.compile_ahead else 0
    shapes = batch_plan.batch_shapes(inputs, self.config, self.mesh.size) if threads else []
    if len(set(shapes)) < 2 or isinstance(decoder, ahead.Precompiled):
      yield decoder
      return
    pool = ahead.make_pool(threads)
    with ahead.cancelled_on_exit(pool):
      yield ahead.searches(decoder, self.decoding_params, shapes, self.mesh, pool=pool,
                           name=f'{method} search',
                           settings=self._abstract_sampling if method == 'sample' else None)

  def _results(self, count: int, nonempty: list[int], outputs: list[np.ndarray],
               scores: list[np.ndarray], n_best: int | None, alpha: float,
               ) -> list[str] | list[list[Hypothesis]]:
    """The texts (n_best None), else the Hypothesis lists, of `count` sentences of which
    those at `nonempty` were decoded; `alpha` the length penalty's α (0: none, sampling)."""
    if n_best is None:
      texts = [''] * count
      for i, ids in zip(nonempty, outputs, strict=True):
        texts[i] = one_line(self.tokenizer.decode(ids))
      return texts
    lists = [[Hypothesis('', 0.0)] for _ in range(count)]  # an empty line: the empty one
    for i, ids, score in zip(nonempty, outputs, scores, strict=True):
      # A slot that no hypothesis finished into holds -inf (decode.beam_search): dropped.
      lists[i] = [_hypothesis(one_line(self.tokenizer.decode(row)), float(s), row, alpha)
                  for row, s in zip(ids, score, strict=True) if np.isfinite(s)]
    return lists

  def score(self, sources: Sequence[str], targets: Sequence[str], *,
            alpha: float | None = None) -> list[scoring.Scored]:
    """log P(target | source) of each given pair, as beam search scores an output
    (scoring.py): a Scored each, in order, with `score` = log P / lp(Y) (α: alpha, default
    config.beam_alpha), `logprob` = log P and each target token's log-probability. A
    source over max_input_length sub-words is truncated, as translate truncates it. An empty
    (or all-space) pair scores 0.0 with no tokens: translate gives an empty line that score,
    undecoded."""
    arguments.check_sentences(sources, 'sources')
    arguments.check_sentences(targets, 'targets')
    if len(sources) != len(targets):
      raise errors.UserError(f'sources and targets: {len(sources)} and {len(targets)} '
                             'sentences; give one target for each source')
    arguments.check_settings('beam', alpha=alpha)
    nonempty, encoded = batch_plan.encode_inputs(sources, self.tokenizer, self.max_input_length)
    src = [[EOS_ID]] * len(sources)  # an empty source: EOS alone
    for i, ids in zip(nonempty, encoded, strict=True):
      src[i] = ids
    if self._scorer is None:
      self._scorer = scoring.make_scorer(
          self.decoding_config, self.mesh,
          weights=rules.ensemble_weights(self.config) if self.ensemble else None)
    scored = scoring.score_ids(self._scorer, self.decoding_params, src,
                               self.tokenizer.encode_batch(list(targets)), self.config, self.mesh,
                               alpha=self.config.beam_alpha if alpha is None else alpha)
    decoded = set(nonempty)
    return [scoring.Scored(0.0, 0.0, []) if i not in decoded and not targets[i].strip() else s
            for i, s in enumerate(scored)]

  def __call__(self, sentences: Sequence[str]) -> list[str]:
    return self.translate(sentences)
