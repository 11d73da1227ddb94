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
import stat
import tempfile
import time
from collections.abc import Iterator
from typing import IO

from absl import logging

from t2t_jax.platform import errors

# New files and folders: the process's umask applies, and they are never writable by every
# user, whatever the umask.
FILE_MODE, FOLDER_MODE = 0o664, 0o775
# How each open() mode opens a file: never through a symbolic link at the path itself
# (O_NOFOLLOW), so that a link planted in a workdir from someone else cannot send a write
# anywhere else.
_OPEN_FLAGS = {'w': os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               'x': os.O_WRONLY | os.O_CREAT | os.O_EXCL,
               'a': os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               'a+': os.O_RDWR | os.O_CREAT | os.O_APPEND, 'r+': os.O_RDWR}
# A temporary folder older than this is abandoned even if its pid looks alive (pids are
# reused); writing the vocabulary or the id cache takes minutes to an hour.
_STALE_AFTER_S = 24 * 3600


class DiskWriteError(errors.UserError, OSError):
  """A disk full, a missing permission...: one line naming the path, no traceback."""

  def __init__(self, path: str, what: str, cause: Exception):
    reason = getattr(cause, 'strerror', None) or str(cause).splitlines()[0][:300]
    super().__init__(f'{path}: cannot write {what}: {reason}')
    self.errno = getattr(cause, 'errno', None)


class LinkRefused(errors.UserError):
  """A symbolic link where the project writes a file or a folder."""

  def __init__(self, path: str, what: str):
    super().__init__(f'{path}: a symbolic link, where t2t_jax writes {what}; it writes nothing '
                     'through a link (one in a run from someone else could point anywhere): '
                     'remove the link, or copy the run without links')


def open_file(path: str, mode: str, what: str) -> IO:
  """open(path, mode) for writing ('w', 'x', 'a', 'a+', 'r+', each + 'b' for bytes; text is
  UTF-8 with '\\n' line ends), except that a symbolic link at `path` is a LinkRefused naming
  `what` the file holds, and a new file gets FILE_MODE under the umask."""
  binary = 'b' in mode
  base = mode.replace('b', '')
  try:
    fd = os.open(path, _OPEN_FLAGS[base] | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise LinkRefused(path, what) from None
    raise
  python_mode = {'x': 'w', 'r+': 'r+', 'a+': 'a+'}.get(base, base) + ('b' if binary else '')
  if binary:
    return os.fdopen(fd, python_mode)
  return os.fdopen(fd, python_mode, encoding='utf-8', newline='\n')


def make_folder(path: str, root: str, what: str) -> str:
  """Makes the folder `path` inside the folder `root` (e.g. WORKDIR/eval in WORKDIR) where
  missing, and returns it: every level below `root` must be a real folder, not a symbolic
  link (LinkRefused) or a file; `root`, the user's, is made as os.makedirs would. A refusal of
  the disk (read-only, full) is a DiskWriteError."""
  relative = os.path.relpath(path, root)
  if relative == os.pardir or relative.startswith(os.pardir + os.sep):
    raise ValueError(f'{path} is not inside {root}')
  if not os.path.isdir(root):
    with disk_write_errors(root, what):
      os.makedirs(root, exist_ok=True)
  current = root
  for part in [p for p in relative.split(os.sep) if p not in ('', os.curdir)]:
    current = os.path.join(current, part)
    with disk_write_errors(current, what):
      try:
        mode = os.lstat(current).st_mode
      except FileNotFoundError:
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
          os.mkdir(current, FOLDER_MODE)
        mode = os.lstat(current).st_mode
    if stat.S_ISLNK(mode):
      raise LinkRefused(current, what)
    if not stat.S_ISDIR(mode):
      raise errors.UserError(f'{current}: a file, where t2t_jax writes {what} (a folder); '
                             'move it away')
  return path


def writable_folder(path: str, root: str, what: str) -> str:
  """make_folder, then a UserError unless this process can write in it: checked before the work
  whose result goes there (decoding, averaging), not after."""
  make_folder(path, root, what)
  if not os.access(path, os.W_OK | os.X_OK):
    raise errors.UserError(f'{path}: cannot write {what}: {_why_not_writable(path)}')
  return path


def _why_not_writable(path: str) -> str:
  try:
    if os.statvfs(path).f_flag & os.ST_RDONLY:
      return 'a read-only file system'
  except OSError:
    pass
  return 'no permission to write in it'


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
  os.chmod(path, FOLDER_MODE & ~umask)
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


def unreadable(path: str) -> str | None:
  """The first file or folder at or under `path` that this process may not read (a folder: list
  and enter), or None: a permission is not corruption, and must not be treated as such."""
  if os.path.lexists(path) and not os.access(
      path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
    return path
  for folder, dirs, names in os.walk(path):
    for name in dirs + names:
      entry = os.path.join(folder, name)
      if not os.access(entry, os.R_OK | (os.X_OK if name in dirs else 0)):
        return entry
  return None


def check_writable_file(path: str, what: str) -> None:
  """Raises a UserError naming `path` unless a file can be written there: checked before
  the work that makes its content (decoding), not after."""
  if os.path.isdir(path):
    raise errors.UserError(f'{path}: is a folder; name a file to write {what} to')
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise errors.UserError(f'{path}: no folder {parent} to write {what} in')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise errors.UserError(f'{path}: cannot write {what} in {parent}: '
                           f'{_why_not_writable(parent)}')


def write_text(path: str, text: str) -> None:
  """Writes `path` whole or not at all (UTF-8, lines ending in '\\n'), through `publish`.
  A folder at `path` is an error naming it: nothing is written and nothing is lost."""
  check_writable_file(path, 'text')
  tmp = f'{path}.tmp-{os.getpid()}'
  try:
    with disk_write_errors(path, 'text'):
      with contextlib.suppress(FileNotFoundError):  # a killed writer's of the same pid, or a link
        os.remove(tmp)
      with open_file(tmp, 'x', 'text') as f:
        f.write(text)
      publish(tmp, path)
  finally:
    if os.path.lexists(tmp):
      os.remove(tmp)


def set_aside_torn_tail(path: str) -> None:
  """An append-only file of lines (metrics.jsonl, provenance.jsonl) whose last line was cut
  (a full disk, a kill mid-write): the partial line is moved to PATH.torn with a warning,
  so the next record starts a line of its own and every line stays parseable."""
  what = 'records, a line each'
  try:
    f = open_file(path, 'r+b', what)
  except FileNotFoundError:
    return
  with f:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(size - 1, 0))
    if f.read(1) in (b'', b'\n'):  # empty, or whole lines
      return
    f.seek(0)
    data = f.read()
    cut = data.rfind(b'\n') + 1
    with disk_write_errors(f'{path}.torn', 'the torn line'):
      with open_file(f'{path}.torn', 'ab', 'the torn line') as torn:
        torn.write(data[cut:] + b'\n')
      f.truncate(cut)
  logging.warning('%s ended in a partial line (%d bytes, a write cut short); moved it to %s',
                  path, size - cut, f'{path}.torn')
