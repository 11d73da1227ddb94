"""The workdir as a place: local paths only, one trainer at a time, provenance records, and
moving old results aside instead of deleting them."""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from t2t_jax.platform import distributed, errors, files

LOCK = 'train.lock'
CONFIG = 'config.json'
PROVENANCE = 'provenance.jsonl'
# The stack whose versions each training invocation records (PROVENANCE).
STACK = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy', 'ml-collections',
         'sentencepiece', 'sacrebleu', 'sacremoses', 'tensorflow-datasets', 'tensorflow-cpu',
         't2t_jax')
# What a training run writes, as opposed to its reusable inputs (vocab/, data_cache/,
# demo_corpus/): config.restart=True moves these aside.
RUN_OUTPUTS = ('checkpoints', 'averaged', 'eval', 'attention', 'metrics.jsonl', 'tensorboard',
               CONFIG, PROVENANCE)
_SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*://')


class WorkdirBusy(errors.UserError):
  """Another training run holds the workdir's lock."""


def check_local(workdir: str) -> None:
  """Refuses a workdir that is a file, or a `scheme://` URL (gs://, s3://, ...): SentencePiece,
  the memory-mapped data cache, metrics.jsonl, TensorBoard and the lock use the local file
  API, so a URL would fail (or make a local folder 'gs:') only after hours of work."""
  if _SCHEME.match(workdir):
    raise errors.UserError(
        f'--workdir={workdir}: URLs are not supported as workdirs (the vocabulary, data cache, '
        'metrics and lock are written with the local file API). Use a local path, or a '
        'shared POSIX file system (NFS, Lustre, Filestore) mounted on every host.')
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise errors.UserError(f'--workdir={workdir}: is a file, not a folder; name a folder '
                           '(it is made if missing)')


@contextlib.contextmanager
def training_lock(workdir: str) -> Iterator[None]:
  """Holds an exclusive lock on DIR/train.lock for the life of a training run: a second
  trainer on the workdir is refused. An flock, which the kernel drops when its process dies,
  so the restart of a killed run takes it at once. Of several processes only process 0 locks,
  and all of them learn its answer, so they stop together."""
  handle, error = None, ''
  if jax.process_index() == 0:
    try:
      handle = _lock(os.path.join(workdir, LOCK))
    except WorkdirBusy as e:
      error = str(e)
  if jax.process_count() > 1 and not multihost_utils.broadcast_one_to_all(np.array(not error)):
    error = error or f'{workdir}: process 0 could not lock {LOCK}; see its log'
  if error:
    raise WorkdirBusy(error)
  try:
    yield
  finally:
    if handle is not None:
      handle.close()  # closing the file releases the flock


def _lock(path: str) -> Any:
  with files.disk_write_errors(path, 'the training lock (who holds the workdir)'):
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    handle = files.open_file(path, 'a+', 'the training lock')
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.seek(0)
    holder = handle.read().strip() or 'unknown process'
    handle.close()
    raise WorkdirBusy(
        f'{os.path.dirname(path)} is in use by another training run ({holder}); stop it, or '
        'use another --workdir. (A crashed run holds no lock: its restart takes over.)') from None
  except OSError as e:
    if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
      raise
    logging.warning('%s: this file system has no locks (%s); make sure no other training '
                    'run uses this workdir.', path, e.strerror)
    return handle
  started = datetime.datetime.now().isoformat(timespec='seconds')
  try:
    # The first write of a run: on a full disk its error names the workdir, not only errno.
    with files.disk_write_errors(path, 'the training lock (who holds the workdir)'):
      handle.truncate(0)
      handle.write(f'pid {os.getpid()} on {socket.gethostname()}, since {started}\n')
      handle.flush()
  except files.DiskWriteError:
    with contextlib.suppress(OSError):  # closing flushes the unwritten line again
      handle.close()
    raise
  return handle


def record_invocation(workdir: str, step: int) -> None:
  """Appends to DIR/provenance.jsonl what this training invocation runs on (host, command line,
  first step, devices, the versions of STACK, the code's git revision...), so that every
  checkpoint can be traced to the code and libraries that made it."""
  if jax.process_index() != 0:
    return
  record = {'time': datetime.datetime.now().isoformat(timespec='seconds'),
            'host': socket.gethostname(), 'argv': sys.argv, 'first_step': step + 1,
            'python': platform.python_version(), 'processes': jax.process_count(),
            'devices': f'{jax.device_count()} × {jax.devices()[0].device_kind}',
            'versions': {name: _version(name) for name in STACK}, 'code': code_revision()}
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, PROVENANCE)
  if os.path.isdir(path):
    raise errors.UserError(f'{path}: a folder, where the run appends its provenance records; '
                           'move it out of the workdir')
  files.set_aside_torn_tail(path)
  with files.disk_write_errors(path, 'the provenance record'):
    with files.open_file(path, 'a', 'the provenance records') as f:
      f.write(json.dumps(record, sort_keys=True) + '\n')


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None  # not installed (e.g. the optional TensorFlow extra)


def code_revision() -> dict[str, Any]:
  """{'revision': git commit of this code, 'dirty': uncommitted changes} ({} outside git)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    revision = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    status = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'],
                            cwd=root, capture_output=True, text=True, timeout=10, check=True)
  except (OSError, subprocess.SubprocessError):  # no git, or not a checkout (a wheel)
    return {}
  return {'revision': revision, 'dirty': bool(status.stdout.strip())}


def move_aside(workdir: str, names: list[str], why: str) -> str | None:
  """Moves DIR/<name> for each existing name into DIR/previous-<time>/, and returns that
  folder: a restart or an older restore_step keeps what it replaces. Every process calls it
  (process 0 moves, the others wait for it)."""
  target = _move_to_previous(workdir, names, why) if jax.process_index() == 0 else None
  distributed.sync('t2t_jax_move_aside')
  return target


def _move_to_previous(workdir: str, names: list[str], why: str) -> str | None:
  present = [n for n in names if os.path.exists(os.path.join(workdir, n))]
  if not present:
    return None
  stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
  target = os.path.join(workdir, f'previous-{stamp}')
  suffix = 1
  while os.path.exists(target):  # two moves within a second
    suffix += 1
    target = os.path.join(workdir, f'previous-{stamp}-{suffix}')
  for name in present:
    os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
    os.rename(os.path.join(workdir, name), os.path.join(target, name))
  logging.warning('%s: moved %s to %s', why, ', '.join(present), target)
  return target


def publish_output(workdir: str, tmp: str, name: str) -> None:
  """Publishes the written folder `tmp` as DIR/<name> (an averaged mean, an evaluation), whole
  or not at all, by one process (the caller's). An earlier output of that name stays until its
  replacement is complete, and is then moved into DIR/previous-<time>/, not deleted."""
  path = os.path.join(workdir, name)
  if files.publish(tmp, path):
    return
  _move_to_previous(workdir, [name], f'{path} is replaced')
  if not files.publish(tmp, path):  # another writer published the same output meanwhile
    shutil.rmtree(tmp, ignore_errors=True)
