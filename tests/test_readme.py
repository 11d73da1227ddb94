"""The README's commands as a user types them: the GPU quick start (its set-up commands from
docs/install.md), then WORKSPACE.md's Table 2 commands for that run, end to end at a tiny size
on a CPU, and "Put it to work" on the tiny trained run (the Python API example:
tests/test_translator.py)."""
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from helpers import ROOT, cpu_env

README = os.path.join(ROOT, 'README.md')
INSTALL = os.path.join(ROOT, 'docs', 'install.md')
WORKSPACE = os.path.join(ROOT, 'WORKSPACE.md')
# The quick start's commands at a tiny size: a synthetic task instead of WMT14, a small model,
# a handful of steps with a checkpoint each (the five that --mode=average wants).
TINY_TRAINING = ['--config.dataset=synthetic', '--config.model.num_layers=1',
                 '--config.model.d_model=32', '--config.model.d_ff=64',
                 '--config.vocab_size=40', '--config.max_length=12',
                 '--config.tokens_per_batch=192', '--config.warmup_steps=10',
                 '--config.num_train_steps=6', '--config.checkpoint_every_steps=1',
                 '--config.log_every_steps=3', '--config.eval_every_steps=6',
                 '--config.decode_tokens_per_batch=64', '--config.decode_extra_length=5']


def first_block(path: str, heading: str) -> list[str]:
  """The commands of the first bash block under `heading` in `path`."""
  text = open(path, encoding='utf-8').read()
  section = text[text.index(heading):]
  block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
  return [line.split('  #')[0].strip() for line in block.splitlines()
          if line.strip() and not line.startswith('#')]


def quick_start() -> list[str]:
  """The GPU quick start: docs/install.md's set-up commands, then the README's."""
  return (first_block(INSTALL, '## GPUs and TPUs')
          + first_block(README, "## Train the paper's base model on your GPUs"))


def table2_for(workdir: str) -> list[str]:
  """WORKSPACE.md's Table 2 commands that go on from the quick start's run: those on `workdir`
  other than its first training command, then the average and eval of any run (runs/NAME)."""
  text = open(WORKSPACE, encoding='utf-8').read()
  table = text[text.index('### Table 2'):text.index('### Table 3')]
  commands = re.findall(r'^\|[^|]*\| `([^`]*)` \|', table, re.M)
  own = [c for c in commands if f'--workdir={workdir}' in c.split()][1:]
  return own + [c.replace('runs/NAME', workdir) for c in commands if 'runs/NAME' in c]


@pytest.mark.e2e
def test_the_gpu_quick_start_runs(tmp_path):
  install, accelerator, *runs = quick_start()
  assert install == "python3 -m venv .venv && .venv/bin/python -m pip install -e '.[wmt]'"
  assert accelerator == ".venv/bin/python -m pip install 'jax[cuda12]==0.10.2'"
  jax_pin = re.search(r'"jax==([\d.]+)"', open(os.path.join(ROOT, 'pyproject.toml')).read())
  assert accelerator.endswith(f"=={jax_pin.group(1)}'")  # the accelerator's JAX is the pin's
  assert runs == ['.venv/bin/t2t-jax --config=experiments/wmt_ende_base.py --workdir=runs/base']
  then = table2_for('runs/base')
  assert [c.split()[-1] for c in then] == ['--config.grad_accum_steps=8', '--mode=average',
                                           '--mode=eval']
  env = cpu_env(2)
  for run in runs + then:
    args = [a.replace('runs/base', str(tmp_path / 'base')) for a in shlex.split(run)]
    command = 1 if args[0] == '.venv/bin/t2t-jax' else 3
    assert args[:command] in (['.venv/bin/t2t-jax'], ['python', '-m', 't2t_jax.main']), run
    args = args[command:]
    if any(a.startswith('--config=') for a in args):  # training: a tiny size
      args += TINY_TRAINING
    done = subprocess.run([sys.executable, '-m', 't2t_jax', *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f'{run}\n{done.stderr[-3000:]}'
  # The second training command resumed the first run (already finished) with micro-batches.
  assert os.listdir(tmp_path / 'base' / 'averaged') == ['6']
  scores = [os.path.join(folder, 'scores.json') for folder in
            (tmp_path / 'base' / 'eval').iterdir()]
  assert len(scores) == 1 and os.path.exists(scores[0])  # where WORKSPACE.md says


@pytest.mark.e2e
def test_put_it_to_work_runs(tiny_workdir, tmp_path):
  """The README's "Put it to work": the server and a curl on the tiny run (its sentences are
  the synthetic task's), SIGTERM while it answers, then the CTranslate2 export; the installs
  are the test extra's."""
  serve_install, serve, curl, ct2_install, export = first_block(README, '## Put it to work')
  extras = open(os.path.join(ROOT, 'pyproject.toml'), encoding='utf-8').read()
  for install, module in ((serve_install, 'uvicorn'), (ct2_install, 'ctranslate2')):
    extra = re.fullmatch(r"\.venv/bin/pip install -e '\.\[(\w+)\]'", install).group(1)
    assert f'\n{extra} = [' in extras and f'"t2t_jax[{extra}' in extras, install
    pytest.importorskip(module)
  port = str(free_port())
  args = shlex.split(serve.removesuffix('&').replace('runs/demo', tiny_workdir)
                     .replace('8000', port))
  assert args[:1] == ['.venv/bin/t2t-jax']
  server = subprocess.Popen([sys.executable, '-m', 't2t_jax', *args[1:]], cwd=ROOT,
                            env=cpu_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
  try:
    wait_until_served(port, server)
    answer = subprocess.run(shlex.split(curl.replace('8000', port).replace('A queen cries.',
                                                                           '5 6 7')),
                            capture_output=True, text=True, timeout=120, check=True)
    [translation] = json.loads(answer.stdout)['translations']
    best = translation['n_best']
    assert len(best) == 2 and translation['text'] == best[0]['text']
    answers, term_at = stop_in_the_middle_of_requests(port, server)
    out, err = server.communicate(timeout=120)
  finally:
    if server.poll() is None:  # the test failed before the server stopped
      server.kill()
  # SIGTERM: the server stopped accepting, answered the request in flight whole, exited 0.
  assert server.returncode == 0, err[-3000:]
  assert answers and all(a[2:] == (200, 50) for a in answers)
  assert any(start < term_at < end for start, end, *_ in answers), answers
  assert 'Traceback' not in err and out.strip().endswith('/ until SIGTERM')
  args = shlex.split(export.replace('runs/demo-ct2', str(tmp_path / 'ct2'))
                     .replace('runs/demo', tiny_workdir))
  done = subprocess.run([sys.executable, '-m', 't2t_jax', *args[1:]], cwd=ROOT, env=cpu_env(2),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert os.listdir(tmp_path / 'ct2')


def stop_in_the_middle_of_requests(port: str, server: subprocess.Popen,
                                   ) -> tuple[list[tuple], float]:
  """Requests of 50 lines one after another, and a SIGTERM to the server while one is in
  flight: each answer's (start, end, status, lines), and when the signal was sent."""
  answers = []
  body = json.dumps({'text': ['5 6 7', '9 9 9 9 9 9 9 9', '3', '11 12', '4 4 8'] * 10,
                     'beam_size': 8}).encode()

  def client() -> None:
    while True:
      started = time.monotonic()
      request = urllib.request.Request(f'http://127.0.0.1:{port}/translate', data=body,
                                       headers={'Content-Type': 'application/json'})
      try:
        with urllib.request.urlopen(request, timeout=120) as response:
          answers.append((started, time.monotonic(), response.status,
                          len(json.loads(response.read())['translations'])))
      except OSError:
        return  # refused: the server stopped accepting

  thread = threading.Thread(target=client)
  thread.start()
  while not answers:  # the search of these settings compiled: requests now take their time
    time.sleep(0.05)
  time.sleep(0.3)
  term_at = time.monotonic()
  server.send_signal(signal.SIGTERM)
  thread.join(timeout=120)
  return answers, term_at


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def wait_until_served(port: str, server: subprocess.Popen) -> None:
  deadline = time.monotonic() + 300
  while True:
    assert server.poll() is None, server.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    try:
      urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=5).read()
      return
    except OSError:
      time.sleep(0.2)
