"""Keeps the libraries' duplicate reports of one failure out of the log.

When orbax reads or writes a checkpoint, TensorStore runs one asyncio task per array. If the
files are damaged or the disk is full, every task fails, the caller gets one exception (which
checkpoints.py names in one line), and the other tasks' failures surface again, hundreds of
lines around the two that matter: as asyncio's "Task exception was never retrieved", as
Python's "Exception ignored in: <coroutine ...>", and as the tracebacks orbax's background
threads log. Only these repeats are dropped, through logging's filters and Python's unraisable
hook; anything that does not pass through orbax's code still shows.
"""
from __future__ import annotations

import logging
import os
import sys
import types

from absl import logging as absl_logging

from t2t_jax.platform import errors


def install() -> None:
  """Filters absl's handler (which every log record reaches) and Python's unraisable hook.
  Idempotent: main may run several commands in one process."""
  handler = absl_logging.get_absl_handler().python_handler
  if not any(isinstance(f, QuietLibraries) for f in handler.filters):
    handler.addFilter(QuietLibraries())
  default_hook = sys.unraisablehook
  if not getattr(default_hook, 'drops_orbax_repeats', False):
    def hook(unraisable) -> None:
      if not (_through_orbax(unraisable.exc_traceback, unraisable.object)
              or _native_call_to_closed_loop(unraisable)):
        default_hook(unraisable)
    hook.drops_orbax_repeats = True
    sys.unraisablehook = hook  # Python's documented way to install the hook


def drop_orbax_metadata_warning() -> None:
  """For the library's own use (the Python API has no handler filter of main's): orbax
  warns on every read of a step's item that the item has no `_CHECKPOINT_METADATA` file of
  its own, which it never has (the step directory has it). Idempotent."""
  logging.getLogger('absl').addFilter(_not_metadata_warning)  # orbax logs through absl's


def _not_metadata_warning(record: logging.LogRecord) -> bool:
  return not ('/orbax/' in record.pathname
              and str(record.msg).startswith('Metadata file does not exist'))


# The package's own files: their INFO lines are the run's log; the libraries' (JAX's backend
# probing and cache resets, orbax's files) show from --verbosity=1 on.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class QuietLibraries(logging.Filter):
  """Drops the libraries' INFO lines below --verbosity=1, orbax's per-file INFO chatter, its
  metadata warning (drop_orbax_metadata_warning), the tracebacks its background threads log
  for a full disk or a refused write (the training loop names the folder in one line), and
  asyncio's reports of orbax tasks whose failure was already raised to the caller. Other
  warnings still show."""

  def filter(self, record) -> bool:
    if (record.levelno < logging.WARNING and not record.pathname.startswith(_PACKAGE)
        and absl_logging.get_verbosity() < 1):
      return False
    error = record.exc_info[1] if record.exc_info else None
    if record.name == 'asyncio' and error is not None:
      # An orbax task's failure, or a TensorStore read or write whose error (it ends in its
      # spec) orbax raised to the caller too: asyncio reports its future when collected.
      return not (_through_orbax(error.__traceback__) or '[tensorstore_spec=' in str(error))
    if '/orbax/' not in record.pathname:
      return True
    reported = error is not None and errors.is_disk_refusal(error)
    return record.levelno >= logging.WARNING and _not_metadata_warning(record) and not reported


def _native_call_to_closed_loop(unraisable) -> bool:
  """TensorStore's threads hand each finished read or write to orbax's asyncio loop, which
  orbax has closed after a failed save or restore: each hand-over then fails with "Event loop
  is closed", from native code (no Python frame below call_soon_threadsafe), as unraisable."""
  traceback, error = unraisable.exc_traceback, unraisable.exc_value
  return (unraisable.object is None and isinstance(error, RuntimeError)
          and str(error) == 'Event loop is closed' and traceback is not None
          and traceback.tb_frame.f_code.co_name == 'call_soon_threadsafe'
          and '/asyncio/' in traceback.tb_frame.f_code.co_filename)


def _through_orbax(traceback: types.TracebackType | None, origin: object = None) -> bool:
  """Whether an exception was raised in orbax's code (or escaped one of its coroutines), or
  in a TensorStore future that orbax handed to asyncio as a task of its own: that task's
  traceback holds only asyncio's frame, whose `awaitable` is the future."""
  code = getattr(origin, 'cr_code', None)
  if code is not None and '/orbax/' in code.co_filename:
    return True
  while traceback is not None:
    frame = traceback.tb_frame
    if '/orbax/' in frame.f_code.co_filename:
      return True
    awaited = frame.f_locals.get('awaitable') if '/asyncio/' in frame.f_code.co_filename else None
    if type(awaited).__module__.startswith('tensorstore'):
      return True
    traceback = traceback.tb_next
  return False
