"""Where the benchmarks find the real 10k-pair WMT EN-DE sample: $T2T_WMT_SAMPLE.

A folder with train.{en,de} and newstest2013.{en,de}; no path of one machine is built in
(WORKSPACE.md says where the team's copy is). The benchmarks import this module by name:
Python puts a script's own folder (benchmarks/) first on sys.path.
"""
from __future__ import annotations

import os
import sys

VARIABLE = 'T2T_WMT_SAMPLE'


def prefix(name: str) -> str:
  """PREFIX of the sample's PREFIX.en and PREFIX.de, for name 'train' or 'newstest2013'."""
  folder = os.environ.get(VARIABLE, '')
  path = os.path.join(folder, name)
  if not folder or not os.path.isfile(f'{path}.en'):
    sys.exit(f'{sys.argv[0]}: {VARIABLE}={folder!r}: set it to the folder of the 10k-pair WMT '
             f'sample (train.en, train.de, newstest2013.en, newstest2013.de)')
  return os.path.abspath(path)
