"""Crash-safe writes: a file or folder is complete or absent, never half there.

Temporary names that tell a killed writer's leftovers from a live one's, fsync before and
after renames, and disk errors (a full disk, a missing permission) as one line naming the
path. No JAX here: the input pipeline that uses it is plain numpy.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator

from absl import logging

from t2t_jax.platform import errors

# A temporary folder older than this is abandoned even if its pid looks alive (pids are
# reused); writing the vocabulary or the id cache takes minutes to an hour.
_STALE_AFTER_S = 24 * 3600


class DiskWriteError(errors.UserError, OSError):
  """A disk full, a missing permission...: one line naming the path, no traceback."""

  def __init__(self, path: str, what: str, cause: Exception):
    reason = getattr(cause, 'strerror', None) or str(cause).splitlines()[0][:300]
    super().__init__(f'{path}: cannot write {what}: {reason}')
    self.errno = getattr(cause, 'errno', None)


@contextlib.contextmanager
def disk_write_errors(path: str, what: str) -> Iterator[None]:
  """Turns an OSError inside (or a full disk as TensorStore reports it) into a
  DiskWriteError naming `path` and `what` it holds."""
  try:
    yield
  except (OSError, ValueError) as e:
    if isinstance(e, DiskWriteError) or not (isinstance(e, OSError) or errors.is_disk_refusal(e)):
      raise  # named already, or not the disk
    raise DiskWriteError(path, what, e) from e


def make_temp_dir(parent: str) -> str:
  """A new folder <parent>/.tmp-<host>-<pid>-<random> for writing, then renaming: host and pid
  let `sweep_temp_dirs` tell a dead writer's folder from a live one's on a shared disk."""
  path = tempfile.mkdtemp(prefix=f'.tmp-{_host()}-{os.getpid()}-', dir=parent)
  # mkdtemp makes it private (0700); once renamed into place it must read like any folder
  # os.makedirs would have made (an export, the demo corpus shared with other users).
  umask = os.umask(0o22)  # reading the umask means setting it: put it straight back
  os.umask(umask)
  os.chmod(path, 0o777 & ~umask)
  return path


_TEMP_NAME = re.compile(r'\.tmp-(?P<host>.*)-(?P<pid>\d+)-[^-]*')


def _host() -> str:
  """This host's name, and its pid namespace where there is one: containers that share a
  host name do not see each other's pids."""
  name = socket.gethostname().replace('/', '_') or 'host'
  try:
    namespace = os.stat('/proc/self/ns/pid').st_ino
  except OSError:  # not Linux
    return name
  return f'{name}.{namespace}'


def sweep_temp_dirs(parent: str, *, by_age: bool = True) -> None:
  """Removes temporary folders of killed writers in `parent`: this host's whose pid is gone,
  and (by_age) any older than a day, since another host's pid means nothing here. A folder
  not the workdir's own (an export's parent) is swept without by_age: there a `.tmp-*` of
  another program may be old and alive."""
  host = _host()
  try:
    names = [n for n in os.listdir(parent) if n.startswith('.tmp-')]
  except FileNotFoundError:
    return
  for name in names:
    path = os.path.join(parent, name)
    match = _TEMP_NAME.fullmatch(name)
    dead = match and match['host'] == host and not _pid_alive(int(match['pid']))
    try:
      old = by_age and time.time() - os.stat(path).st_mtime > _STALE_AFTER_S
    except FileNotFoundError:  # its writer just renamed or removed it
      continue
    if dead or old:
      logging.info('Removing %s, left by a killed run', path)
      shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)  # signal 0: only checks that the process exists
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  return True


def fsync_path(path: str) -> None:
  """Flushes a file's data, or a folder's entries (after a rename), to the disk."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  except OSError as e:
    if e.errno != errno.EINVAL:  # some file systems cannot sync a folder
      raise
  finally:
    os.close(fd)


def publish(tmp: str, path: str) -> bool:
  """Renames a written temporary file or folder `tmp` to `path`, data on the disk before the
  rename and the rename before returning: readers see all of it or nothing. A folder `path`
  that exists is kept (another writer was first) and False returned; a file is replaced."""
  if os.path.isdir(tmp):
    for name in os.listdir(tmp):
      fsync_path(os.path.join(tmp, name))
  fsync_path(tmp)
  try:
    os.replace(tmp, path)
  except OSError:
    if not os.path.isdir(path):
      raise
    return False
  fsync_path(os.path.dirname(os.path.abspath(path)))
  return True


def exists(path: str, what: str) -> bool:
  """os.path.exists, but a path we may not look at is an errors.UserError naming it and `what`
  it is, not False: a vocabulary or checkpoint behind a missing permission must not be taken
  for a missing one (and made anew)."""
  try:
    os.stat(path)
    return True
  except FileNotFoundError:
    return False
  except PermissionError as e:
    raise errors.UserError(f'{path}: {what} that cannot be read (permission denied: {e}); '
                           'give this user read access to it') from e


def check_writable_file(path: str, what: str) -> None:
  """Raises a UserError naming `path` unless a file can be written there: checked before
  the work that makes its content (decoding), not after."""
  if os.path.isdir(path):
    raise errors.UserError(f'{path}: is a folder; name a file to write {what} to')
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise errors.UserError(f'{path}: no folder {parent} to write {what} in')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise errors.UserError(f'{path}: cannot write {what}: no permission in {parent}')


def write_text(path: str, text: str) -> None:
  """Writes `path` whole or not at all (UTF-8, lines ending in '\\n'), through `publish`.
  A folder at `path` is an error naming it: nothing is written and nothing is lost."""
  check_writable_file(path, 'text')
  tmp = f'{path}.tmp-{os.getpid()}'
  try:
    with disk_write_errors(path, 'text'):
      with open(tmp, 'w', encoding='utf-8', newline='\n') as f:
        f.write(text)
      publish(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def set_aside_torn_tail(path: str) -> None:
  """An append-only file of lines (metrics.jsonl, provenance.jsonl) whose last line was cut
  (a full disk, a kill mid-write): the partial line is moved to PATH.torn with a warning,
  so the next record starts a line of its own and every line stays parseable."""
  try:
    with open(path, 'rb') as f:
      size = f.seek(0, os.SEEK_END)
      f.seek(max(size - 1, 0))
      if f.read(1) in (b'', b'\n'):  # empty, or whole lines
        return
      f.seek(0)
      data = f.read()
  except FileNotFoundError:
    return
  cut = data.rfind(b'\n') + 1
  with disk_write_errors(f'{path}.torn', 'the torn line'):
    with open(f'{path}.torn', 'ab') as torn:
      torn.write(data[cut:] + b'\n')
    os.truncate(path, cut)
  logging.warning('%s ended in a partial line (%d bytes, a write cut short); moved it to %s',
                  path, size - cut, f'{path}.torn')
