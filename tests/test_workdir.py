"""The workdir: one trainer at a time (a lock a crashed run gives up), no URLs, the recorded
config, atomic writes, moving aside instead of deleting."""
import errno
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from experiments import demo
from helpers import ROOT
from t2t_jax.platform import files, workdir
from t2t_jax.run import recorded as recorded_lib

TINY = ['--config=experiments/demo.py', '--config.dataset=synthetic',
        '--config.model.num_layers=1', '--config.model.d_model=32', '--config.model.d_ff=64',
        '--config.vocab_size=40', '--config.max_length=12', '--config.tokens_per_batch=192',
        '--config.num_train_steps=2']

HOLD_LOCK = '''
import sys, time
from t2t_jax.platform import files, workdir
with workdir.training_lock(sys.argv[1]):
  print('locked', flush=True)
  time.sleep(600)
'''


def test_a_second_lock_on_the_same_workdir_is_refused(tmp_path):
  with workdir.training_lock(str(tmp_path)):
    with pytest.raises(workdir.WorkdirBusy, match=f'in use by another training run \\(pid '
                                                  f'{os.getpid()} on '):
      with workdir.training_lock(str(tmp_path)):
        pass
  with workdir.training_lock(str(tmp_path)):  # released: free again
    pass


@pytest.mark.e2e
def test_a_full_disk_at_the_start_names_the_lock_file(tmp_path, monkeypatch):
  """The first write of a run is the lock's holder line: on a full disk its error names the
  file (the system's own names none: a write's errno carries no path)."""
  open_file = files.open_file

  class FullDisk:
    def __init__(self, *args):
      self.file = open_file(*args)

    def __getattr__(self, name):
      return getattr(self.file, name)

    def flush(self):
      raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(files, 'open_file', FullDisk)
  with pytest.raises(files.DiskWriteError, match=re.escape(
      f'{tmp_path / "train.lock"}: cannot write the training lock (who holds the workdir): '
      'No space left on device')):
    with workdir.training_lock(str(tmp_path)):
      pass


def test_a_second_trainer_is_refused_and_a_killed_ones_lock_is_taken_over(cli, tmp_path):
  """Another process holds the lock: refused; that process killed: its lock is taken over."""
  holder = subprocess.Popen([sys.executable, '-c', HOLD_LOCK, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'locked'
    result = cli(*TINY, f'--workdir={tmp_path}')
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f't2t_jax: error: {tmp_path} is in use by another training run '
                           f'(pid {holder.pid} on ')
    assert not (tmp_path / 'checkpoints').exists()  # refused before any work
  finally:
    holder.send_signal(signal.SIGKILL)  # a crash: the kernel drops its lock
    holder.wait()
  result = cli(*TINY, f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / 'checkpoints' / '2').is_dir()


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_url_workdirs_are_refused_in_one_line(cli, tmp_path, mode):
  result = cli(*TINY, '--workdir=gs://bucket/run', f'--mode={mode}')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith(
      't2t_jax: error: --workdir=gs://bucket/run: URLs are not supported as workdirs')
  assert not os.path.exists(os.path.join(ROOT, 'gs:'))


def test_write_text_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
  path = str(tmp_path / 'scores.json')
  files.write_text(path, 'old\n')
  def failing_replace(src, dst):
    raise OSError(28, 'No space left on device', src)
  monkeypatch.setattr(os, 'replace', failing_replace)
  with pytest.raises(OSError, match='No space left'):
    files.write_text(path, 'new\n')
  assert open(path).read() == 'old\n'
  assert os.listdir(tmp_path) == ['scores.json']  # no temporary left behind


def test_config_record_and_differences(tmp_path, caplog):
  config = demo.get_config()
  recorded_lib.save_config(str(tmp_path), config)
  recorded = json.load(open(tmp_path / 'config.json'))
  assert recorded['model']['d_model'] == 128 and recorded['model']['d_k'] is None
  assert recorded_lib.compare_config(str(tmp_path), config) == {}
  config.model.num_layers = 6
  config.seed = 3
  assert recorded_lib.compare_config(str(tmp_path), config) == {
      'config.model.num_layers': (3, 6), 'config.seed': (0, 3)}
  assert 'config.model.num_layers: 3 -> 6; config.seed: 0 -> 3' in caplog.text


def test_move_aside_keeps_everything(tmp_path):
  (tmp_path / 'checkpoints' / '8').mkdir(parents=True)
  (tmp_path / 'metrics.jsonl').write_text('{"step": 8}\n')
  first = workdir.move_aside(str(tmp_path), ['checkpoints/8', 'metrics.jsonl', 'eval'], 'test')
  second = workdir.move_aside(str(tmp_path), ['metrics.jsonl'], 'test')  # nothing left to move
  assert second is None
  assert os.path.isdir(os.path.join(first, 'checkpoints', '8'))
  assert open(os.path.join(first, 'metrics.jsonl')).read() == '{"step": 8}\n'
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == []
