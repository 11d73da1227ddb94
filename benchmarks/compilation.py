"""Compilations of a run: distinct batch shapes, seconds to compile each, and the cache.

  python benchmarks/compilation.py [--config=base|big|demo] [--shapes=3] [--band=2] [--growth=1.1]

(--shapes=0: the shape statistics alone; --batching=packed: packed rows, config.pack_length
--pack-length, instead of §5.1's buckets.)
  python benchmarks/compilation.py --sweep [--corpus=wmt|debian] [--shapes-per-minute=N]
  python benchmarks/compilation.py --batchings [--corpus=wmt|debian] [--pack-length=256]

--batchings prints the shape statistics of both batchings on one corpus: §5.1's buckets at
the base config's band and growth, and packed rows (t2t_jax/data/packing.py).

--sweep prints the shape statistics for every bucket_band × bucket_growth of SWEEP on one
corpus (one vocabulary, trained once): the WMT sample, or the EN→FR software messages
($T2T_DEBIAN_MSGS, train/valid). With --shapes-per-minute (compilations a machine finishes
a minute, from its cold compile seconds and compile threads) each line also says how long
compiling the whole epoch's train shapes ahead would take there.

The §5.1 length buckets make every distinct (rows, source length, target length) of the
training batches, and every (rows, length) of the dev batches, a compilation of the train or
eval step. On the real 10k-pair WMT sample ($T2T_WMT_SAMPLE, an 8000-piece
vocabulary; newstest2013 as dev set), with --band/--growth as config.bucket_band and
config.bucket_growth, this prints JSON lines:
  shapes       distinct train shapes in one epoch, dev shapes, padding efficiency
  compile      seconds to compile the train step for the first --shapes shapes, in a fresh
               process with an empty compilation cache (cold) and in another that finds
               them in it (warm); and the whole epoch's shapes extrapolated from the mean
Runs on any backend (the GPU/TPU figures are what the cache is for); the model is
--config's, in its 'auto' dtype.

  python benchmarks/compilation.py --waits [--config=base] [--steps=200] [--threads=N]

--waits trains --config on the corpus for --steps steps twice, each in a fresh process with
an empty compilation cache: config.compile_ahead off, then on with --threads background
threads (default: t2t_jax.platform.ahead.default_threads() of this machine). It prints the seconds
stepping waited for compilations, as the training log's last lines give them, and the
training wall time of each.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import numpy as np

from t2t_jax.data import pipeline

SWEEP = [(band, growth) for band in (0, 1, 2, 3) for growth in (1.1, 1.25)]


def corpus_files(corpus: str) -> tuple[str, str, str, str]:
  """(train prefix, dev prefix, source language, target language) of a corpus."""
  if corpus == 'wmt':
    return common.wmt_sample('train'), common.wmt_sample('newstest2013'), 'en', 'de'
  folder = os.environ.get('T2T_DEBIAN_MSGS', '')
  if not os.path.isfile(os.path.join(folder, 'train.en')):
    sys.exit(f'{sys.argv[0]}: T2T_DEBIAN_MSGS={folder!r}: set it to the folder of the EN-FR '
             'software messages (train.en, train.fr, valid.en, valid.fr)')
  folder = os.path.abspath(folder)
  return os.path.join(folder, 'train'), os.path.join(folder, 'valid'), 'en', 'fr'


def make_config(args: argparse.Namespace):
  config = common.get_config(args.config)
  config.dataset = 'files'
  train, dev, config.source_lang, config.target_lang = corpus_files(args.corpus)
  config.train_files, config.dev_files = train, dev
  config.test_files = ''
  config.vocab_size = 8000  # a 10k-pair sample cannot support 37000 pieces
  config.bucket_band, config.bucket_growth = args.band, args.growth
  config.batching, config.pack_length = args.batching, args.pack_length
  config.tokens_per_batch = 25000  # §5.1, whatever the config (demo: 2048)
  return config


def epoch_shapes(config, workdir: str) -> tuple[list[tuple[int, ...]], dict]:
  """The distinct train batch shapes of epoch 0, first-seen order, and shape statistics."""
  datasets = pipeline.get_datasets(config, workdir, num_devices=1)
  plan = datasets.train.plan(0)
  shapes, real, slots = {}, 0, 0
  for _ in range(plan.num_batches):
    batch = next(datasets.train)
    shapes[(*batch['inputs'].shape, batch['targets'].shape[1])] = None  # first-seen order
    real += np.count_nonzero(batch['inputs']) + np.count_nonzero(batch['targets'])
    slots += batch['inputs'].size + batch['targets'].size
  shapes = list(shapes)
  dev_shapes = {(b['inputs'].shape, b['targets'].shape) for b in datasets.dev.batches()}
  return shapes, {'train_shapes': len(shapes), 'dev_shapes': len(dev_shapes),
                  'batches_per_epoch': plan.num_batches, 'padding_efficiency': real / slots}


def compile_child(config_name: str, shapes: list[list[int]], cache: str, packed: bool) -> dict:
  """In a fresh process: compile the train step for each shape; seconds each."""
  import jax  # in the child only

  from t2t_jax.model.transformer import ModelConfig, Transformer
  from t2t_jax.platform import mesh as mesh_lib
  from t2t_jax.platform import xla
  from t2t_jax.training import optim, train_step
  xla.enable_compilation_cache(cache)
  config = common.get_config(config_name)
  config.vocab_size = 8000
  model_config = ModelConfig.from_config(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  tx = optim.make_optimizer(config)
  state = jax.eval_shape(lambda: train_step.create_train_state(Transformer(model_config), tx, 0,
                                                               mesh))
  train_fn, _ = train_step.compile_steps(model_config, tx, config.label_smoothing, mesh)
  seconds = []
  for rows, src, tgt in shapes:
    keys = train_step.MODEL_KEYS if packed else ('inputs', 'targets')
    batch = {key: jax.ShapeDtypeStruct((rows, src if key.startswith('inputs') else tgt),
                                       np.int32) for key in keys}
    start = time.perf_counter()
    train_fn.lower(state, batch).compile()
    seconds.append(time.perf_counter() - start)
  return {'seconds': seconds, 'backend': jax.default_backend(), 'dtype': model_config.dtype}


def run_child(config_name: str, shapes: list, cache: str, packed: bool) -> dict:
  env = dict(os.environ, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  out = subprocess.run([sys.executable, __file__, '--child', json.dumps(
      [config_name, shapes, cache, packed])], env=env, capture_output=True, text=True,
      check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def waits_child(config_name: str, corpus: str, steps: int, threads: int, workdir: str) -> None:
  """In a fresh process: train `steps` steps with compile-ahead on `threads` threads (0: off)."""
  from absl import logging  # in the child only

  from t2t_jax.modes import train as trainer
  from t2t_jax.platform import ahead
  logging.set_verbosity(logging.INFO)  # the log's last lines give the waits
  config = make_config(argparse.Namespace(config=config_name, corpus=corpus, band=2,
                                          growth=1.1))
  config.num_train_steps, config.compile_ahead = steps, threads > 0
  config.update(eval_every_steps=steps, log_every_steps=max(steps // 10, 1),
                checkpoint_every_minutes=0.0, compilation_cache_dir='')
  ahead.default_threads = lambda: threads
  trainer.train_and_evaluate(config, workdir)


def waits(args: argparse.Namespace) -> None:
  """Stepping's compile waits with compile-ahead off and on, in fresh processes."""
  from t2t_jax.platform import ahead
  threads = args.threads if args.threads >= 0 else ahead.default_threads()
  with tempfile.TemporaryDirectory() as tmp:
    # One vocabulary and id cache for both runs, made here, untimed.
    prepared = os.path.join(tmp, 'prepared')
    pipeline.get_datasets(make_config(args), prepared, num_devices=1)
    for run_threads in (0, max(threads, 1)):
      workdir = shutil.copytree(prepared, os.path.join(tmp, f'threads{run_threads}'))
      start = time.perf_counter()
      out = subprocess.run([sys.executable, __file__, '--child-waits', json.dumps(
          [args.config, args.corpus, args.steps, run_threads, workdir])],
          capture_output=True, text=True, check=True)
      seconds = time.perf_counter() - start
      found = re.search(r'Stepping waited ([\d.]+) s for compilations \((\d+) times\)',
                        out.stderr)
      common.emit({'benchmark': 'compilation', 'what': 'waits', 'config': args.config,
                   'corpus': args.corpus, 'steps': args.steps,
                   'compile_ahead_threads': run_threads,
                   'stepping_waited_s': float(found[1]), 'waits': int(found[2]),
                   'process_seconds': round(seconds, 1)})


def sweep(args: argparse.Namespace) -> None:
  """Shapes and padding efficiency of every SWEEP setting, one workdir (one vocabulary)."""
  with tempfile.TemporaryDirectory() as tmp:
    for band, growth in SWEEP:
      args.band, args.growth = band, growth
      _, stats = epoch_shapes(make_config(args), os.path.join(tmp, 'workdir'))
      line = {'benchmark': 'compilation', 'what': 'sweep', 'corpus': args.corpus,
              'bucket_band': band, 'bucket_growth': growth,
              **{k: round(v, 4) for k, v in stats.items()}}
      if args.shapes_per_minute:
        line['compile_ahead_minutes'] = round(stats['train_shapes'] / args.shapes_per_minute, 1)
      common.emit(line)


def batchings(args: argparse.Namespace) -> None:
  """Shapes and padding efficiency of the buckets and of packed rows, one vocabulary."""
  with tempfile.TemporaryDirectory() as tmp:
    for batching in ('buckets', 'packed'):
      args.batching = batching
      _, stats = epoch_shapes(make_config(args), os.path.join(tmp, 'workdir'))
      common.emit({'benchmark': 'compilation', 'what': 'batchings', 'corpus': args.corpus,
                   'batching': batching, 'bucket_band': args.band,
                   'bucket_growth': args.growth, 'pack_length': args.pack_length,
                   **{k: round(v, 4) for k, v in stats.items()}})


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', default='base', choices=sorted(common.CONFIGS))
  parser.add_argument('--shapes', type=int, default=3)
  parser.add_argument('--band', type=int, default=2)
  parser.add_argument('--growth', type=float, default=1.1)
  parser.add_argument('--corpus', default='wmt', choices=('wmt', 'debian'))
  parser.add_argument('--sweep', action='store_true', help='shape statistics for SWEEP')
  parser.add_argument('--batching', default='buckets', choices=('buckets', 'packed'))
  parser.add_argument('--pack-length', type=int, default=256)
  parser.add_argument('--batchings', action='store_true', help='both batchings\' statistics')
  parser.add_argument('--shapes-per-minute', type=float, default=0.0)
  parser.add_argument('--waits', action='store_true', help='compile waits, ahead off and on')
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--threads', type=int, default=-1)
  parser.add_argument('--child', default=None, help='(internal)')
  parser.add_argument('--child-waits', default=None, help='(internal)')
  args = parser.parse_args()
  if args.child:
    print(json.dumps(compile_child(*json.loads(args.child))))
    return
  if args.child_waits:
    return waits_child(*json.loads(args.child_waits))
  if args.sweep:
    return sweep(args)
  if args.batchings:
    return batchings(args)
  if args.waits:
    return waits(args)
  config = make_config(args)
  with tempfile.TemporaryDirectory() as tmp:
    shapes, stats = epoch_shapes(config, os.path.join(tmp, 'workdir'))
    common.emit({'benchmark': 'compilation', 'what': 'shapes', 'config': args.config,
                 'batching': args.batching, 'bucket_band': args.band,
                 'bucket_growth': args.growth, 'pack_length': args.pack_length,
                 **{k: round(v, 4) for k, v in stats.items()}})
    chosen = shapes[:args.shapes]
    # warm: the same shapes again, from the cache the cold run wrote
    for kind in ('cold', 'warm') if chosen else ():
      result = run_child(args.config, chosen, os.path.join(tmp, 'cache'),
                         args.batching == 'packed')
      mean = float(np.mean(result['seconds']))
      common.emit({'benchmark': 'compilation', 'what': 'compile', 'cache': kind,
                   'config': args.config, 'backend': result['backend'],
                   'dtype': result['dtype'], 'shapes': chosen,
                   'seconds': [round(s, 2) for s in result['seconds']],
                   'epoch_estimate_seconds': round(mean * stats['train_shapes'], 1)})


if __name__ == '__main__':
  main()
