"""--mode=serve under load, as JSON lines: latency and throughput with 1, 8 and 32 clients.

  python benchmarks/serve.py --workdir runs/demo [--seconds 60] [--clients 1,8,32]
                             [--sentences FILE] [--single 20]

Serves the trained run in --workdir (a process of its own: `--mode=serve`), then, for each
number of clients, that many threads each post one sentence at a time (the run's test split,
in turn: the demo's demo_corpus/test.en) for --seconds, and reports the requests, the
failures, the latencies' p50 and p99, the sentences decoded a second and the server's
batches with their mean requests (GET /health's counts; --sentences: another file, one
sentence a line). Before that, a warm short sentence alone (--single times in a row,
the median); after, with the server stopped, the same sentences decoded as one
`--mode=translate --input=FILE` decodes them (Translator.translate of the whole list,
compiled and warmed first), for the ratio of the busiest load's throughput to it.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import common  # benchmarks/common.py: the repository on sys.path
import numpy as np

SHORT = 'The house is small.'  # the demo's kind of sentence (--short: another)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def post(url: str, lines: list[str]) -> dict:
  request = urllib.request.Request(f'{url}/translate', data=json.dumps({'text': lines}).encode(),
                                   headers={'Content-Type': 'application/json'})
  with urllib.request.urlopen(request, timeout=300) as response:
    return json.loads(response.read())


def wait_ready(url: str, process: subprocess.Popen) -> float:
  start = time.monotonic()
  while True:
    if process.poll() is not None:
      sys.exit(f'the server exited with status {process.returncode}')
    try:
      urllib.request.urlopen(f'{url}/health', timeout=5).read()
      return time.monotonic() - start
    except OSError:
      time.sleep(0.2)


def health(url: str) -> dict:
  with urllib.request.urlopen(f'{url}/health', timeout=60) as response:
    return json.loads(response.read())


def load(url: str, sentences: list[str], clients: int, seconds: float) -> dict:
  """`clients` threads, each posting one sentence after another for `seconds`; with the
  server's batches in that time (GET /health's counts) and their mean requests."""
  latencies, failures, lock = [], [0], threading.Lock()
  stop_at = time.monotonic() + seconds
  counter = iter(range(10 ** 9))

  def client() -> None:
    while time.monotonic() < stop_at:
      with lock:
        line = sentences[next(counter) % len(sentences)]
      start = time.monotonic()
      try:
        post(url, [line])
      except OSError:
        with lock:
          failures[0] += 1
        continue
      with lock:
        latencies.append(time.monotonic() - start)

  before = health(url)
  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    for future in [pool.submit(client) for _ in range(clients)]:
      future.result()
  elapsed = time.monotonic() - start
  after = health(url)
  batches = after['batches'] - before['batches']
  return {'benchmark': 'serve', 'clients': clients, 'seconds': round(elapsed, 1),
          'requests': len(latencies), 'failed': failures[0],
          'p50_s': round(float(np.percentile(latencies, 50)), 4),
          'p99_s': round(float(np.percentile(latencies, 99)), 4),
          'sentences_per_s': round(len(latencies) / elapsed, 2), 'batches': batches,
          'requests_per_batch': round((after['requests'] - before['requests'])
                                      / max(batches, 1), 1)}


def file_throughput(workdir: str, sentences: list[str]) -> dict:
  """The same sentences as one --input=FILE: Translator.translate of the list, in a process
  set up as --mode=translate is (a JAX device per core), after a warm-up of the same call."""
  code = f'''
import json, sys, time
sys.path.insert(0, {common.ROOT!r})
from t2t_jax.platform import xla
xla.configure_cpu(decoding=True)
from t2t_jax.apps.translator import Translator
lines = json.load(sys.stdin)
translator = Translator.from_workdir({workdir!r})
translator.translate(lines, show_progress=False)
start = time.monotonic()
translator.translate(lines, show_progress=False)
print(json.dumps(time.monotonic() - start))
'''
  done = subprocess.run([sys.executable, '-c', code], input=json.dumps(sentences), text=True,
                        capture_output=True, check=True, cwd=common.ROOT)
  seconds = json.loads(done.stdout.strip().splitlines()[-1])
  return {'benchmark': 'serve_file_baseline', 'sentences': len(sentences),
          'seconds': round(seconds, 2), 'sentences_per_s': round(len(sentences) / seconds, 2)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workdir', default='runs/demo')
  parser.add_argument('--seconds', type=float, default=60)
  parser.add_argument('--clients', default='1,8,32')
  parser.add_argument('--single', type=int, default=20)
  parser.add_argument('--sentences', default='', help='default: WORKDIR/demo_corpus/test.en')
  parser.add_argument('--short', default=SHORT)
  args = parser.parse_args()
  test = args.sentences or os.path.join(args.workdir, 'demo_corpus', 'test.en')
  with open(test, encoding='utf-8') as f:
    sentences = [line.rstrip('\n') for line in f if line.strip()]
  port = free_port()
  url = f'http://127.0.0.1:{port}'
  process = subprocess.Popen([sys.executable, '-m', 't2t_jax.main', f'--workdir={args.workdir}',
                              '--mode=serve', f'--port={port}'], cwd=common.ROOT,
                             stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
  try:
    print(json.dumps({'benchmark': 'serve_start', 'ready_s': round(wait_ready(url, process), 1),
                      'cpu_count': os.cpu_count()}), flush=True)
    post(url, [args.short])  # the first request's own costs out of the way
    single = []
    for _ in range(args.single):
      start = time.monotonic()
      post(url, [args.short])
      single.append(time.monotonic() - start)
    print(json.dumps({'benchmark': 'serve_single_short', 'sentence': args.short,
                      'median_s': round(float(np.median(single)), 4),
                      'max_s': round(max(single), 4)}), flush=True)
    results = []
    for clients in (int(c) for c in args.clients.split(',')):
      results.append(load(url, sentences, clients, args.seconds))
      print(json.dumps(results[-1]), flush=True)
  finally:
    process.terminate()
    process.wait(timeout=120)
  busiest = results[-1]
  baseline = file_throughput(args.workdir, sentences)
  baseline['serve_ratio'] = round(busiest['sentences_per_s'] / baseline['sentences_per_s'], 3)
  baseline['serve_clients'] = busiest['clients']
  print(json.dumps(baseline), flush=True)


if __name__ == '__main__':
  main()
