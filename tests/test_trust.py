"""A workdir from someone else is data: what it records never chooses where the process writes
outside it, what it runs or what it loads as native code; nothing is written through a
symbolic link planted in it; and a mode that cannot write there says so in one line and exits
(docs/modes.md, "A run from someone else").

The tiny trained run (`run`, conftest.py) is copied before a test plants anything in it.
"""
import ast
import contextlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile
import threading

import jax
import pytest

from experiments import wmt_ende_base
from helpers import ROOT, cpu_env, the_one_error, tiny_config
from t2t_jax import Translator
from t2t_jax.apps import attention_maps, evaluate, export
from t2t_jax.modes import translate as translate_command
from t2t_jax.platform import errors, files
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.platform.metrics import MetricWriter
from t2t_jax.run import averaging, recorded
from t2t_jax.training import checkpoints

VICTIM_TEXT = 'a file outside the workdir\n'


@pytest.fixture
def victim(tmp_path):
  """A file and a folder outside the workdir that a planted link points to."""
  outside = tmp_path / 'outside'
  outside.mkdir()
  (outside / 'victim.txt').write_text(VICTIM_TEXT)
  return outside


def assert_untouched(outside):
  assert sorted(os.listdir(outside)) == ['victim.txt']
  assert (outside / 'victim.txt').read_text() == VICTIM_TEXT


# ------------------------------------------------------------ a recorded run is data


def record(run, **values):
  path = os.path.join(run, workdir_lib.CONFIG)
  with open(path) as f:
    config = json.load(f)
  config.update(values)
  with open(path, 'w') as f:
    json.dump(config, f)


def test_a_recorded_compilation_cache_is_never_used(run, caplog):
  """A shipped run's config.json named a folder of its own as the compilation cache: JAX
  wrote its programs there and loaded what it found, native code chosen by whoever shipped it."""
  planted = os.path.join(run, 'planted-cache')
  record(run, compilation_cache_dir=planted, compile_ahead=False)
  translator = Translator.from_workdir(run)
  assert translator.config.compilation_cache_dir == recorded.MACHINE_KEYS['compilation_cache_dir']
  assert translator.config.compile_ahead is True
  assert jax.config.jax_compilation_cache_dir != planted
  translator.translate(['5 6 7'])
  assert not os.path.exists(planted)
  assert f"compilation_cache_dir='{planted}', a setting of the machine" in caplog.text
  # The invocation chooses, as ever.
  chosen = Translator.from_workdir(run, {'compilation_cache_dir': ''})
  assert chosen.config.compilation_cache_dir == ''


def test_the_machine_keys_reset_to_the_base_configs_defaults():
  base = wmt_ende_base.get_config()
  assert recorded.MACHINE_KEYS == {key: base[key] for key in recorded.MACHINE_KEYS}


def test_nothing_unpickles():
  """Checkpoints load through orbax's TensorStore and JSON, configs and metrics as JSON: no
  module of the package can turn a workdir's bytes into code."""
  forbidden_modules = {'pickle', 'cPickle', 'dill', 'cloudpickle', 'marshal', 'shelve', 'joblib'}
  found = []
  for path in sorted(pathlib.Path(ROOT, 't2t_jax').rglob('*.py')):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.Import):
        names = [alias.name.split('.')[0] for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module.split('.')[0]]
      found += [f'{path}:{node.lineno} imports {n}' for n in names if n in forbidden_modules]
      if isinstance(node, ast.keyword) and node.arg == 'allow_pickle':
        found.append(f'{path}:{node.lineno} passes allow_pickle')
      if isinstance(node, ast.Call) and getattr(node.func, 'id', None) in ('eval', 'exec'):
        found.append(f'{path}:{node.lineno} calls {node.func.id}')
      if (isinstance(node, ast.Attribute) and node.attr == 'load'
          and getattr(node.value, 'id', None) == 'torch'):
        found.append(f'{path}:{node.lineno} calls torch.load')
  assert not found, found


# ------------------------------------------------------------ no write through a link


def plant(link, target):
  link = pathlib.Path(link)
  link.parent.mkdir(parents=True, exist_ok=True)
  if link.is_dir() and not link.is_symlink():
    shutil.rmtree(link)
  with contextlib.suppress(FileNotFoundError):
    link.unlink()
  link.symlink_to(target)


def test_the_training_lock_is_not_written_through_a_link(run, victim):
  plant(os.path.join(run, workdir_lib.LOCK), victim / 'victim.txt')
  with pytest.raises(files.LinkRefused, match='train.lock: a symbolic link'):
    workdir_lib._lock(os.path.join(run, workdir_lib.LOCK))
  assert_untouched(victim)


@pytest.mark.parametrize('name', ['metrics.jsonl', 'tensorboard'])
def test_metrics_are_not_written_through_a_link(run, victim, name):
  plant(os.path.join(run, name), victim / 'victim.txt' if '.' in name else victim)
  with pytest.raises(files.LinkRefused, match=f'{name}: a symbolic link'):
    MetricWriter(run)
  assert_untouched(victim)


def test_a_torn_line_is_not_set_aside_through_a_link(run, victim):
  (victim / 'victim.txt').write_text('{"step": 1}\n{"st')  # would be truncated
  plant(os.path.join(run, 'metrics.jsonl'), victim / 'victim.txt')
  with pytest.raises(files.LinkRefused):
    files.set_aside_torn_tail(os.path.join(run, 'metrics.jsonl'))
  assert (victim / 'victim.txt').read_text() == '{"step": 1}\n{"st'
  assert sorted(os.listdir(victim)) == ['victim.txt']


def test_provenance_is_not_appended_through_a_link(run, victim):
  plant(os.path.join(run, workdir_lib.PROVENANCE), victim / 'victim.txt')
  with pytest.raises(files.LinkRefused, match='provenance.jsonl: a symbolic link'):
    workdir_lib.record_invocation(run, 6)
  assert_untouched(victim)


def test_a_planted_temporary_file_is_replaced_not_followed(run, victim):
  path = os.path.join(run, 'notes.txt')
  plant(f'{path}.tmp-{os.getpid()}', victim / 'victim.txt')
  files.write_text(path, 'ours\n')
  assert open(path).read() == 'ours\n'
  assert_untouched(victim)


def test_averages_are_not_written_into_a_linked_folder(run, victim):
  plant(os.path.join(run, checkpoints.AVERAGED), victim)
  with pytest.raises(files.LinkRefused, match='averaged: a symbolic link'):
    averaging.average_checkpoints(run, 2)
  assert_untouched(victim)


def test_evaluations_are_not_written_into_a_linked_folder(run, victim, monkeypatch):
  plant(os.path.join(run, evaluate.EVAL), victim)
  monkeypatch.setattr(evaluate, 'Translator', None)  # refused before decoding
  with pytest.raises(files.LinkRefused, match='eval: a symbolic link'):
    evaluate.evaluate(tiny_config(), run)
  assert_untouched(victim)


def test_checkpoints_are_not_written_into_a_linked_folder(tmp_path, victim):
  plant(tmp_path / 'run' / checkpoints.CHECKPOINTS, victim)
  with pytest.raises(files.LinkRefused, match='checkpoints: a symbolic link'):
    checkpoints.Checkpointer(str(tmp_path / 'run'), keep=2)
  assert_untouched(victim)


@pytest.mark.slow
def test_attention_maps_are_not_written_through_links(run, victim, tmp_path):
  plant(os.path.join(run, 'attention'), victim)
  with pytest.raises(files.LinkRefused, match='attention: a symbolic link'):
    attention_maps.draw(tiny_config(), run, '5 6 7', None, layers=[0])
  assert_untouched(victim)
  # A map's own name planted as a link in the chosen folder: replaced, not followed.
  out = tmp_path / 'maps'
  plant(out / 'encoder_self_attention_layer0.png', victim / 'victim.txt')
  paths = attention_maps.draw(tiny_config(), run, '5 6 7', str(out), layers=[0])
  assert str(out / 'encoder_self_attention_layer0.png') in paths
  assert not (out / 'encoder_self_attention_layer0.png').is_symlink()
  assert_untouched(victim)


def test_a_stream_is_not_written_through_a_planted_partial_file(run, victim, tmp_path):
  """--input=- --output=O with O.partial a link: the victim was truncated and received the
  translations."""
  output = tmp_path / 'out.txt'
  plant(f'{output}.partial', victim / 'victim.txt')
  with pytest.raises(files.LinkRefused, match='out.txt.partial: a symbolic link'):
    with translate_command.stream_output(str(output)):
      pass
  assert_untouched(victim)
  assert not output.exists()


def test_an_export_onto_a_link_is_named(tmp_path):
  """It said "Not a directory"."""
  (tmp_path / 'empty').mkdir()
  plant(tmp_path / 'link', tmp_path / 'empty')
  with pytest.raises(errors.UserError, match=r'--output=.*link: a symbolic link; name the folder'):
    export.check_output_dir(str(tmp_path / 'link'))


def test_new_files_and_folders_are_never_writable_by_everyone(tmp_path):
  umask = os.umask(0)
  try:
    files.write_text(str(tmp_path / 'a.txt'), 'a\n')
    with files.open_file(str(tmp_path / 'b.jsonl'), 'a', 'records') as f:
      f.write('{}\n')
    files.make_folder(str(tmp_path / 'c' / 'd'), str(tmp_path), 'a folder')
    temp = files.make_temp_dir(str(tmp_path))
  finally:
    os.umask(umask)
  for path in (tmp_path / 'a.txt', tmp_path / 'b.jsonl', tmp_path / 'c', tmp_path / 'c' / 'd',
               pathlib.Path(temp)):
    assert not os.stat(path).st_mode & stat.S_IWOTH, path


# ------------------------------------------------------------ one writer per output


def test_two_streams_to_one_output_give_one_whole_output_and_one_error(run, tmp_path, cli):
  """Both wrote O.partial: O was published with 28 lines for 20 inputs, and the other run
  ended in a FileNotFoundError traceback."""
  output = tmp_path / 'out.txt'
  with translate_command.stream_output(str(output)) as first:
    first.write(b'one\n')
    done = cli(f'--workdir={run}', '--mode=translate', '--input=-', f'--output={output}',
               input='5 6 7\n')
    assert done.returncode == 1
    assert the_one_error(done.stderr) == (
        f't2t_jax: error: --output={output}: another translation is writing it (it holds '
        f'{output}.partial); wait for it to finish, or name another --output')
    assert not output.exists()
  assert output.read_text() == 'one\n'
  assert not os.path.exists(f'{output}.partial')
  # After it, the next stream takes the output over whole.
  done = cli(f'--workdir={run}', '--mode=translate', '--input=-', f'--output={output}',
             input='5 6 7\n6 7\n')
  assert done.returncode == 0, done.stderr[-3000:]
  assert len(output.read_text().splitlines()) == 2


def test_a_claim_racing_a_publish_takes_the_new_partial_file(tmp_path):
  """The file a stream locks may have been renamed to O by the stream that held it: the lock
  must then be taken on the new O.partial, or two writers would share one file."""
  output = str(tmp_path / 'out.txt')
  with translate_command.stream_output(output) as first:
    first.write(b'first\n')
    stale = files.open_file(f'{output}.partial', 'ab', 'x')  # opened before the rename
  # The first stream published and unlocked; `stale` is now the file named out.txt.
  import fcntl
  fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a racing claim would get
  stale.close()
  with translate_command.stream_output(output) as second:
    second.write(b'second\n')
  assert open(output).read() == 'second\n'


# ------------------------------------------------------------ read-only workdirs


def read_only_prefix(path) -> list[str]:
  """A command prefix that runs a process with `path` read-only: a read-only bind mount in a
  mount namespace of its own for root (whom permissions do not stop), else `path`'s write
  permissions removed by the test."""
  if os.geteuid() != 0:
    for folder, _, names in os.walk(path):
      for name in [*names, '']:
        entry = os.path.join(folder, name)
        os.chmod(entry, os.stat(entry).st_mode & ~0o222)
    return []
  probe = subprocess.run(['unshare', '-m', 'true'], capture_output=True)
  if probe.returncode:
    pytest.skip(f'root, and no mount namespace to make a folder read-only in: {probe.stderr!r}')
  return ['unshare', '-m', 'sh', '-c', 'mount --bind "$0" "$0" && mount -o remount,bind,ro '
          '"$0" && exec "$@"', str(path)]


READ_ONLY_CASES = {
    # mode: (arguments, what the error line says, or None: the mode works read-only)
    'train': (['--config=experiments/demo.py', '--config.dataset=synthetic',
               '--config.num_train_steps=9'], 'train.lock: cannot write'),
    'average': (['--config.average_last=1'], 'averaged: cannot write'),
    'eval': ([], 'eval: cannot write the evaluation'),
    'attention': (['--input=5 6 7'], 'attention: cannot write'),
    'translate': (['--input={input}', '--output={run}/out.txt'], 'out.txt: cannot write'),
    'translate to stdout': (['--input={input}'], None),
}


@pytest.mark.slow
@pytest.mark.e2e
def test_every_mode_on_a_read_only_workdir_exits_after_one_line(run, tmp_path):
  """--mode=average on a read-only workdir printed its error, then never exited (orbax's
  writer threads waited for a folder it had failed to make); eval decoded the whole split
  before finding it could not write. Each mode now stops at once, or works if it only reads."""
  lines = tmp_path / 'in.txt'
  lines.write_text('5 6 7\n')
  prefix = read_only_prefix(run)
  failures = []
  for case, (arguments, error) in READ_ONLY_CASES.items():
    mode = case.split()[0]
    argv = [*prefix, sys.executable, '-m', 't2t_jax.main', f'--workdir={run}', f'--mode={mode}',
            *[a.format(input=lines, run=run) for a in arguments]]
    try:
      done = subprocess.run(argv, cwd=ROOT, env=cpu_env(1), capture_output=True, text=True,
                            timeout=120)
    except subprocess.TimeoutExpired:
      failures.append(f'{case}: still running after 120 s')
      continue
    if error is None:
      if done.returncode:
        failures.append(f'{case}: exit {done.returncode}: {done.stderr[-1000:]}')
    elif done.returncode != 1 or error not in the_one_error(done.stderr):
      failures.append(f'{case}: exit {done.returncode}: {done.stderr[-1000:]}')
  assert not failures, '\n'.join(failures)


def unprivileged(path) -> list[str]:
  """A command prefix running as an unprivileged user, who owns `path` (root reads anything)."""
  if os.geteuid() != 0:
    return []
  if not shutil.which('setpriv'):
    pytest.skip('root, and no setpriv to run as another user')
  nobody = 65534
  for folder, _, names in os.walk(path):
    for name in [*names, '']:
      os.lchown(os.path.join(folder, name), nobody, nobody)
  return ['setpriv', f'--reuid={nobody}', f'--regid={nobody}', '--clear-groups']


@pytest.mark.e2e
def test_a_checkpoint_without_read_permission_is_not_taken_for_corrupt(tiny_workdir):
  """A chmod-000 checkpoint was moved to corrupt-N and the run retrained from the one before."""
  base = tempfile.mkdtemp(prefix='t2t_jax-unreadable-')  # where another user may enter
  try:
    os.chmod(base, 0o755)
    run = os.path.join(base, 'run')
    shutil.copytree(tiny_workdir, run, ignore=shutil.ignore_patterns('averaged', 'eval'))
    prefix = unprivileged(run)
    os.chmod(os.path.join(run, 'checkpoints', '6'), 0)
    config = os.path.join(base, 'tiny.py')
    with open(config, 'w') as f:
      f.write(f'import sys\nsys.path.insert(0, {os.path.join(ROOT, "tests")!r})\n'
              'from helpers import tiny_config as get_config\n')
    os.chmod(config, 0o644)
    done = subprocess.run(
        [*prefix, sys.executable, '-m', 't2t_jax.main', f'--config={config}', f'--workdir={run}',
         '--config.num_train_steps=9', '--config.compilation_cache_dir='],
        cwd=ROOT, env=cpu_env(1, HOME=base), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert the_one_error(done.stderr).startswith(
        f't2t_jax: error: {run}/checkpoints/6: cannot be read (permission denied')
    assert sorted(os.listdir(os.path.join(run, 'checkpoints'))) == ['3', '6']
  finally:
    for folder, dirs, _ in os.walk(base):
      for name in dirs:
        os.chmod(os.path.join(folder, name), 0o755)
    shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------ streams that end cleanly


@pytest.mark.e2e
def test_a_closed_output_ends_a_stream_whose_input_stays_open(run):
  """`(while :; do echo a .; sleep 3; done) | t2t-jax --input=- | head -1` aborted with "Fatal
  Python error: _enter_buffered_busy", exit 134: the reader thread was blocked in stdin."""
  command = (f'(for i in $(seq 60); do echo 5 6 7; sleep 1; done) | {sys.executable} -m '
             f't2t_jax.main --workdir={run} --mode=translate --input=- | head -1 >/dev/null; '
             'echo "status ${PIPESTATUS[1]}" >&2')
  done = subprocess.run(['bash', '-c', command], cwd=ROOT, env=cpu_env(2), capture_output=True,
                        text=True, timeout=120)
  assert done.stderr.strip().splitlines()[-1] == 'status 141', done.stderr[-3000:]
  assert 'Fatal' not in done.stderr and 'Traceback' not in done.stderr, done.stderr[-3000:]


def test_no_thread_of_a_failed_average_is_left_waiting(run, monkeypatch):
  """The average's folder could not be made: orbax's writer threads waited for it forever."""
  def refuse(path, mode=0o777):
    raise OSError(30, 'Read-only file system', path)
  before = set(threading.enumerate())
  monkeypatch.setattr(os, 'mkdir', refuse)
  with pytest.raises(files.DiskWriteError, match='Read-only file system'):
    averaging.average_checkpoints(run, 2)
  monkeypatch.undo()
  left = [t for t in set(threading.enumerate()) - before if t.is_alive() and not t.daemon]
  assert not left, left
