"""The one exception a user acts on: `main` prints it in one line; anything else is a bug
and keeps its traceback (--traceback shows a UserError's too)."""
from __future__ import annotations

import errno

# The operating system's refusals that name their path and are the user's to fix: a full
# disk or quota, a missing permission, a read-only file system.
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


class UserError(ValueError):
  """A bad config key, input file or line, workdir or checkpoint, named in the message. A
  ValueError, so that code catching bad values keeps working; `main` prints only UserErrors
  as one line, so that an internal ValueError is never dressed up as a config mistake."""


class MissingFileError(UserError, FileNotFoundError):
  """A file the config or a flag names does not exist."""


# How TensorStore (orbax's array writer) reports a full disk: a ValueError, not an OSError,
# e.g. 'RESOURCE_EXHAUSTED: Error writing local file "...": ...'.
_FULL_DISK_TEXTS = ('No space left on device', 'Disk quota exceeded')


def is_disk_refusal(error: BaseException) -> bool:
  """The system refusing a write (a full disk or quota, a permission), whoever reports it.
  Not any RESOURCE_EXHAUSTED: out of memory is not the disk."""
  if isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS:
    return True
  text = str(error)
  return isinstance(error, ValueError) and (
      any(t in text for t in _FULL_DISK_TEXTS)
      or (text.startswith('RESOURCE_EXHAUSTED') and 'Error writing' in text))


def is_permission_refusal(error: BaseException) -> bool:
  """A read or write the system refused for a missing permission, whoever reports it: an
  OSError, or TensorStore's PERMISSION_DENIED (through orbax, perhaps wrapped)."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in (errno.EACCES, errno.EPERM):
      return True
    if 'PERMISSION_DENIED' in str(error) or 'Permission denied' in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False


def is_for_user(error: BaseException) -> bool:
  """Whether `main` shows `error` as one line: a UserError, or the system refusing a write."""
  return isinstance(error, UserError) or is_disk_refusal(error)


def summary(error: BaseException, limit: int = 300) -> str:
  """`Type: first line` of the error's root cause, for a log line: orbax wraps TensorStore's
  one-line reason (which file, which byte range) in an exception whose text is a
  60-line TensorStore spec."""
  while error.__cause__ is not None:
    error = error.__cause__
  lines = str(error).strip().splitlines()
  return f'{type(error).__name__}: {lines[0][:limit] if lines else ""}'.rstrip(': ')
