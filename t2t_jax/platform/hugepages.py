"""Transparent huge pages for XLA:CPU's buffers: glibc's malloc tunable, set by re-executing.

XLA:CPU allocates a computation's temporary buffers afresh each time it runs it, and glibc
serves allocations that large with mmap and gives them back to the kernel on free. Every
4 KiB page of them is then faulted in and zeroed again at every train step: the [tokens,
37000] logits and their gradient alone are 300 MB each in a base step. A 2 MiB page takes
one fault where 4 KiB pages take 512, so writing a fresh buffer is then mostly the writing
itself. Under the tunable `glibc.malloc.hugetlb=1`
(glibc >= 2.35), malloc asks the kernel for transparent huge pages on its own mappings
(madvise); on a kernel whose THP mode is 'madvise', the common default, nothing else gets
them.

Tunables are read once, as the process starts, so the command-line entry points (main.py,
the benchmarks) call `reexec()` before importing anything else: it runs the same command
line again in this process (os.execv: same PID and file descriptors; nothing has run yet)
with the tunable added, when that helps: Linux, glibc >= 2.35, THP mode 'madvise', and
GLIBC_TUNABLES not naming the tunable already (set `glibc.malloc.hugetlb=0` in it to keep
4 KiB pages). Results are bitwise the same either way: only where the memory comes from
changes. It saves most of a train step's page faults and system time (docs/performance.md);
beam decoding, whose loop allocates its buffers once a search, is unchanged.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

TUNABLE = 'glibc.malloc.hugetlb'
THP_ENABLED = '/sys/kernel/mm/transparent_hugepage/enabled'


def thp_mode(path: str = THP_ENABLED) -> str | None:
  """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'), None if unknown."""
  try:
    with open(path) as f:
      match = re.search(r'\[(\w+)\]', f.read())
  except OSError:
    return None
  return match.group(1) if match else None


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the C library's glibc, None for another C library or platform."""
  try:
    name, version = os.confstr('CS_GNU_LIBC_VERSION').split()
  except (AttributeError, ValueError, OSError):
    return None
  major, minor = version.split('.')[:2]
  return (int(major), int(minor)) if name == 'glibc' else None


def wanted(environ: Mapping[str, str], glibc: tuple[int, int] | None, mode: str | None) -> bool:
  """Whether re-executing with the tunable would give this process huge pages it lacks."""
  if glibc is None or glibc < (2, 35) or mode != 'madvise':
    return False
  return TUNABLE not in environ.get('GLIBC_TUNABLES', '')


def reexec() -> None:
  """Re-executes this command line with glibc.malloc.hugetlb=1 when `wanted`; else returns.

  Call it first thing in a program's `__main__`, never from a library: it replaces the
  running process.
  """
  if sys.platform != 'linux' or not wanted(os.environ, glibc_version(), thp_mode()):
    return
  before = os.environ.get('GLIBC_TUNABLES')
  os.environ['GLIBC_TUNABLES'] = f'{before}:{TUNABLE}=1' if before else f'{TUNABLE}=1'
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
  except OSError:
    # Still this process: go on with 4 KiB pages, the environment as it was.
    if before is None:
      del os.environ['GLIBC_TUNABLES']
    else:
      os.environ['GLIBC_TUNABLES'] = before
