"""The profile part: where the base bf16 step's device time goes, kernel by kernel."""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import shutil
import tempfile

import jax

from accelerator_parts.shared import emit, prepare_train


def device_kernel_times(trace_path: str) -> tuple[dict, dict]:
  """From a perfetto trace: ({(thread, event): [microseconds, calls]}, {thread: µs}) of
  the device threads (every thread where no process names a device, as on a CPU).

  Read here by hand: jax.profiler writes Chrome's JSON trace events, and no library of the
  pinned environment sums them (perfetto's trace processor and xprof would be new ones)."""
  with gzip.open(trace_path, 'rt') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  meta = lambda kind: {(e['pid'], e.get('tid')): e['args']['name'] for e in events  # noqa: E731
                       if e.get('ph') == 'M' and e.get('name') == kind}
  processes = {pid: name for (pid, _), name in meta('process_name').items()}
  threads = meta('thread_name')
  device = {pid for pid, name in processes.items() if re.search(r'GPU|TPU|/device', name)}
  totals, busy = collections.defaultdict(lambda: [0.0, 0]), collections.Counter()
  for e in events:
    if e.get('ph') != 'X' or (device and e.get('pid') not in device):
      continue
    tid = e['pid'], e.get('tid')
    thread = f"{processes.get(e['pid'], e['pid'])} / {threads.get(tid, tid[1])}"
    totals[thread, e['name']][0] += e.get('dur', 0.0)
    totals[thread, e['name']][1] += 1
    busy[thread] += e.get('dur', 0.0)
  return totals, busy


def bench_profile(size: dict, out: str | None, profile_dir: str, profiled: dict,
                  steps: int = 3) -> list[dict]:
  """Three base bf16 steps traced by jax.profiler: device milliseconds a step by thread and
  by kernel, the largest 60; the trace and the optimized program are kept in profile_dir.
  The step is the forms part's 'xla' one (`profiled['step']`) where it ran, else built here."""
  if 'step' not in profiled:
    _, lowered, state, batch = prepare_train('base', size, 'bfloat16', dict(kernels='xla'))
    profiled['step'] = lowered.compile(), state, batch
  step, state, batch = profiled.pop('step')
  os.makedirs(profile_dir, exist_ok=True)
  with open(os.path.join(profile_dir, 'base_step_hlo.txt'), 'w') as f:
    f.write(step.as_text())
  holder = [state]

  def run():
    holder[0], metrics = step(holder[0], batch)
    return jax.block_until_ready(metrics)
  run()
  with tempfile.TemporaryDirectory() as log_dir:
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
      for _ in range(steps):
        run()
    [path] = glob.glob(os.path.join(log_dir, '**', 'perfetto_trace.json.gz'), recursive=True)
    shutil.copy(path, os.path.join(profile_dir, 'base_step_trace.json.gz'))
  totals, busy = device_kernel_times(os.path.join(profile_dir, 'base_step_trace.json.gz'))
  lines = [emit({'part': 'profile', 'thread': thread,
                 'busy_ms_per_step': round(us / steps / 1e3, 2)}, out)
           for thread, us in busy.most_common(6)]
  for (thread, name), (us, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:60]:
    lines.append(emit({'part': 'profile', 'thread': thread, 'kernel': name[:120],
                       'ms_per_step': round(us / steps / 1e3, 3), 'calls_per_step': calls / steps},
                      out))
  return lines
