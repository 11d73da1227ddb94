"""What every benchmark script shares: its start-up, the configs it names, its inputs and output.

A script in benchmarks/ begins

  import common  # benchmarks/common.py: the repository on sys.path
  common.start(__name__)  # before JAX is imported

Python puts a script's own folder first on sys.path, so `import common` finds this file;
importing it puts the repository root there too (`experiments`, `t2t_jax`). A script in
benchmarks/peers/ puts benchmarks/ on sys.path itself first.

`start` re-executes the script with glibc's huge pages for XLA's buffers
(t2t_jax/platform/hugepages.py) when it runs as a program, then sets this codebase's XLA:CPU
flags (xla.configure_cpu): the first before any heavy import, which the new process would
only repeat, the second before JAX starts its CPU backend. A script imported
by another script or a test does not re-execute (only `__main__` does), and configure_cpu
leaves flags already set alone. Exceptions, each said where it starts: data_memory.py keeps
4 KiB pages (its figures are RSS), decode.py sets the flags after reading --devices, and
peers/torch_decode.py, which runs no JAX, does neither.

CONFIGS is the one table of the configs the benchmarks name on their command lines; the
peers take their model shapes from it too (model_dims).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, 'benchmarks')
PEERS = os.path.join(BENCHMARKS, 'peers')
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# --config NAME: experiments/<module>.py.
CONFIGS = {'base': 'wmt_ende_base', 'big': 'wmt_ende_big', 'demo': 'demo'}
EOS_ID = 1  # t2t_jax.decoding.decode.EOS_ID, without importing JAX


def start(name: str, *, huge_pages: bool = True, xla_flags: bool = True) -> None:
  """The start-up of a benchmark script: call it with the module's `__name__` before
  importing JAX. With `name == '__main__'` and `huge_pages`, re-executes this command line
  with glibc.malloc.hugetlb=1 when that gives XLA's buffers huge pages (else returns); then,
  with `xla_flags`, sets the XLA:CPU flags of every entry point (xla.configure_cpu)."""
  if huge_pages and name == '__main__':
    from t2t_jax.platform import hugepages  # imports nothing but stdlib
    hugepages.reexec()
  if xla_flags:
    from t2t_jax.platform import xla  # after the re-execution
    xla.configure_cpu()


def config_module(name: str) -> ModuleType:
  """The experiments/ module of CONFIGS[name]."""
  return importlib.import_module(f'experiments.{CONFIGS[name]}')


def get_config(name: str) -> Any:
  """A fresh ml_collections.ConfigDict of CONFIGS[name]."""
  return config_module(name).get_config()


def model_dims(name: str) -> dict[str, int]:
  """The model shape of CONFIGS[name], for the peers, which build their own models."""
  config = get_config(name)
  return dict(vocab_size=config.vocab_size, d_model=config.model.d_model,
              num_heads=config.model.num_heads, d_ff=config.model.d_ff,
              num_layers=config.model.num_layers)


def import_peer(name: str) -> ModuleType:
  """benchmarks/peers/<name>.py, imported only when a script is asked for the peer."""
  if PEERS not in sys.path:
    sys.path.insert(0, PEERS)
  return importlib.import_module(name)


def random_ids(rows: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """[rows, length] int32 ids in [3, vocab_size): real tokens, no padding, no EOS."""
  return np.random.default_rng(seed).integers(3, vocab_size, (rows, length), dtype=np.int32)


def random_sources(rows: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
  """random_ids ending in EOS: sentences to decode, each with the full length limit."""
  src = random_ids(rows, length, vocab_size, seed)
  src[:, -1] = EOS_ID
  return src


def emit(line: dict, out: str | None = None) -> dict:
  """Prints `line` as one JSON line (and appends it to the file `out`); returns it."""
  print(json.dumps(line), flush=True)
  if out:
    with open(out, 'a') as f:
      f.write(json.dumps(line) + '\n')
  return line


WMT_SAMPLE = 'T2T_WMT_SAMPLE'


def wmt_sample(name: str) -> str:
  """PREFIX of the real 10k-pair WMT EN-DE sample's PREFIX.en and PREFIX.de, for name 'train'
  or 'newstest2013', from the folder $T2T_WMT_SAMPLE (train.{en,de}, newstest2013.{en,de});
  no path of one machine is built in (docs/performance.md says what the sample is)."""
  folder = os.environ.get(WMT_SAMPLE, '')
  path = os.path.join(folder, name)
  if not folder or not os.path.isfile(f'{path}.en'):
    sys.exit(f'{sys.argv[0]}: {WMT_SAMPLE}={folder!r}: set it to the folder of the 10k-pair WMT '
             f'sample (train.en, train.de, newstest2013.en, newstest2013.de)')
  return os.path.abspath(path)
