"""Progress of the long steps besides training (the vocabulary, encoding, decoding).

A step logs its `line` once FIRST_LINE_S have passed, then at most every EVERY_S, and one line
when it ends, so that quick steps add one line each, never a flood; on a terminal, a live bar
shows it too, erased before each log line. Callers pass `enabled` (one process of a run shows
progress): this module imports no jax, so that every layer may import it.

Why not tqdm or clu's progress: their bar writes to a stream; this puts a step's progress in
absl's log (and --log_dir's files, which a preempted cluster job keeps) as lines at a set pace,
with an ETA weighted by each piece's cost (decoding's batches differ tenfold).
"""
from __future__ import annotations

import contextlib
import itertools
import logging as std_logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

from absl import logging

T = TypeVar('T')

# Read when used, not when defined, so that a test can set them to 0.
FIRST_LINE_S = 10.0  # a step done sooner logs only its final line
EVERY_S = 30.0  # tens of lines over an hour of encoding WMT EN→FR, a few over a decode
BAR_EVERY_S = 0.2  # a terminal redraw costs little, but not on every sentence
_BAR_WIDTH = 24  # characters of the bar itself, between its brackets


def format_duration(seconds: float) -> str:
  """'m:ss', or 'h:mm:ss' from an hour on."""
  minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}:{minutes:02d}:{secs:02d}' if hours else f'{minutes}:{secs:02d}'


def _number(x: float) -> str:
  """A rate with as many digits as help: 52,118 / 12.5 / 0.42 (9.996 is 10.0, not 10.00)."""
  if round(x) >= 100:
    return f'{x:,.0f}'
  return f'{x:.1f}' if round(x, 1) >= 10 else f'{x:.2f}'


def _is_terminal(stream: TextIO) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):  # not a file, or a closed one
    return False


def _columns(stream: TextIO) -> int:
  try:
    return os.get_terminal_size(stream.fileno()).columns
  except (AttributeError, ValueError, OSError):  # no file descriptor: the usual guess
    return shutil.get_terminal_size().columns


class Progress(contextlib.AbstractContextManager):
  """done/total, rate and ETA of one long step, in the log and on a terminal: `update(n)` after
  each piece of work, then `close()` (or leave a `with` block without an error) logs the final
  line. `work`: the step's total cost in any unit, each piece's given to `update(n, work=w)`,
  for an ETA that follows the share of the cost done where pieces differ in cost (decoding goes
  shortest sentences first). `bar=False`: log lines only."""

  def __init__(self, what: str, total: int | None, unit: str, *, work: float | None = None,
               enabled: bool = True, bar: bool = True, stream: TextIO | None = None,
               clock: Callable[[], float] = time.monotonic):
    self.what, self.total, self.unit = what, total, unit
    self.done, self.work_done = 0, 0.0
    self._work_total, self._enabled, self._clock = work, enabled, clock
    self._stream = sys.stderr if stream is None else stream
    self._live = enabled and bar and _is_terminal(self._stream)
    self._start = clock()
    self._next_line = self._start + FIRST_LINE_S
    self._next_bar = self._start
    self._bar_length = 0  # characters of the bar on the screen now (0: none shown)
    self._closed = False

  def __exit__(self, error_type: type | None, *_: object) -> None:
    if error_type is None:
      self.close()
    else:  # the error speaks for itself; only the bar must go
      self._erase_bar()
      self._closed = True

  def update(self, n: int = 1, work: float = 0.0) -> None:
    """`n` more items done, costing `work` (see the class docstring)."""
    self.done += n
    self.work_done += work
    if not self._enabled or self._closed:
      return
    now = self._clock()
    if now >= self._next_line:
      self._next_line = now + EVERY_S
      self._log(self.line(now))
    if self._live and now >= self._next_bar:
      self._next_bar = now + BAR_EVERY_S
      self._draw_bar(now)

  def iterate(self, items: Iterable[T], block: int = 1024) -> Iterator[T]:
    """`items`, counted as they pass; in blocks, so a fast loop pays for few updates."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, block)):
      yield from chunk
      self.update(len(chunk))

  def close(self) -> None:
    """Erases the bar and logs the final line: how many, in how long, how fast."""
    if self._closed:
      return
    self._closed = True
    self._erase_bar()
    if not self._enabled or (self.done == 0 and self.total == 0):  # nothing to tell
      return
    elapsed = self._clock() - self._start
    count = (f'{self.done:,}' if self.total is None or self.total == self.done
             else f'{self.done:,}/{self.total:,}')
    rate = f' ({_number(self.done / elapsed)} {self.unit}/s)' if elapsed > 0 else ''
    self._log(f'{self.what}: {count} {self.unit} in {format_duration(elapsed)}{rate}')

  def line(self, now: float) -> str:
    """'WHAT: done/total unit (p%), rate unit/s, ETA m:ss', as far as it is known."""
    parts = [f'{self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%)'
             if self.total else f'{self.done:,} {self.unit}']
    elapsed = now - self._start
    if elapsed > 0:
      parts.append(f'{_number(self.done / elapsed)} {self.unit}/s')
    eta = self._eta(elapsed)
    if eta is not None:
      parts.append(f'ETA {format_duration(eta)}')
    return f'{self.what}: ' + ', '.join(parts)

  def _eta(self, elapsed: float) -> float | None:
    """Seconds left, from the share of the work (or of the items) done so far."""
    share = (self.work_done / self._work_total if self._work_total
             else self.done / self.total if self.total else 0)
    return elapsed * (1 - share) / share if 0 < share <= 1 else None

  def _log(self, text: str) -> None:
    """A line in the log, or on the stream where the log drops INFO lines (a program using the
    Translator without setting up logging), so that a long step is never silent."""
    self._erase_bar()  # a log line written into the bar would be garbled
    if logging.get_absl_logger().isEnabledFor(std_logging.INFO):
      logging.info('%s', text)
    else:
      self._write(text + '\n')

  def _draw_bar(self, now: float) -> None:
    text = self.line(now)
    if self.total:
      filled = min(int(_BAR_WIDTH * self.done / self.total), _BAR_WIDTH)
      bar = '#' * filled + '.' * (_BAR_WIDTH - filled)
      text = f'{self.what} [{bar}] {text[len(self.what) + 2:]}'
    text = text[:max(_columns(self._stream) - 1, 10)]  # '\r' cannot redraw a wrapped line
    # Spaces, not an ANSI code, clear what is left of a longer bar: every terminal knows them.
    self._write('\r' + text.ljust(self._bar_length))
    self._bar_length = len(text)

  def _erase_bar(self) -> None:
    if self._bar_length:
      self._write('\r' + ' ' * self._bar_length + '\r')
      self._bar_length = 0

  def _write(self, text: str) -> None:
    self._stream.write(text)
    self._stream.flush()
