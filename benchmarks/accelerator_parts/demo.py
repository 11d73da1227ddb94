"""The demo part: the built-in demo end to end in fresh processes (make demo's modes), then
beam 4 with its trained weights (trained_search)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

from accelerator_parts.shared import CHILD_ENV, ROOT, emit, time_search
from t2t_jax.apps import translator
from t2t_jax.decoding import batch_plan
from t2t_jax.platform import mesh as mesh_lib

COMPILE_LOG = re.compile(r'Finished XLA compilation of (.+?) in ([0-9.e+-]+) ?s')


def bench_demo(size: dict, out: str | None, batchings: list[str]) -> list[dict]:
  """The demo's chain for each of `batchings`."""
  return [line for batching in batchings for line in bench_demo_chain(size, out, batching)]


def bench_demo_chain(size: dict, out: str | None, batching: str) -> list[dict]:
  """The demo's chain (make demo without translate) in a fresh workdir, the cache off, with
  config.batching=`batching`: a line after each mode, so that a run cut short keeps what it
  measured."""
  lines = []
  with tempfile.TemporaryDirectory() as workdir:
    env = dict(os.environ, JAX_LOG_COMPILES='1', **CHILD_ENV)
    for mode in ('train', 'average', 'eval'):
      t0 = time.perf_counter()
      result = subprocess.run(
          [sys.executable, '-m', 't2t_jax.main', '--config=experiments/demo.py',
           f'--workdir={workdir}', f'--mode={mode}', "--config.compilation_cache_dir=",
           f'--config.batching={batching}', *size['demo']], cwd=ROOT, env=env,
          capture_output=True, text=True)
      if result.returncode:
        raise RuntimeError(f'demo --mode={mode} failed:\n{result.stderr[-3000:]}')
      line = {'part': 'demo', 'batching': batching, 'mode': mode,
              'seconds': round(time.perf_counter() - t0, 1),
              'compile_s': round(sum(float(s) for _, s in COMPILE_LOG.findall(result.stderr)), 1),
              'compilations': len(COMPILE_LOG.findall(result.stderr))}
      if mode == 'eval':
        [scores] = [os.path.join(root, 'scores.json') for root, _, files in
                    os.walk(os.path.join(workdir, 'eval')) if 'scores.json' in files]
        with open(scores) as f:
          line['sacrebleu'] = json.load(f)['sacrebleu']
      lines.append(emit(line, out))
    lines += bench_trained_search(workdir, size, out, batching)
  return lines


def bench_trained_search(workdir: str, size: dict, out: str | None, batching: str) -> list[dict]:
  """Beam 4 with the demo's trained (averaged) weights over its first test sentences, as
  many as each of size['sentences'] (repeated where the test set is shorter; rounded up to
  a multiple of the devices), one batch of
  the bucket of the longest, early stopping on as in eval: sentences a second. Random
  weights (the decode part) rarely end a sentence; trained ones end most early."""
  tr = translator.Translator.from_workdir(workdir, {'compilation_cache_dir': ''})
  with open(os.path.join(workdir, 'demo_corpus', 'test.en'), encoding='utf-8') as f:
    test = f.read().splitlines()
  _, encoded = batch_plan.encode_inputs(test, tr.tokenizer, tr.max_input_length)
  lines, decoder = [], tr.decoder()
  for asked in size['sentences']:
    rows = -(-asked // tr.mesh.size) * tr.mesh.size  # a whole number of rows a device
    chosen = [encoded[i % len(encoded)] for i in range(rows)]
    length = -(-max(len(ids) for ids in chosen) // 8) * 8
    src = np.zeros((rows, length), np.int32)
    for r, ids in enumerate(chosen):
      src[r, :len(ids)] = ids
    src = mesh_lib.shard_batch({'src': src}, tr.mesh)['src']
    args = (tr.decoding_params, src, np.float32(tr.config.beam_alpha))
    t0 = time.perf_counter()
    compiled = decoder.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    seconds, ids = time_search(compiled, args)
    lines.append(emit({'part': 'trained_search', 'batching': batching, 'sentences': rows,
                       'source_length': length, 'weights': 'demo, trained',
                       'ms': round(seconds * 1e3, 1), 'sentences_per_s': round(rows / seconds, 1),
                       'output_tokens': int((np.asarray(ids) != 0).sum()),
                       'compile_s': round(compile_s, 1)}, out))
  return lines
