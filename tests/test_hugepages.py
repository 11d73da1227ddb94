"""hugepages.py: when the re-exec happens, that it happens once, and that it gives huge pages."""
import os
import subprocess
import sys
import textwrap

import pytest

from t2t_jax.platform import hugepages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_WANTS_IT = (sys.platform == 'linux' and hugepages.wanted(
  {}, hugepages.glibc_version(), hugepages.thp_mode()))


@pytest.mark.parametrize('environ, glibc, mode, expected', [
  ({}, (2, 36), 'madvise', True),
  ({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'}, (2, 36), 'madvise', True),
  ({'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'}, (2, 36), 'madvise', False),  # the user's say
  ({'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}, (2, 36), 'madvise', False),  # done already
  ({}, (2, 34), 'madvise', False),  # the tunable is 2.35's
  ({}, None, 'madvise', False),  # musl, macOS
  ({}, (2, 36), 'always', False),  # huge pages without asking
  ({}, (2, 36), 'never', False),
  ({}, (2, 36), None, False),
])
def test_wanted(environ, glibc, mode, expected):
  assert hugepages.wanted(environ, glibc, mode) is expected


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
  path = tmp_path / 'enabled'
  path.write_text('always [madvise] never\n')
  assert hugepages.thp_mode(str(path)) == 'madvise'
  path.write_text('[always] madvise never\n')
  assert hugepages.thp_mode(str(path)) == 'always'
  assert hugepages.thp_mode(str(tmp_path / 'absent')) is None


SCRIPT = textwrap.dedent('''
  import ctypes, os, sys
  sys.path.insert(0, {repo!r})
  print('started', flush=True)
  from t2t_jax.platform import hugepages
  hugepages.reexec()
  libc = ctypes.CDLL(None)  # glibc's malloc itself (NumPy asks for huge pages on its own)
  libc.malloc.restype = ctypes.c_void_p
  x = libc.malloc(64 << 20)
  ctypes.memset(x, 1, 64 << 20)  # every page written
  with open('/proc/self/smaps_rollup') as f:
    huge = [line for line in f if line.startswith('AnonHugePages:')][0].split()[1]
  last = ctypes.string_at(x + (64 << 20) - 1, 1)[0]
  print('tunables', os.environ.get('GLIBC_TUNABLES'), 'huge_kib', huge, last)
''')


def _run(tmp_path, environ: dict[str, str]) -> list[str]:
  script = tmp_path / 'script.py'
  script.write_text(SCRIPT.format(repo=REPO))
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'} | environ
  done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                        text=True, check=True, timeout=60)
  return done.stdout.split('\n')


@pytest.mark.e2e
@pytest.mark.skipif(not HOST_WANTS_IT, reason='needs Linux, glibc >= 2.35, THP mode madvise')
def test_reexec_runs_the_script_again_once_and_gets_huge_pages(tmp_path):
  lines = _run(tmp_path, {})
  assert lines.count('started') == 2
  _, tunables, _, huge_kib, _ = lines[2].split()
  assert tunables == 'glibc.malloc.hugetlb=1'
  assert int(huge_kib) >= 32 << 10  # most of the 64 MiB in 2 MiB pages


@pytest.mark.e2e
@pytest.mark.skipif(not HOST_WANTS_IT, reason='needs Linux, glibc >= 2.35, THP mode madvise')
def test_reexec_keeps_other_tunables_and_a_users_no(tmp_path):
  lines = _run(tmp_path, {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'})
  assert lines.count('started') == 2
  assert lines[2].split()[1] == 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'
  lines = _run(tmp_path, {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'})
  assert lines.count('started') == 1  # not re-executed
  _, tunables, _, huge_kib, _ = lines[1].split()
  assert tunables == 'glibc.malloc.hugetlb=0'
  assert int(huge_kib) < 32 << 10  # 4 KiB pages: the re-exec is what gives huge ones


@pytest.mark.e2e
@pytest.mark.skipif(not HOST_WANTS_IT, reason='needs Linux, glibc >= 2.35, THP mode madvise')
def test_main_reexecs_before_importing_jax():
  env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
  # A quick command that imports JAX (--help answers before either).
  done = subprocess.run([sys.executable, '-X', 'importtime', '-m', 't2t_jax.main', '--mode=params',
                         '--config=experiments/demo.py'], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=120)
  imports = [line.split('|')[-1].strip() for line in done.stderr.split('\n') if '|' in line]
  first_jax = imports.index('jax')
  assert imports.count('t2t_jax.platform.hugepages') == 2  # once in each process
  hugepages = 't2t_jax.platform.hugepages'
  assert imports.index(hugepages, imports.index(hugepages) + 1) < first_jax
