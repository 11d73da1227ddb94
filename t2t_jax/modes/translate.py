"""Translate --input (a file, or - for stdin, answered line by line) with a trained run into
--output (default: stdout); --n_best=K writes Moses n-best lists.

The Translator's (apps/translator.py) command line: a file read whole, or stdin as a stream
whose lines are answered as they arrive (Marian's and fairseq-interactive's use), and the
output formats (a line a translation, Moses' n-best lists).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import jax
import ml_collections
from absl import logging

from t2t_jax import cli
from t2t_jax.apps.arguments import n_best_bound, n_best_limit
from t2t_jax.apps.translator import Hypothesis, Translator
from t2t_jax.data import sources
from t2t_jax.decoding.batch_plan import INTERACTIVE_ROWS
from t2t_jax.platform import ahead, errors, files

# --n_best=K output: K lines per input line in the four fields of Moses' n-best lists (as
# Marian writes them, which rerankers read): `INDEX ||| TRANSLATION ||| FEATURES ||| SCORE`,
# INDEX counted from 0, best first, FEATURES `logP= log P(Y|X) lp= lp(Y)` (SCORE = logP / lp).
NBEST_SEPARATOR = ' ||| '


def format_results(results: Sequence[str] | Sequence[Sequence[Hypothesis]],
                   first_index: int = 0) -> str:
  """Output text of translations: a line each, or the n-best lines of each list."""
  lines = []
  for index, result in enumerate(results, start=first_index):
    if isinstance(result, str):
      lines.append(result)
    else:
      lines += [NBEST_SEPARATOR.join((str(index), h.text,
                                      f'logP= {h.logprob:.6f} lp= {h.length_penalty:.6f}',
                                      f'{h.score:.6f}')) for h in result]
  return ''.join(line + '\n' for line in lines)


_END = object()  # the end of a stream, in its queue


def _read_stream(binary: BinaryIO, name: str, lines: queue.Queue) -> None:
  """Puts each line of `binary` into `lines` as it arrives (split on b'\\n' alone, decoded
  like a file: sources.decode_lines), then _END; a bad line puts its error and stops."""
  try:
    for number, raw in enumerate(iter(binary.readline, b''), start=1):
      lines.put(sources.decode_lines(name, number, [raw])[0])
  except Exception as error:  # handed to the consumer, which raises it
    lines.put(error)
    return
  lines.put(_END)


# The most lines a stream batch takes: a pipe's lines arrive together, and are decoded in
# batches this size by the plan of a file, length-sorted (memory: its ids and outputs).
STREAM_MAX_LINES = 10_000


def arriving_batches(binary: BinaryIO, name: str, *, wait_s: float,
                     max_lines: int = STREAM_MAX_LINES,
                     on_end: Callable[[], None] | None = None) -> Iterator[list[str]]:
  """Lines of a stream in batches as they arrive: a batch is its first line and every line
  that has arrived by `wait_s` seconds after it, at most `max_lines` (typed lines come one a
  batch, a pipe's together). `on_end()` is called when the end of the stream is read, before
  its last batch is given. A line that cannot be read raises, after the batches before it."""
  lines: queue.Queue = queue.Queue()
  # A daemon thread: blocked in a read, it must not keep a finished process alive.
  threading.Thread(target=_read_stream, args=(binary, name, lines), daemon=True).start()
  item = lines.get()
  while item is not _END:
    if isinstance(item, Exception):
      raise item
    batch, deadline = [item], time.monotonic() + wait_s
    item = None  # what ended the batch: None (full, or the wait is over), _END or an error
    while item is None and len(batch) < max_lines:
      try:
        item = lines.get(timeout=max(deadline - time.monotonic(), 0))
      except queue.Empty:
        break
      if isinstance(item, str):
        batch.append(item)
        item = None
    if item is None:  # give the batch, then wait for the next line
      yield batch
      batch, item = [], lines.get()
    if item is _END and on_end is not None:
      on_end()
    if batch:
      yield batch


def stream(translator: Translator, binary: BinaryIO, out: BinaryIO, *, name: str = '<stdin>',
           n_best: int | None = None, small_lines: int = INTERACTIVE_ROWS,
           wait_s: float = 0.1, max_lines: int = STREAM_MAX_LINES,
           on_end: Callable[[], None] | None = None) -> int:
  """Translates the lines of `binary` as they arrive (arriving_batches), each batch's output
  written to `out` and flushed at once; returns the number of lines translated. A batch of at
  most `small_lines` lines is decoded in the small shapes Translator.compile_ahead compiles
  (max_rows = small_lines); a larger one, length-sorted as a file is, its progress logged."""
  done = 0
  for batch in arriving_batches(binary, name, wait_s=wait_s, max_lines=max_lines, on_end=on_end):
    small = len(batch) <= small_lines
    results = translator.translate(batch, n_best=n_best, first_line=done + 1,
                                   max_rows=small_lines if small else 0, show_progress=not small)
    out.write(format_results(results, first_index=done).encode('utf-8'))
    out.flush()
    done += len(batch)
  return done


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  flags = cli.FLAGS
  if flags.input is None:
    raise errors.UserError('--mode=translate needs --input=FILE (or - for stdin)')
  count = translate(config, workdir, flags.input, flags.output, n_best=flags.n_best,
                    stream_lines=flags.stream_lines, stream_wait_s=flags.stream_wait)
  return result_line('translated', count, 'lines', flags.input, flags.output)


def result_line(done: str, count: int, what: str, input_path: str, output_path: str | None,
                ) -> str:
  """The command's last line: on stdout, or where stdout is the output, in the log."""
  source = '<stdin>' if input_path == '-' else input_path
  if output_path is None:
    logging.info('%s %d %s of %s to stdout', done.capitalize(), count, what, source)
    return ''
  return f'{done} {count} {what} of {source} into {output_path}'


def translate(config: ml_collections.ConfigDict, workdir: str, input_path: str,
              output_path: str | None, *, n_best: int | None = None,
              stream_lines: int = 16, stream_wait_s: float = 0.1) -> int:
  """--mode=translate: lines of `input_path` to `output_path` (None = stdout). A file is read
  whole and decoded in length-sorted batches; '-' (stdin) is a stream (`stream`), but read whole
  by multi-process runs, whose processes must decode the same batches. Line i of the output
  translates line i of the input (n-best: its lines start with i - 1): both are split on '\n'
  alone (sources.read_lines), and no translation holds one."""
  method = config.decode_method
  if n_best is not None and not 1 <= n_best <= n_best_bound(method, None, config):
    raise errors.UserError(f'--n_best={n_best}: {n_best_limit(method, None, config)}')
  # Before any decoding: a mistake in where the output goes costs seconds, not the run.
  if output_path is not None:
    files.check_writable_file(output_path, 'the translations')
  if input_path == '-' and sys.stdin is None:
    raise errors.UserError('--input=-: standard input is closed; give it lines, or --input=FILE')
  if input_path == '-' and jax.process_count() == 1:
    # The output is claimed first: a second stream to it fails before loading a model.
    with stream_output(output_path) as out, Translator(config, workdir,
                                                       mode='translate') as translator:
      _stream_ahead(translator, stream_lines, n_best)
      # At the end of the input nothing more is compiled ahead (translator.close), and the
      # running compilations finish: XLA cannot stop one, and a thread not waited for aborts
      # the process as it exits.
      return stream(translator, sys.stdin.buffer, out, n_best=n_best, small_lines=stream_lines,
                    wait_s=stream_wait_s, on_end=translator.close)
  lines = sources.read_lines(input_path)
  translator = Translator(config, workdir, mode='translate')
  write(format_results(translator.translate(lines, n_best=n_best)), output_path)
  return len(lines)


def _stream_ahead(translator: Translator, stream_lines: int, n_best: int | None) -> None:
  """With config.compile_ahead on a host with cores to spare (ahead.default_threads), a stream's
  search compiled in the background for every small batch's shape up to the lengths the model
  can meet (Translator.ahead_length), so that lines typed later wait for none."""
  threads = ahead.default_threads() if translator.config.compile_ahead else 0
  if not threads:
    logging.info('Compiling as shapes are met (%s); the compilation cache keeps them.',
                 'config.compile_ahead=False' if not translator.config.compile_ahead
                 else 'fewer than 4 cores: compiling ahead would slow decoding')
    return
  translator.compile_ahead(max_rows=stream_lines, n_best=n_best, wait=False, threads=threads)


def write(text: str, path: str | None) -> None:
  """`text` to the file `path`, else to stdout as UTF-8 whatever the locale's encoding; by
  process 0 alone: one copy, however many processes decoded."""
  if jax.process_index() != 0:
    return
  if path is not None:
    files.write_text(path, text)
    return
  sys.stdout.flush()
  sys.stdout.buffer.write(text.encode('utf-8'))
  sys.stdout.buffer.flush()


@contextlib.contextmanager
def stream_output(path: str | None) -> Iterator[BinaryIO]:
  """A stream's output: stdout's bytes (UTF-8 whatever the locale's encoding), or for a file
  `path`, PATH.partial written as it goes and renamed to `path` when the input ends. A run
  that fails never replaces an earlier `path`; what it translated stays in PATH.partial.
  PATH.partial is this process's alone while it writes (_claim): a second stream to `path`
  is an error, never a mix of two."""
  if path is None:
    sys.stdout.flush()
    yield sys.stdout.buffer
    return
  partial = f'{path}.partial'
  with _claim(partial, path) as f:
    try:
      yield f
    except BaseException:
      if f.tell():
        logging.error('%s holds the translations written before the error; %s is unchanged.',
                      partial, path)
      else:  # nothing translated yet (the model did not load): nothing to keep
        os.remove(partial)
      raise
    f.flush()
    os.replace(partial, path)  # still locked: no other stream takes PATH.partial meanwhile


def _claim(partial: str, path: str) -> BinaryIO:
  """PATH.partial, empty, opened (never through a link) and locked (flock) by this process; a
  lock held by another stream is an error naming `path`. The file locked must still be the one
  named PATH.partial: its last holder may have renamed it to `path` in between. What a failed
  stream left in it is kept, renamed to PATH.partial.<time>, not emptied."""
  for _ in range(4):
    f = files.open_file(partial, 'ab', 'the translations')  # not emptied before it is ours
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.close()
      raise errors.UserError(f'--output={path}: another translation is writing it (it holds '
                             f'{partial}); wait for it to finish, or name another --output'
                             ) from None
    try:
      current = os.lstat(partial).st_ino
    except FileNotFoundError:
      current = None
    if current == os.fstat(f.fileno()).st_ino:
      if not os.fstat(f.fileno()).st_size:
        return f
      kept = f'{partial}.{datetime.datetime.now():%Y%m%d-%H%M%S-%f}'
      os.rename(partial, kept)  # still locked: no other stream writes it meanwhile
      logging.warning('%s held the translations of a stream that failed; kept them as %s',
                      partial, kept)
    f.close()  # renamed (by us, or to `path` by the stream that held it): open a new one
  raise errors.UserError(f'--output={path}: {partial} keeps being replaced by other '
                         'translations; name another --output')
