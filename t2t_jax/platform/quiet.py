"""Plumbing, no paper: keeps the libraries' duplicate reports of one failure out of the log.

When orbax reads or writes a checkpoint, TensorStore runs one asyncio task per array. If the
files are damaged or the disk is full, every task fails, the caller gets one exception
(which checkpoints.py names in one line), and the failures of the other tasks surface
again: as asyncio's "Task exception was never retrieved", as Python's "Exception ignored
in: <coroutine ...>", and as the tracebacks orbax's background threads log. A truncated
checkpoint once printed 500 such lines around the two that mattered. Only these repeats are
dropped, through logging's filters and Python's unraisable hook (with asyncio's "Event loop
is closed" of each TensorStore hand-over to the loop orbax closed after the failure);
anything that does not pass through orbax's code still shows.
"""
from __future__ import annotations

import logging
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
  logger = logging.getLogger('absl')  # orbax logs through absl's logger
  if not any(isinstance(f, _OrbaxMetadataWarning) for f in logger.filters):
    logger.addFilter(_OrbaxMetadataWarning())


class _OrbaxMetadataWarning(logging.Filter):
  def filter(self, record) -> bool:
    return not _is_metadata_warning(record)


def _is_metadata_warning(record: logging.LogRecord) -> bool:
  return ('/orbax/' in record.pathname
          and str(record.msg).startswith('Metadata file does not exist'))


_TENSORSTORE_ERROR = '[tensorstore_spec='  # how TensorStore's error messages end


class QuietLibraries(logging.Filter):
  """Drops orbax's per-file INFO chatter, its warning that a checkpoint item (params/) has
  no metadata file of its own (the step directory has it), the tracebacks its background
  threads log for a full disk or a refused write (the training loop names the folder in
  one line), and asyncio's reports of orbax tasks whose failure was already raised to the
  caller. Other warnings still show."""

  def filter(self, record) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if record.name == 'asyncio' and error is not None:
      # An orbax task's failure, or a TensorStore read or write whose error (it names its
      # spec) orbax raised to the caller too: asyncio reports its future when collected.
      return not (_through_orbax(error.__traceback__) or _TENSORSTORE_ERROR in str(error))
    if '/orbax/' not in record.pathname:
      return True
    reported = error is not None and errors.is_disk_refusal(error)
    return (record.levelno >= logging.WARNING and not _is_metadata_warning(record)
            and not reported)


def _native_call_to_closed_loop(unraisable) -> bool:
  """TensorStore's threads hand each finished read or write to orbax's asyncio loop; after a
  failed save or restore orbax has closed that loop, and each hand-over fails with asyncio's
  "Event loop is closed", raised with no Python frame below call_soon_threadsafe (its caller
  is native code) and reported as unraisable. A Python caller gets the RuntimeError as
  before."""
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
