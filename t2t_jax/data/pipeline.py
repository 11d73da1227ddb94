"""The input pipeline's entry points (§5.1): one dispatch table over the dataset kinds.

  config.dataset  the text                                            read by
  'tfds'          a tfds WMT14 split (downloaded and prepared once)   sources.py
  'files'         PREFIX.<source_lang> and PREFIX.<target_lang>       sources.py
  'demo'          the generated corpus, written into the workdir      demo_corpus/
  'synthetic'     a token-level toy task that needs no vocabulary     synthetic.py

Text then flows: the shared SentencePiece vocabulary (tokenizer.py) -> ids cached on disk
(id_cache.py) -> length buckets and ~25k-token batches (batching.py; packing.py: packed
rows). Every kind gives the same `Datasets`, whose parts honour the Protocols below.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import ml_collections
import numpy as np

from t2t_jax.config import rules
from t2t_jax.data import batching, demo_corpus, id_cache, packing, sources, synthetic
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.platform import errors, files

Batch = dict[str, np.ndarray]
# once(name, make): make() the thing `name` goes to disk as, once for all processes.
Once = Callable[[str, Callable[[], Any]], Any]


class Vocabulary(Protocol):
  """Text <-> ids: tokenizer.Tokenizer (SentencePiece) or synthetic.IdTokenizer."""

  @property
  def vocab_size(self) -> int: ...
  @property
  def fingerprint(self) -> str: ...  # identifies the vocabulary: hosts must agree on it
  def encode(self, text: str) -> list[int]: ...  # ends with EOS
  def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
  def decode(self, ids: Any) -> str: ...  # up to the first EOS
  def pieces(self, ids: Any) -> list[str]: ...  # one label a token (attention maps)
  # Ids that decode to no text, which decoding never emits (sampling: more).
  def banned_ids(self, *, sampling: bool) -> tuple[int, ...]: ...


class TrainBatches(Protocol):
  """Endless process-local batches {'inputs': [rows, S], 'targets': [rows, T]} (int32),
  rows padded (all PAD) to a multiple of num_devices × grad_accum_steps; `packed`: with
  each side's segments and positions too (packing.py)."""
  packed: bool

  @property
  def fingerprint(self) -> str: ...  # identifies data and settings: hosts must agree
  def __iter__(self) -> Iterator[Batch]: ...
  def __next__(self) -> Batch: ...
  # The distinct global (rows, S, T) from the current position on, in first-need order.
  def batch_shapes(self) -> list[tuple[int, int, int]]: ...
  def get_state(self) -> dict[str, Any]: ...  # saved with each checkpoint
  def set_state(self, state: dict[str, Any]) -> None: ...  # continues exactly there


class EvalSplit(Protocol):
  """A dev or test set: raw text for BLEU, and process-local batches for the loss, with
  'index' [rows] (the pair's position in sources; -1 on padding rows), or, `packed`, each
  side's segments and positions (packing.py)."""
  sources: list[str]
  references: list[str]
  packed: bool

  def batches(self) -> Iterator[Batch]: ...
  def batch_shapes(self) -> list[tuple[int, int, int]]: ...  # global (rows, S, T), in order


@dataclasses.dataclass
class Datasets:
  tokenizer: Vocabulary
  train: TrainBatches
  dev: EvalSplit | None
  test: EvalSplit | None


@dataclasses.dataclass(frozen=True)
class _Kind:
  """How one config.dataset gives its parts (see the table in the module docstring)."""
  datasets: Callable[[Any, str, dict[str, int], Once], Datasets]
  vocabulary: Callable[[Any, str], Vocabulary]  # for decoding: never trains one
  # (config, workdir, split, vocabulary, topology: num_devices, process_index, process_count)
  eval_set: Callable[[Any, str, str, Vocabulary, dict[str, int]], EvalSplit]


def _at_once(name: str, make: Callable[[], Any]) -> Any:
  return make()


def get_datasets(config: Any, workdir: str, *, num_devices: int,
                 process_index: int = 0, process_count: int = 1, once: Once = _at_once,
                 grad_accum_steps: int = 1) -> Datasets:
  """The vocabulary, training batches and dev/test sets of `config.dataset`.

  Every input is checked (sources.py) before the vocabulary is trained or anything encoded.
  What goes to disk (the demo corpus, the tfds preparation, the vocabulary, the id cache) is
  made by `once(name, make)`: a multi-process run passes distributed.first_then_others, so
  that process 0 makes each and the others load it.
  """
  if num_devices % process_count or not 0 <= process_index < process_count:
    raise errors.UserError(f'{num_devices} devices cannot be split evenly over '
                           f'{process_count} processes (this is process {process_index})')
  topology = dict(num_devices=num_devices, process_index=process_index,
                  process_count=process_count, grad_accum_steps=grad_accum_steps)
  return _kind(config).datasets(config, workdir, topology, once)


def load_tokenizer(config: Any, workdir: str) -> Vocabulary:
  """The vocabulary a training run in `workdir` made (for decoding): never trains one."""
  return _kind(config).vocabulary(config, workdir)


def load_eval_set(config: Any, workdir: str, split: str, *, tokenizer: Vocabulary,
                  num_devices: int = 1, process_index: int = 0, process_count: int = 1,
                  ) -> EvalSplit:
  """Split 'dev' or 'test' alone, for --mode=eval: never reads or prepares training data.
  Its batches (for the loss) are process-local rows of global batches over num_devices."""
  if split not in ('dev', 'test'):
    raise errors.UserError(f"config.eval_split={split!r}: choose 'dev' or 'test'")
  topology = dict(num_devices=num_devices, process_index=process_index,
                  process_count=process_count)
  return _kind(config).eval_set(config, workdir, split, tokenizer, topology)


def eval_set_origin(config: Any, workdir: str, split: str) -> tuple[str, str] | str:
  """Where split 'dev' or 'test' is read from, for a report: its source and reference files
  (the demo's in the workdir), or, where it is no file, a name: 'tfds:<name>/<split>' or
  'synthetic:<split>'."""
  if config.dataset == 'tfds':
    return f'tfds:{config.tfds_name}/{config[f"{split}_split"]}'
  if config.dataset == 'synthetic':
    return f'synthetic:{split}'
  if config.dataset == 'demo':
    config = resolve_demo(config, workdir)  # already written: only checked
  prefix = config[f'{split}_files']
  return f'{prefix}.{config.source_lang}', f'{prefix}.{config.target_lang}'


def _kind(config: Any) -> _Kind:
  if config.dataset not in KINDS:
    raise errors.UserError(f'config.dataset={config.dataset!r}: choose one of {tuple(KINDS)}')
  return KINDS[config.dataset]


# ------------------------------------------------ text: tfds, files and demo


def _text_datasets(config: Any, workdir: str, topology: dict[str, int], once: Once,
                   ) -> Datasets:
  """§5.1 on real text: vocabulary, cached ids, length-bucketed batches."""
  if config.dataset == 'demo':
    config = once('demo_corpus', functools.partial(resolve_demo, config, workdir))
  found = once('sources', lambda: sources.make_sources(config))  # tfds: prepared once
  eval_text = {name: sources.read_eval_text(found[name]) for name in ('dev', 'test')
               if found[name]}
  train = found['train']
  vocabulary = once('vocabulary', lambda: tokenizer_lib.load_or_train(
      config, workdir, lambda: sources.both_sides(train),
      total_texts=2 * train.size if train.size else None))  # both sides
  encoded = once('data_cache', lambda: id_cache.load_or_encode(
      train.name, train.key, train.read, vocabulary, workdir, size=train.size))
  kept = batching.length_filter(encoded, config.max_length, 'train')
  packed = rules.batching_of(config) == 'packed'
  iterator = packing.PackedTrainIterator if packed else batching.TrainIterator
  batches = iterator(encoded, kept, config, data_key=_data_key(encoded, vocabulary), **topology)
  del topology['grad_accum_steps']  # the eval sets have no micro-batches
  evals = {name: _eval_set(config, name, text, vocabulary, topology)
           for name, text in eval_text.items()}
  return Datasets(vocabulary, batches, evals.get('dev'), evals.get('test'))


def _eval_set(config: Any, name: str, text: id_cache.Pairs, vocabulary: Vocabulary,
              topology: dict[str, int]) -> batching.EvalSet:
  """A dev or test set of text, its loss batches as config.batching has the training's."""
  make = (packing.make_eval_set if rules.batching_of(config) == 'packed'
          else batching.make_eval_set)
  return make(name, text, vocabulary, config, **topology)


def _data_key(encoded: id_cache.Encoded, vocabulary: Vocabulary) -> str:
  """By content, not paths or times: a restart on a machine that re-downloaded the same
  data must still resume exactly."""
  offsets = b''.join(np.ascontiguousarray(side).tobytes() for side in encoded.offsets)
  return hashlib.sha256(offsets + vocabulary.fingerprint.encode()).hexdigest()


def _trained_vocabulary(config: Any, workdir: str) -> tokenizer_lib.Tokenizer:
  model_path = os.path.join(workdir, 'vocab', 'spm.model')
  if not files.exists(model_path, 'the vocabulary'):
    raise errors.MissingFileError(f'{model_path}: no vocabulary in the workdir; train first '
                                  '(--mode=train) or point --workdir at a trained run')
  vocabulary = tokenizer_lib.Tokenizer(model_path)
  if vocabulary.vocab_size != config.vocab_size:
    raise errors.UserError(f'config.vocab_size={config.vocab_size}, but {model_path} has '
                           f'{vocabulary.vocab_size} pieces')
  return vocabulary


def _text_eval_set(config: Any, workdir: str, split: str, vocabulary: Vocabulary,
                   topology: dict[str, int]) -> batching.EvalSet:
  if config.dataset == 'demo':
    config = resolve_demo(config, workdir)
  # Only this split: eval needs neither the training files nor a prepared train split.
  source = sources.make_sources(config, (split,), prepare=False)[split]
  if source is None:
    key = f'{split}_split' if config.dataset == 'tfds' else f'{split}_files'
    raise errors.UserError(f'config.{key}: empty, so there is no {split} set to evaluate')
  return _eval_set(config, split, sources.read_eval_text(source), vocabulary, topology)


def resolve_demo(config: Any, workdir: str) -> ml_collections.ConfigDict:
  """config.dataset='demo': writes the generated corpus (demo_corpus/) into the workdir
  once, then reads it as dataset='files'."""
  prefixes = demo_corpus.write_corpus(
      os.path.join(workdir, 'demo_corpus'), num_train=config.demo_num_train,
      num_dev=config.demo_num_eval, num_test=config.demo_num_eval, seed=config.demo_seed,
      source_lang=config.source_lang, target_lang=config.target_lang)
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.dataset = 'files'
  for split in sources.SPLITS:
    resolved[f'{split}_files'] = prefixes[split]
  return resolved


# ------------------------------------------------ synthetic: no text at all


def _synthetic_datasets(config: Any, workdir: str, topology: dict[str, int], once: Once,
                        ) -> Datasets:
  grad_accum_steps = topology.pop('grad_accum_steps')
  dev = synthetic.eval_set(config, **topology)
  train = synthetic.SyntheticIterator(config, grad_accum_steps=grad_accum_steps, **topology)
  return Datasets(synthetic.IdTokenizer(config.vocab_size), train, dev, dev)


def _synthetic_vocabulary(config: Any, workdir: str) -> synthetic.IdTokenizer:
  return synthetic.IdTokenizer(config.vocab_size)


def _synthetic_eval_set(config: Any, workdir: str, split: str, vocabulary: Vocabulary,
                        topology: dict[str, int]) -> synthetic.SyntheticEvalSet:
  return synthetic.eval_set(config, **topology)  # dev and test are the same held-out set


_TEXT = _Kind(_text_datasets, _trained_vocabulary, _text_eval_set)
KINDS: dict[str, _Kind] = {
    'tfds': _TEXT,
    'files': _TEXT,
    'demo': _TEXT,  # files written first (resolve_demo)
    'synthetic': _Kind(_synthetic_datasets, _synthetic_vocabulary, _synthetic_eval_set),
}
