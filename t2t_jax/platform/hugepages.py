"""Transparent huge pages for XLA:CPU's buffers: glibc's malloc tunable, set by re-executing.

XLA:CPU allocates a computation's temporary buffers afresh each run, and glibc serves
allocations that large with mmap and frees them to the kernel, so every 4 KiB page of them (the
[tokens, 37000] logits and their gradient, for one) is faulted in and zeroed again at every
train step; a 2 MiB page takes one fault where 4 KiB pages take 512. The tunable
`glibc.malloc.hugetlb=1` (glibc >= 2.35) makes malloc ask for transparent huge pages (madvise);
on a kernel in THP mode 'madvise', the common default, nothing else gets them.

Tunables are read as the process starts, so entry points call `reexec()` before importing
anything else (`glibc.malloc.hugetlb=0` in GLIBC_TUNABLES keeps 4 KiB pages). Results are
bitwise the same: only where the memory comes from changes (docs/performance.md).
"""
from __future__ import annotations

import contextlib
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
  return (glibc is not None and glibc >= (2, 35) and mode == 'madvise'
          and TUNABLE not in environ.get('GLIBC_TUNABLES', ''))


def reexec() -> None:
  """Re-executes this command line (os.execve: same PID and file descriptors) with
  glibc.malloc.hugetlb=1 when `wanted`, else returns. Call it first thing in a program's
  `__main__`, never from a library: it replaces the running process."""
  if sys.platform != 'linux' or not wanted(os.environ, glibc_version(), thp_mode()):
    return
  before = os.environ.get('GLIBC_TUNABLES')
  environ = {**os.environ, 'GLIBC_TUNABLES': f'{before}:{TUNABLE}=1' if before else f'{TUNABLE}=1'}
  sys.stdout.flush()
  sys.stderr.flush()
  with contextlib.suppress(OSError):  # still this process: go on with 4 KiB pages
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
