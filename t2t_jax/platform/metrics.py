"""Metrics plumbing: DIR/metrics.jsonl, TensorBoard events in DIR/tensorboard/, throughput.

Events are written with TensorBoard's record framing and protos alone: its EventFileWriter
would import TensorFlow (seconds) and flush from a thread of its own; a scalar log needs neither.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Any

import jax
from absl import logging

from t2t_jax.platform import files

METRICS = 'metrics.jsonl'  # DIR/metrics.jsonl: one JSON record a line


class MetricWriter:
  """Appends one JSON object per call to DIR/metrics.jsonl and writes TensorBoard events. Only
  process 0 writes, so several hosts don't write the same file; each call is flushed, so a
  killed run loses no logged step."""

  def __init__(self, workdir: str):
    self._active = jax.process_index() == 0
    if not self._active:
      return
    # Lazily: TensorBoard's protos take ~0.3 s to import, which only training needs.
    from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: PLC0415
    from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: PLC0415
    self._event, self._summary = event_pb2.Event, summary_pb2.Summary
    events_dir = files.make_folder(os.path.join(workdir, 'tensorboard'), workdir,
                                   'TensorBoard events')
    path = os.path.join(workdir, METRICS)
    files.set_aside_torn_tail(path)  # a record cut short by a kill or a full disk
    self._jsonl = files.open_file(path, 'a', 'the metrics')
    # TensorBoard reads every events.out.tfevents.* file of a folder; one per run of the
    # process, named as TensorBoard's own writer names them.
    name = f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}'
    self._events = RecordWriter(files.open_file(os.path.join(events_dir, name), 'ab',
                                                'TensorBoard events'))
    self._add(self._event(wall_time=time.time(), file_version='brain.Event:2'))

  def write(self, step: int, metrics: dict[str, float], prefix: str = '') -> None:
    if not self._active:
      return
    record = {'step': step, **{prefix + k: float(v) for k, v in metrics.items()}}
    self._jsonl.write(json.dumps(record) + '\n')
    self._jsonl.flush()
    values = [self._summary.Value(tag=k, simple_value=v) for k, v in record.items()
              if k != 'step']
    self._add(self._event(wall_time=time.time(), step=step,
                          summary=self._summary(value=values)))

  def note(self, step: int, name: str, record: dict[str, Any]) -> None:
    """A record that is no scalar ({"step": 6, "stopped_early": {...}}): metrics.jsonl only."""
    if self._active:
      self._jsonl.write(json.dumps({'step': step, name: record}) + '\n')
      self._jsonl.flush()

  def _add(self, event: Any) -> None:
    self._events.write(event.SerializeToString())
    self._events.flush()

  def close(self) -> None:
    if self._active:
      self._jsonl.close()
      self._events.close()


def dev_losses(workdir: str) -> dict[int, float]:
  """{step: dev loss} as DIR/metrics.jsonl records them (config.eval_every_steps)."""
  return {step: float(value) for step, value in recorded(workdir, 'dev_loss').items()
          if isinstance(value, (int, float))}


def recorded(workdir: str, key: str) -> dict[int, Any]:
  """{step: value of `key`} of DIR/metrics.jsonl's records (records), the last record of a
  step winning (a resumed run evaluates a step again)."""
  return {record['step']: record[key] for record in records(workdir) if key in record}


def records(workdir: str) -> list[dict[str, Any]]:
  """DIR/metrics.jsonl's records, in order. A line that is not a whole JSON record with an
  integer step (a run killed mid-write) is skipped with a warning naming it: what it held is
  unknown. No file gives []."""
  found = []
  path = os.path.join(workdir, METRICS)
  with contextlib.suppress(FileNotFoundError), open(path, encoding='utf-8') as f:
    for number, line in enumerate(f, start=1):
      try:
        record = json.loads(line)
      except ValueError:
        logging.warning('%s:%d is not a whole record (a write cut short); what it held is '
                        'unknown', path, number)
        continue
      if isinstance(record, dict) and isinstance(record.get('step'), int):
        found.append(record)
  return found


class Throughput:
  """Tokens/s, steps/s and ETA between two log points; syncs only when asked."""

  def __init__(self, start_step: int, total_steps: int):
    self._total, self._step, self._time = total_steps, start_step, time.perf_counter()

  def measure(self, step: int, tokens: float) -> dict[str, float]:
    now = time.perf_counter()
    seconds = max(now - self._time, 1e-9)
    steps_per_s = (step - self._step) / seconds
    self._step, self._time = step, now
    return {'tokens_per_s': tokens / seconds, 'steps_per_s': steps_per_s,
            'eta_minutes': (self._total - step) / max(steps_per_s, 1e-9) / 60}
