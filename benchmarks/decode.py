"""Beam-search decoding speed on this machine (§6.1 settings), as JSON lines.

  python benchmarks/decode.py [--config base] [--sentences 64] [--uncached-sentences 2]
                              [--devices N] [--peer]

The base config with random weights decodes `sentences` × 32-token inputs with beam 4,
α = 0.6. Random weights never reliably emit EOS, so early stopping is off and every
sentence runs to its limit, input + 50 = 82 steps; tokens/s counts those 82 positions a
sentence (the peers' benchmark shape).

The uncached reference re-runs the decoder over the whole current segment of positions
each step (16, 32, 64 or 82: static shapes, see decode.segment_lengths; a mean of 52.3
positions a step against 41.5 for an exactly growing prefix). It is slow, so it gets fewer
sentences; the cached search is timed again on that same batch for a like-for-like ratio.

Decoding runs as `--mode=translate` and `--mode=eval` run it: on a CPU, one JAX device per
core (xla.configure_cpu(decoding=True); `--devices N` for N), each beam-searching its share
of the sentences (the mesh's data parallelism), and the JSON lines say how many.

`--peer` times the PyTorch peer (benchmarks/peers/torch_decode.py: the same shapes, a
growing key/value cache reordered each step) in the same process after ours, and prints the
ratio: only ratios from one run count on a shared machine.

  python benchmarks/decode.py --workdir RUN [--sentences N] [--threads 2] [--repeats 3]
                              [--methods greedy,beam] [--engines t2t_jax,ct2_float32,...]

With `--workdir`, instead: a trained run's test split (its source and reference files, the
first N sentences) decoded on this host, in this one process, by each engine in turn: t2t_jax
itself (Translator; a first call compiles its shapes), CTranslate2 float32 and int8
(--config.export_format=ctranslate2) and the MarianMT export under transformers and torch
(--mode=export), each exported to a temporary folder. A JSON line an engine and method:
seconds (the fastest of --repeats calls after the first), sentences/s, sacreBLEU, and the
lines equal to t2t_jax's. Greedy decoding is the same search everywhere; beam search ranks by
each engine's length penalty (ours GNMT's ((5 + |Y|) / 6)^α, the others' |Y|^α:
docs/export.md). CTranslate2 and torch run on `--threads` threads, t2t_jax on one CPU device
a core (as --mode=translate).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import os
import sys
import time

import common  # benchmarks/common.py: the repository on sys.path

# XLA's CPU flags in main, after --devices: xla.configure_cpu(decoding=True).
common.start(__name__, xla_flags=False)

import jax
import numpy as np
from jax.sharding import Mesh

from t2t_jax.decoding import batch_plan, decode
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import xla
from t2t_jax.platform.mesh import make_mesh, replicated, shard_batch


def sharded_search(model_config: ModelConfig, args: argparse.Namespace, mesh: Mesh, *,
                   use_cache: bool):
  """decode.beam_search as batch_plan.make_sharded_decoder runs it: each device searches its
  own rows; early stopping off (see above)."""
  def search(params, src, alpha):
    return decode.beam_search(params, src, alpha=alpha, config=model_config,
                              beam_size=args.beam, extra_length=args.extra_length,
                              early_stop=False, use_cache=use_cache)
  return batch_plan.shard_rows(search, mesh)


def time_decode(params, src: np.ndarray, args: argparse.Namespace, model_config, *,
                use_cache: bool) -> dict:
  """Compiles once, warms up once, then times `args.repeats` runs (median)."""
  mesh = make_mesh()
  params, alpha = jax.device_put(params, replicated(mesh)), np.float32(0.6)
  sharded_src = shard_batch({'src': src}, mesh)['src']
  t0 = time.perf_counter()
  compiled = sharded_search(model_config, args, mesh, use_cache=use_cache).lower(
      params, sharded_src, alpha).compile()
  compile_s = time.perf_counter() - t0
  run = lambda: compiled(params, sharded_src, alpha)  # noqa: E731 -- α is traced, not static
  jax.block_until_ready(run())  # warm-up
  load = os.getloadavg()[0]  # other processes share the CPU: a high load means slower runs
  walls, cpus = [], []
  for _ in range(args.repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    ids, _ = run()
    jax.block_until_ready(ids)
    walls.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
  wall = float(np.median(walls))
  rows, steps = src.shape[0], src.shape[1] + args.extra_length
  return {'benchmark': 'decode', 'config': args.config, 'cache': use_cache,
          'sentences': rows, 'input_tokens': src.shape[1], 'beam_size': args.beam,
          'devices': mesh.size,
          'steps': steps, 'early_stop': False, 'seconds': round(wall, 3),
          'sentences_per_s': round(rows / wall, 3),
          'output_tokens_per_s': round(rows * steps / wall, 1),
          'best_output_tokens': int((np.asarray(ids) != 0).sum()),
          # The output itself, to compare runs and code versions by: the same ids, the same hash.
          'ids_sha1': hashlib.sha1(np.asarray(ids).tobytes()).hexdigest()[:12],
          'cpu_seconds_per_wall_second': round(float(np.median(cpus)) / wall, 2),
          'load_average_1min': round(load, 2),
          'compile_seconds': round(compile_s, 1)}


ENGINES = ('t2t_jax', 'ct2_float32', 'ct2_int8', 'marian')
MARIAN_BATCH = 64  # sentences a transformers generate() call, sorted by length
CT2_BATCH = 64  # CTranslate2's max_batch_size: it sorts a call's sentences by length too


def test_split(config, workdir: str, sentences: int) -> tuple[list[str], list[str]]:
  """The first `sentences` source and reference lines of the run's test split (0: all)."""
  from t2t_jax.data import pipeline
  origin = pipeline.eval_set_origin(config, workdir, 'test')
  if isinstance(origin, str):
    sys.exit(f'--workdir={workdir}: its test split is {origin}, not text files')
  lines = []
  for path in origin:
    with open(path, encoding='utf-8') as f:
      lines.append(f.read().splitlines()[:sentences or None])
  return lines[0], lines[1]


def t2t_jax_engine(config, workdir: str, folder: str, args):
  """t2t_jax's Translator: method 'greedy' or 'beam' (config.beam_size, beam_alpha)."""
  from t2t_jax.apps.translator import Translator
  translator = Translator(config, workdir)
  return lambda sentences, method: translator.translate(sentences, method=method,
                                                        show_progress=False)


def ct2_engine(config, workdir: str, folder: str, args, *, quantization: str):
  """CTranslate2's Translator of `quantization`, with the options export_ct2 documents; the
  export is made once, in `folder`."""
  import ctranslate2
  import sentencepiece as spm

  from t2t_jax.apps import export_ct2
  from t2t_jax.data import pipeline
  exported = os.path.join(folder, 'ct2')
  if not os.path.exists(exported):
    config = config.copy_and_resolve_references()
    config.export_format = 'ctranslate2'
    export_ct2.export_run(config, workdir, exported)
  vocabulary = pipeline.load_tokenizer(config, workdir)
  banned = vocabulary.pieces(vocabulary.banned_ids(sampling=False))
  sp = spm.SentencePieceProcessor(model_file=vocabulary.model_path)
  translator = ctranslate2.Translator(os.path.join(exported, quantization),
                                      compute_type=quantization, intra_threads=args.threads)

  def translate(sentences, method):
    batch = [sp.encode(s, out_type=str) for s in sentences]
    options = export_ct2.decoding_options(
        [len(pieces) for pieces in batch], banned,
        beam_size=1 if method == 'greedy' else config.beam_size, alpha=config.beam_alpha,
        max_input_length=config.max_decode_input_length, extra_length=config.decode_extra_length)
    results = translator.translate_batch(batch, max_batch_size=CT2_BATCH, **options)
    return [sp.decode(r.hypotheses[0]) for r in results]
  return translate


def marian_engine(config, workdir: str, folder: str, args):
  """The MarianMT export under transformers and torch, in length-sorted batches."""
  import torch
  import transformers

  from t2t_jax.apps import export
  export.export_run(config, workdir, os.path.join(folder, 'marian'))
  torch.set_num_threads(args.threads)
  tokenizer = transformers.MarianTokenizer.from_pretrained(os.path.join(folder, 'marian'))
  model = transformers.MarianMTModel.from_pretrained(os.path.join(folder, 'marian')).eval()

  def translate(sentences, method):
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out = [''] * len(sentences)
    for start in range(0, len(order), MARIAN_BATCH):
      rows = order[start:start + MARIAN_BATCH]
      batch = tokenizer([sentences[i] for i in rows], return_tensors='pt', padding=True,
                        truncation=True)
      with torch.no_grad():
        ids = model.generate(**batch, num_beams=1 if method == 'greedy' else config.beam_size,
                             max_new_tokens=batch.input_ids.shape[1] + config.decode_extra_length)
      for i, text in zip(rows, tokenizer.batch_decode(ids, skip_special_tokens=True),
                         strict=True):
        out[i] = text
    return out
  return translate


# Each makes an engine: translate(sentences, method) -> their translations, in order.
MAKERS = {'t2t_jax': t2t_jax_engine,
          'ct2_float32': functools.partial(ct2_engine, quantization='float32'),
          'ct2_int8': functools.partial(ct2_engine, quantization='int8'),
          'marian': marian_engine}


def time_engine(translate, name: str, method: str, sources: list[str], repeats: int) -> tuple:
  """(the outputs, the fastest of `repeats` calls' seconds, their median, the first call's
  seconds): t2t_jax's first call compiles its shapes; the others' warm up on 16 sentences."""
  t0 = time.perf_counter()
  translate(sources if name == 't2t_jax' else sources[:16], method)
  first = time.perf_counter() - t0
  walls = []
  for _ in range(repeats):  # the fastest: the least disturbed by other processes
    t0 = time.perf_counter()
    outputs = translate(sources, method)
    walls.append(time.perf_counter() - t0)
  return outputs, min(walls), float(np.median(walls)), first


def compare_engines(args: argparse.Namespace) -> None:
  """--workdir: each engine × method as one JSON line (see the module docstring). One engine
  lives at a time: two CTranslate2 Translators in one process slow each other down, idle or
  not."""
  import gc
  import tempfile

  import sacrebleu

  from t2t_jax.run import recorded
  config = recorded.read(args.workdir)
  sources, references = test_split(config, args.workdir, args.sentences)
  wanted = [name for name in ENGINES if name in args.engines.split(',')]
  ours = {}
  with tempfile.TemporaryDirectory() as folder:
    for name in wanted:
      translate = MAKERS[name](config, args.workdir, folder, args)
      for method in args.methods.split(','):
        load = os.getloadavg()[0]
        outputs, seconds, median, first = time_engine(translate, name, method, sources,
                                                      args.repeats)
        if name == 't2t_jax':
          ours[method] = outputs
        line = {'benchmark': 'decode_engines', 'engine': name, 'method': method,
                'sentences': len(sources), 'seconds': round(seconds, 2),
                'sentences_per_s': round(len(sources) / seconds, 1),
                'bleu': round(sacrebleu.corpus_bleu(outputs, [references]).score, 2)}
        if method in ours:
          line['lines_equal_to_t2t_jax'] = sum(
              a == b for a, b in zip(outputs, ours[method], strict=True))
        common.emit(line | {'seconds_median': round(median, 2), 'threads': args.threads,
                            'cpu_count': os.cpu_count(), 'first_call_seconds': round(first, 2),
                            'load_average_1min': round(load, 2)})
      del translate
      gc.collect()  # the engine's threads and memory go before the next one's


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  parser.add_argument('--sentences', type=int, default=None,
                      help='default 64; --workdir: all of the test split')
  parser.add_argument('--length', type=int, default=32)
  parser.add_argument('--beam', type=int, default=4)
  parser.add_argument('--extra-length', type=int, default=50)
  parser.add_argument('--uncached-sentences', type=int, default=2, help='0: skip')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--devices', type=int, default=0,
                      help='CPU devices (0: one per core, as --mode=translate uses)')
  parser.add_argument('--peer', action='store_true', help='also the PyTorch peer')
  parser.add_argument('--workdir', default='',
                      help="a trained run: its test split by each engine (above) instead")
  parser.add_argument('--threads', type=int, default=2, help='--workdir: CTranslate2, torch')
  parser.add_argument('--methods', default='greedy,beam', help='--workdir: greedy, beam')
  parser.add_argument('--engines', default=','.join(ENGINES), help='--workdir: of ' +
                      ', '.join(ENGINES))
  args = parser.parse_args()
  if args.sentences is None:
    args.sentences = 0 if args.workdir else 64
  if args.devices:  # an explicit setting wins over configure_cpu's
    os.environ['XLA_FLAGS'] = (f"{os.environ.get('XLA_FLAGS', '')} "
                               f'{xla.DEVICE_COUNT_FLAG}={args.devices}')
  xla.configure_cpu(decoding=True)  # before anything starts JAX's CPU backend
  if args.workdir:
    compare_engines(args)
    return
  model_config = ModelConfig.from_config(common.get_config(args.config)).replace(
      deterministic=True)
  dummy = np.ones((1, 2), np.int32)
  params = jax.jit(lambda rng: Transformer(model_config).init(rng, dummy, dummy)['params'])(
      jax.random.PRNGKey(0))
  # Word ids ending in EOS, no padding: every sentence has the full limit.
  src = common.random_sources(args.sentences, args.length, model_config.vocab_size)
  fields = {'backend': jax.default_backend(), 'cpu_count': os.cpu_count(),
            'glibc_tunables': os.environ.get('GLIBC_TUNABLES', '')}  # huge pages or not
  ours = time_decode(params, src, args, model_config, use_cache=True)
  common.emit(ours | fields)
  if args.peer:
    torch_decode = common.import_peer('torch_decode')  # the peer, and torch, only when asked
    peer = torch_decode.bench(torch_decode.parse_args([
        f'--config={args.config}', f'--sentences={args.sentences}', f'--length={args.length}',
        f'--beam={args.beam}', f'--extra-length={args.extra_length}',
        f'--repeats={args.repeats}']))
    common.emit(peer)
    common.emit({'benchmark': 'decode_ratio', 'config': args.config,
                 't2t_jax_over_pytorch': round(peer['seconds'] / ours['seconds'], 3)})
  if args.uncached_sentences:
    devices = jax.device_count()  # rows: a multiple of the devices
    small = src[:-(-args.uncached_sentences // devices) * devices]
    cached = time_decode(params, small, args, model_config, use_cache=True)
    uncached = time_decode(params, small, args, model_config, use_cache=False)
    steps = small.shape[1] + args.extra_length
    segments = decode.segment_lengths(steps)
    recomputed = [next(n for n in segments if t < n) for t in range(steps)]
    uncached['mean_positions_recomputed_per_step'] = round(float(np.mean(recomputed)), 1)
    uncached['cache_speedup'] = round(uncached['seconds'] / cached['seconds'], 2)
    for result in (cached, uncached):
      common.emit(result | fields)


if __name__ == '__main__':
  main()
