"""Several processes, one run, through the command line: 2 processes of 4 CPU devices each
(jax.distributed with a local coordinator, gloo collectives) against 1 process of 8.

Each launch costs a JAX start-up and compilation per process, so the runs are shared by
module fixtures: `one` is the reference (1 process, 8 devices), `two` the same run on
2 processes. Every test here starts processes (`e2e`).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import time

import jax
import numpy as np
import pytest

from helpers import COMMAND, ROOT, cpu_env, trained_rtol
from t2t_jax.run import params as params_lib
from t2t_jax.training import checkpoints

pytestmark = pytest.mark.e2e

STEPS = 8
TINY = ['--config=experiments/demo.py', '--config.dataset=synthetic',
        '--config.model.num_layers=1', '--config.model.d_model=32', '--config.model.d_ff=64',
        '--config.model.dropout_rate=0.1', '--config.vocab_size=40', '--config.max_length=12',
        '--config.tokens_per_batch=192', '--config.warmup_steps=10',
        '--config.checkpoint_every_steps=4', '--config.checkpoint_every_minutes=0',
        '--config.log_every_steps=1', f'--config.eval_every_steps={STEPS}',
        '--config.decode_tokens_per_batch=64', '--config.decode_extra_length=5']


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start(workdir, *args, processes=2, devices=None):
  """`python -m t2t_jax.main` as `processes` processes (their logs in workdir.log-<i>)."""
  return start_each([(workdir, args)] * processes, devices=devices)


def start_each(commands, devices=None):
  """Process i runs commands[i] = (workdir, args); one run of len(commands) processes."""
  devices = devices or 8 // len(commands)
  port = free_port()
  procs = []
  for i, (workdir, args) in enumerate(commands):
    env = cpu_env(devices)
    extra = []
    if len(commands) > 1:
      env.update(JAX_COORDINATOR_ADDRESS=f'127.0.0.1:{port}',
                 JAX_NUM_PROCESSES=str(len(commands)), JAX_PROCESS_ID=str(i))
      extra = ['--distributed']
    log_path = f'{workdir}.log-{i}'
    with open(log_path, 'w') as log:
      procs.append(subprocess.Popen([*COMMAND, *extra, *TINY, f'--workdir={workdir}', *args],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
    procs[-1].log_path = log_path
  return procs


def finish(procs, timeout=300):
  """Exit codes and logs of the processes of one run."""
  codes = [p.wait(timeout=timeout) for p in procs]
  return codes, [open(p.log_path).read() for p in procs]


def run(workdir, *args, **kwargs):
  codes, logs = finish(start(workdir, *args, **kwargs))
  assert codes == [0] * len(codes), logs[codes.index(next(c for c in codes if c))][-3000:]
  return logs


def losses(workdir):
  records = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  return {r['step']: r['loss'] for r in records if 'loss' in r}


def params(workdir, step):
  tree = params_lib.restore_params(os.path.join(workdir, 'checkpoints'), step)
  return jax.tree_util.tree_map(np.asarray, tree)


def assert_close(a, b, steps=STEPS):
  """Parameters trained on other devices: their float32 sums in another order, for `steps`
  steps. Initialized at magnitudes up to ~1, so the absolute floor is the relative one."""
  tol = trained_rtol(steps)
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


def assert_losses_close(got, want, steps):
  """The logged loss of each step (`steps`), within that step's trained_rtol."""
  for step in steps:
    assert got[step] == pytest.approx(want[step], rel=trained_rtol(step)), step


@pytest.fixture(scope='module')
def one(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('one') / 'run')
  run(workdir, f'--config.num_train_steps={STEPS}', processes=1, devices=8)
  return workdir


@pytest.fixture(scope='module')
def two(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('two') / 'run')
  run(workdir, f'--config.num_train_steps={STEPS}')
  return workdir


@pytest.mark.slow
def test_two_processes_train_as_one_process_of_eight_devices(one, two):
  assert sorted(losses(two)) == list(range(1, STEPS + 1))  # written once, by process 0
  assert_losses_close(losses(two), losses(one), range(1, STEPS + 1))
  assert checkpoints.checkpoint_steps(two) == [4, 8]
  assert_close(params(two, STEPS), params(one, STEPS))


@pytest.mark.slow
def test_checkpoints_move_between_topologies_and_killed_runs_resume(one, tmp_path):
  # Two processes, both killed once checkpoint 4 exists; one process of 8 devices resumes.
  killed = str(tmp_path / 'killed')
  procs = start(killed, f'--config.num_train_steps={STEPS}')
  deadline = time.time() + 300
  while 4 not in checkpoints.checkpoint_steps(killed) and time.time() < deadline:
    time.sleep(0.05)
  for p in procs:
    p.send_signal(signal.SIGKILL)
  finish(procs)
  logs = run(killed, f'--config.num_train_steps={STEPS}', processes=1, devices=8)
  assert 'Resuming at step' in logs[0]
  assert_close(params(killed, STEPS), params(one, STEPS))
  # One process's checkpoint 4, resumed by two processes.
  moved = str(tmp_path / 'moved')
  os.makedirs(os.path.join(moved, 'checkpoints'))
  shutil.copytree(os.path.join(one, 'checkpoints', '4'), os.path.join(moved, 'checkpoints', '4'))
  logs = run(moved, f'--config.num_train_steps={STEPS}')
  assert all('Resuming at step 4' in log for log in logs)
  assert_losses_close(losses(moved), losses(one), range(5, STEPS + 1))
  assert_close(params(moved, STEPS), params(one, STEPS))


@pytest.mark.slow
def test_eval_and_translate_on_two_processes_write_once(one, tmp_path):
  both = {}
  for name, processes in (('single', 1), ('multi', 2)):
    workdir = str(tmp_path / name)
    shutil.copytree(one, workdir)
    run(workdir, '--mode=eval', processes=processes)
    (out,) = os.listdir(os.path.join(workdir, 'eval'))
    folder = os.path.join(workdir, 'eval', out)
    assert sorted(os.listdir(folder)) == ['hypotheses.txt', 'references.txt', 'scores.json']
    with open(tmp_path / 'in.txt', 'w') as f:
      f.write('5 6 7\n\n9 9 8\n3\n')
    run(workdir, '--mode=translate', f'--input={tmp_path / "in.txt"}',
        f'--output={tmp_path / name}.out', processes=processes)
    both[name] = (open(os.path.join(folder, 'hypotheses.txt')).read(),
                  open(f'{tmp_path / name}.out').read())
  assert both['multi'] == both['single']
  assert both['multi'][1].count('\n') == 4


def test_a_signal_on_one_host_stops_every_host_at_the_same_step(tmp_path):
  workdir = str(tmp_path / 'run')
  procs = start(workdir, '--config.num_train_steps=100000')
  deadline = time.time() + 300
  while not (os.path.exists(os.path.join(workdir, 'metrics.jsonl')) and
             open(os.path.join(workdir, 'metrics.jsonl')).read().count('\n') >= 3):
    assert time.time() < deadline
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGTERM)  # the preemption reaches one host only
  codes, logs = finish(procs)
  assert codes == [128 + signal.SIGTERM] * 2, logs[0][-2000:]
  stopped = [log.strip().splitlines()[-1] for log in logs]
  assert stopped[0] == stopped[1] and stopped[0].startswith('t2t_jax: stopped by SIGTERM at step')
  step = int(stopped[0].split('at step ')[1].split(',')[0])
  assert checkpoints.checkpoint_steps(workdir)[-1] == step


@pytest.mark.slow
def test_a_dead_process_stops_the_others_and_the_run_resumes(tmp_path):
  workdir = str(tmp_path / 'run')
  procs = start(workdir, '--config.num_train_steps=100000', '--distributed_timeout=5')
  deadline = time.time() + 300
  while 4 not in checkpoints.checkpoint_steps(workdir):
    assert time.time() < deadline
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGKILL)
  killed_at = time.time()
  code = procs[0].wait(timeout=120)
  assert code != 0 and time.time() - killed_at < 60
  log = open(procs[0].log_path).read()
  # The runtime's heartbeat check stops it, or, when the dead peer's socket closes in the
  # middle of a collective, gloo does first (on GPUs: NCCL); either way the process ends.
  assert ('JAX distributed service detected fatal errors' in log
          or 'gloo::EnforceNotMet' in log or 'Connection closed by peer' in log), log[-3000:]
  procs[1].wait()
  logs = run(workdir, '--config.num_train_steps=8')
  assert all('Resuming at step' in log for log in logs)


def test_processes_with_different_configs_fail_clearly(tmp_path):
  workdir = str(tmp_path / 'run')  # process 1 was given another command
  commands = [(workdir, ['--config.num_train_steps=4', f'--config.seed={seed}']) for seed in (0, 1)]
  codes, logs = finish(start_each(commands))
  for code, log in zip(codes, logs, strict=True):
    assert code == 1, log[-2000:]
    assert log.strip().splitlines()[-1].startswith(
        't2t_jax: error: The processes of this run differ in their config')
  assert not os.path.exists(os.path.join(workdir, 'checkpoints'))


def test_hosts_that_do_not_share_the_workdir_fail_clearly(one, tmp_path):
  """Each process sees its own folder, as on hosts without a shared file system: process 0
  finds checkpoint 4, process 1 none. Restoring would give the hosts different states (or
  hang in orbax's barriers); it is an error on both instead."""
  workdirs = [str(tmp_path / f'host{i}') for i in range(2)]
  os.makedirs(os.path.join(workdirs[0], 'checkpoints'))
  shutil.copytree(os.path.join(one, 'checkpoints', '4'),
                  os.path.join(workdirs[0], 'checkpoints', '4'))
  codes, logs = finish(start_each([(w, [f'--config.num_train_steps={STEPS}']) for w in workdirs]))
  for code, log in zip(codes, logs, strict=True):
    assert code == 1, log[-2000:]
    assert log.strip().splitlines()[-1].startswith(
        't2t_jax: error: The processes of this run differ in their checkpoints')
