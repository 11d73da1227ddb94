"""Translation and BLEU (§6.1): `--mode=translate` and `--mode=eval`.

Sentences are encoded, sorted by length and cut into decoding batches whose shapes come
from a fixed set (source-length buckets × a row count per bucket), so short sentences
don't pay for long ones' padding and beam search compiles a bounded number of times.
Each device decodes its own rows (shard_map, no communication); outputs return to input
order.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from t2t_jax import batching, bleu, checkpoints, config_lib, data, decode, errors, files, sources
from t2t_jax import workdir as workdir_lib
from t2t_jax.mesh import AXIS, make_mesh, replicated, shard_batch
from t2t_jax.model import ModelConfig, Transformer
from t2t_jax.progress import Progress
from t2t_jax.tokenizer import PAD_ID

EVAL = 'eval'


def decoding_batches(lengths: Sequence[int], *, tokens_per_batch: int, num_devices: int,
                     bucket_growth: float) -> Iterator[tuple[np.ndarray, int, int]]:
  """(indices, rows, padded length) of each batch, shortest sentences first.

  A bucket of padded length S always uses the same number of rows (tokens_per_batch / S,
  a multiple of num_devices); its last batch is filled up with empty rows.
  """
  lengths = np.asarray(lengths)
  grid = batching.bucket_lengths(max(int(lengths.max(initial=1)), 1), bucket_growth)
  padded = grid[np.searchsorted(grid, lengths)]
  order = np.argsort(lengths, kind='stable')
  for length in np.unique(padded):
    members = order[padded[order] == length]
    rows = max(tokens_per_batch // int(length) // num_devices, 1) * num_devices
    for start in range(0, len(members), rows):
      yield members[start:start + rows], rows, int(length)


def make_sharded_decoder(model_config: ModelConfig, config: ml_collections.ConfigDict,
                         mesh: Mesh) -> Callable[[Any, jax.Array], jax.Array]:
  """(params, src [rows, S]) -> ids [rows, T]: beam search, each device on its own rows."""
  def search(params, src):
    beams = decode.search(params, src, config=model_config, beam_size=config.beam_size,
                          alpha=config.beam_alpha, extra_length=config.decode_extra_length)
    return beams.finished_seq[:, 1:]
  # Each device's beam search stops when its own sentences are done: no collectives, and
  # no replication to check.
  sharded = jax.shard_map(search, mesh=mesh, in_specs=(P(), P(AXIS)),
                          out_specs=P(AXIS), check_vma=False)
  return jax.jit(sharded)


def translate_ids(decoder: Callable, params: Any, token_ids: Sequence[Sequence[int]],
                  config: ml_collections.ConfigDict, mesh: Mesh) -> list[np.ndarray]:
  """Output ids (up to EOS) for each input in `token_ids`, in input order.

  Process 0 logs the sentences done, the rate and the ETA (progress.py).
  """
  outputs: list[np.ndarray] = [np.zeros(0, np.int32)] * len(token_ids)
  rows_per_process = lambda rows: rows // jax.process_count()  # noqa: E731
  batches = list(decoding_batches(
      [len(t) for t in token_ids], tokens_per_batch=config.decode_tokens_per_batch,
      num_devices=mesh.size, bucket_growth=config.bucket_growth))
  # A batch's cost: its rows (empty ones too) times the most steps its beam search may take.
  # The ETA follows that, not the sentences: short ones go first, and a sentence count would
  # promise too early an end.
  cost = lambda rows, length: rows * (length + config.decode_extra_length)  # noqa: E731
  with Progress('Translating', len(token_ids), 'sentences',
                work=sum(cost(rows, length) for _, rows, length in batches),
                enabled=jax.process_index() == 0) as bar:
    for indices, rows, length in batches:
      src = np.full((rows, length), PAD_ID, np.int32)
      for r, i in enumerate(indices):
        src[r, :len(token_ids[i])] = token_ids[i]
      mine = slice(rows_per_process(rows) * jax.process_index(),
                   rows_per_process(rows) * (jax.process_index() + 1))
      ids = decoder(params, shard_batch({'src': src[mine]}, mesh)['src'])
      ids = _gather_rows(ids)
      for r, i in enumerate(indices):
        outputs[i] = ids[r]
      bar.update(len(indices), work=cost(rows, length))
  return outputs


def _gather_rows(x: jax.Array) -> np.ndarray:
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def translate(decoder: Callable, params: Any, sentences: Sequence[str], tokenizer: Any,
              config: ml_collections.ConfigDict, mesh: Mesh, *, max_input_length: int,
              ) -> list[str]:
  """Detokenized translations of raw sentences, in input order.

  An empty (or all-space) line translates to an empty line without decoding; an input
  over `max_input_length` sub-words is truncated, with a warning.
  """
  encoded = tokenizer.encode_batch(list(sentences))
  nonempty = [i for i, s in enumerate(sentences) if s.strip()]
  inputs = []
  for i in nonempty:
    ids = encoded[i]
    if len(ids) > max_input_length:
      logging.warning('Input line %d has %d sub-words; decoding its first %d.', i + 1,
                      len(ids), max_input_length)
      ids = ids[:max_input_length - 1] + [ids[-1]]  # keep the EOS
    inputs.append(ids)
  outputs = translate_ids(decoder, params, inputs, config, mesh)
  translations = [''] * len(sentences)
  for i, ids in zip(nonempty, outputs, strict=True):
    translations[i] = one_line(tokenizer.decode(ids))
  return translations


# Every character str.splitlines() breaks at: \n \r \v \f FS GS RS NEL LS PS.
_LINE_BREAKS = re.compile('[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]')


def one_line(text: str) -> str:
  """`text` with line breaks made spaces: output line i always belongs to input line i.

  A hypothesis can contain one (byte-fallback pieces decode to any character), and a
  reference file can too; written out, it would shift every later line.
  """
  return _LINE_BREAKS.sub(' ', text)


class Translator:
  """Everything decoding needs, loaded once: config, tokenizer, params, mesh, decoder.

  The parameters are config.decode_params ('auto': averaged/ if there, else checkpoints/)
  at config.restore_step (0: the newest). `mode` is the --mode the config is checked for
  (config_lib.validate): 'translate', 'eval' or 'attention'.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, mode: str = 'translate'):
    self.config = config
    config_lib.validate(config, mode)
    self.model_config = ModelConfig.from_config(config)
    self.mesh = make_mesh()
    self.tokenizer = data.load_tokenizer(config, workdir)
    loaded = checkpoints.load_params(workdir, which=config.decode_params,
                                     step=config.restore_step)
    self.source, self.kind, self.step = loaded.source, loaded.kind, loaded.step
    _check_params_match(loaded.params, config, self.model_config, self.source, workdir)
    self.params = jax.device_put(loaded.params, replicated(self.mesh))
    self.decoder = make_sharded_decoder(self.model_config, config, self.mesh)
    logging.info('Decoding with the parameters of %s (beam %d, alpha %.2f).', self.source,
                 config.beam_size, config.beam_alpha)

  @property
  def max_input_length(self) -> int:
    """Learned positions end at max_len, which must also hold input + extra outputs."""
    if self.model_config.positional == 'learned':
      return self.model_config.max_len - self.config.decode_extra_length
    return max(self.config.max_decode_input_length, 1)

  def __call__(self, sentences: Sequence[str]) -> list[str]:
    return translate(self.decoder, self.params, sentences, self.tokenizer, self.config,
                     self.mesh, max_input_length=self.max_input_length)


def _check_params_match(params: Any, config: ml_collections.ConfigDict,
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


def run_translate(config: ml_collections.ConfigDict, workdir: str, input_path: str,
                  output_path: str | None) -> None:
  """--mode=translate: lines of `input_path` ('-' = stdin) to `output_path` (None = stdout).

  Line i of the output is the translation of line i of the input: both are split on '\n'
  alone, stdin exactly like a file (sources.read_lines), and no translation holds a line break.
  """
  sentences = sources.read_lines(input_path)
  translations = Translator(config, workdir, mode='translate')(sentences)
  text = ''.join(t + '\n' for t in translations)
  if output_path is not None:
    _write(output_path, text)
  elif jax.process_index() == 0:
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode('utf-8'))  # UTF-8 whatever the locale's encoding
    sys.stdout.buffer.flush()


def eval_name(split: str, translator: Translator, config: ml_collections.ConfigDict) -> str:
  """The folder of one evaluation under eval/: what was decoded, with what, and how.

  E.g. 'test-averaged-1000-beam4-alpha0.6-extra50': dev and test, averaged and raw
  parameters of the same step, and other decoding settings never overwrite each other.
  """
  return (f'{split}-{translator.kind}-{translator.step}-beam{config.beam_size}'
          f'-alpha{config.beam_alpha:g}-extra{config.decode_extra_length}')


def run_eval(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """--mode=eval: translate config.eval_split, write eval/<eval_name>/{hypotheses,
  references,scores}; scores.json is written last, so its presence means complete."""
  translator = Translator(config, workdir, mode='eval')
  evalset = data.load_eval_set(config, workdir, config.eval_split,
                               tokenizer=translator.tokenizer)
  hypotheses = translator(evalset.sources)
  scores = bleu.bleu_scores(hypotheses, evalset.references, target_lang=config.target_lang)
  scores.update(split=config.eval_split, params=translator.source, step=translator.step,
                sentences=len(hypotheses), beam_size=config.beam_size,
                beam_alpha=config.beam_alpha, decode_extra_length=config.decode_extra_length)
  out_dir = os.path.join(workdir, EVAL, eval_name(config.eval_split, translator, config))
  os.makedirs(out_dir, exist_ok=True)
  _write(os.path.join(out_dir, 'hypotheses.txt'), ''.join(h + '\n' for h in hypotheses))
  _write(os.path.join(out_dir, 'references.txt'),
         ''.join(one_line(r) + '\n' for r in evalset.references))
  _write(os.path.join(out_dir, 'scores.json'), json.dumps(scores, indent=2) + '\n')
  logging.info('%s BLEU of %s: sacreBLEU %.2f (%s), tokenized BLEU %.2f; written to %s',
               config.eval_split, translator.source, scores['sacrebleu'],
               scores['sacrebleu_signature'], scores['tok_bleu'], out_dir)
  return scores


def _write(path: str, text: str) -> None:
  if jax.process_index() == 0:  # one copy, however many processes decoded
    files.write_text(path, text)
