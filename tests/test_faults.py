"""Outputs under faults and user mistakes: every output is whole or absent, an earlier good
one stays until its replacement is complete, nothing is lost silently, and a mistake is one
line naming the file, key or path (no traceback), found before the work it would spoil.

The tiny trained run (`tiny_workdir`, conftest.py) is copied before a test changes it.
"""
import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from helpers import (
  COMMAND,
  MAX_LENGTH,
  ROOT,
  cpu_env,
  dead_pid,
  make_config,
  run_process,
  the_one_error,
  tiny_config,
)
from t2t_jax.apps import evaluate, export, translator
from t2t_jax.modes import train as trainer
from t2t_jax.modes import translate as translate_command
from t2t_jax.platform import distributed, errors, files, quiet
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.platform.metrics import MetricWriter
from t2t_jax.run import averaging, vocabulary
from t2t_jax.run import params as params_lib
from t2t_jax.training import checkpoints

# ------------------------------------------------- outputs: whole or not at all


def test_translating_into_a_folder_is_refused_before_decoding(run, tmp_path, monkeypatch):
  """An existing folder as --output once wrote nothing and exited 0."""
  monkeypatch.setattr(translator, 'Translator', None)  # decoding must not even start
  (tmp_path / 'in.txt').write_text('5 6 7\n')
  for output, named in ((tmp_path, 'is a folder'), (tmp_path / 'no' / 'out.txt', 'no folder')):
    with pytest.raises(errors.UserError, match=named):
      translate_command.translate(tiny_config(), run, str(tmp_path / 'in.txt'),
                                  str(output))
  with pytest.raises(errors.UserError, match='is a folder'):
    files.write_text(str(tmp_path), 'text\n')
  assert (tmp_path / 'in.txt').read_text() == '5 6 7\n'


def average(workdir, last):
  return averaging.average_checkpoints(workdir, last, allow_fewer=True)


def read_mean(workdir, step=6):
  return params_lib.restore_params(os.path.join(workdir, checkpoints.AVERAGED), step)


def assert_same(a, b):
  jax.tree_util.tree_map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


def test_a_failed_re_average_keeps_the_earlier_mean(run, monkeypatch):
  """Re-averaging once deleted averaged/<step>/ before writing the new mean: a kill or a
  full disk in between left none, and decode_params=auto then used the raw checkpoint."""
  average(run, 2)
  before = read_mean(run)
  def full_disk(*args, **kwargs):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(checkpoints.ocp.StandardCheckpointer, 'save', full_disk)
  with pytest.raises(OSError, match='No space left'):
    average(run, 1)
  monkeypatch.undo()
  assert params_lib.averaged_steps(run, 6) == [3, 6]
  assert_same(read_mean(run), before)
  assert params_lib.load_params(run).source == 'averaged/6'
  average(run, 2)  # the next averaging removes the failed one's temporary folder
  assert os.listdir(os.path.join(run, checkpoints.AVERAGED)) == ['6']


def test_a_re_average_over_other_checkpoints_keeps_the_earlier_one(run):
  """Another average_last once replaced the mean at the same path without a word."""
  average(run, 2)
  two = read_mean(run)
  average(run, 1)
  assert params_lib.averaged_steps(run, 6) == [6]
  [previous] = [n for n in os.listdir(run) if n.startswith('previous-')]
  moved = os.path.join(run, previous, checkpoints.AVERAGED)
  assert params_lib.averaged_steps(os.path.join(run, previous), 6) == [3, 6]
  assert_same(params_lib.restore_params(moved, 6), two)
  # The mean of checkpoint 6 alone is checkpoint 6's parameters.
  assert_same(read_mean(run), params_lib.load_params(run, which='checkpoint').params)


def fake_translator(covers, dtype='float32'):
  return types.SimpleNamespace(source='averaged/6', kind='averaged', step=6, covers=covers,
                               model_config=types.SimpleNamespace(dtype=dtype),
                               max_input_length=100, ensemble=[])


def test_eval_folders_name_everything_that_made_them():
  """Another test set, an average over other checkpoints or another dtype once shared the
  folder of an earlier result and replaced it."""
  config = tiny_config()
  name = lambda tr, src=('a b',), ref=('x y',): evaluate.eval_name(  # noqa: E731
      'test', tr, config, list(src), list(ref))
  base = name(fake_translator([3, 6]))
  assert base.startswith('test-averaged-6-beam4-alpha0.6-extra5-')
  others = {name(fake_translator([3, 6]), src=('a c',)), name(fake_translator([3, 6]), ref=('x',)),
            name(fake_translator([6])), name(fake_translator([3, 6], 'bfloat16'))}
  assert base not in others and len(others) == 4
  assert name(fake_translator([3, 6])) == base


@pytest.mark.slow
def test_an_evaluation_is_published_whole(run, monkeypatch):
  """Its three files were published one by one: a kill between them left new hypotheses
  beside an old scores.json, and a .tmp-* file that no later run removed."""
  config = tiny_config()
  evaluate.evaluate(config, run)
  [name] = os.listdir(os.path.join(run, 'eval'))
  folder = os.path.join(run, 'eval', name)
  before = {f: open(os.path.join(folder, f)).read() for f in os.listdir(folder)}
  write_text = files.write_text
  def dies_at_the_second_file(path, text):
    if path.endswith('references.txt'):
      raise KeyboardInterrupt  # as a kill would stop it, between two files
    write_text(path, text)
  monkeypatch.setattr(files, 'write_text', dies_at_the_second_file)
  with pytest.raises(KeyboardInterrupt):
    evaluate.evaluate(config, run)
  monkeypatch.undo()
  assert os.listdir(os.path.join(run, 'eval')) == [name]
  assert {f: open(os.path.join(folder, f)).read() for f in os.listdir(folder)} == before
  # A killed writer's temporary folder (its pid gone) is swept by the next evaluation.
  leftover = os.path.join(run, 'eval', f'.tmp-{files._host()}-{dead_pid()}-x')
  os.makedirs(leftover)
  evaluate.evaluate(config, run)
  assert not os.path.exists(leftover)
  assert os.listdir(os.path.join(run, 'eval')) == [name]  # the same evaluation: replaced
  [previous] = [n for n in os.listdir(run) if n.startswith('previous-')]
  assert os.listdir(os.path.join(run, previous, 'eval')) == [name]  # and kept


def test_a_killed_exports_leftovers_are_swept(tmp_path):
  leftover = tmp_path / f'.tmp-{files._host()}-{dead_pid()}-abc'
  leftover.mkdir()
  (leftover / 'model.safetensors').write_bytes(b'\0' * 1000)
  alive = tmp_path / f'.tmp-{files._host()}-{os.getpid()}-abc'  # a live writer's: kept
  alive.mkdir()
  someone_elses = tmp_path / '.tmp-notes'
  someone_elses.mkdir()
  os.utime(someone_elses, (0, 0))  # old, but not named by t2t_jax: not ours to remove
  export.write_folder({'config.json': b'{}'}, str(tmp_path / 'exported'))
  assert sorted(os.listdir(tmp_path)) == sorted([alive.name, someone_elses.name, 'exported'])


# ------------------------------------------------------------ append-only files


def test_a_torn_metrics_line_is_set_aside(tmp_path):
  """A full disk cut the last record mid-line; the resumed run appended onto it."""
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
  writer = MetricWriter(str(tmp_path))
  writer.write(3, {'loss': 1.5})
  writer.close()
  assert [json.loads(line)['step'] for line in path.read_text().splitlines()] == [1, 3]
  assert (tmp_path / 'metrics.jsonl.torn').read_text() == '{"step": 2, "lo\n'


def test_a_torn_provenance_line_is_set_aside(tmp_path):
  path = tmp_path / workdir_lib.PROVENANCE
  path.write_text('{"first_step": 1}\n{"first_st')
  workdir_lib.record_invocation(str(tmp_path), 10)
  assert [json.loads(line)['first_step'] for line in path.read_text().splitlines()] == [1, 11]


def test_a_torn_dev_record_is_named_when_choosing_the_best(run, caplog):
  """The best step's dev loss was in the torn last line: decode_params='best' chose another
  checkpoint without a word."""
  with open(os.path.join(run, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 3, "dev_loss": 0.01, "dev_perpl')
  caplog.set_level('WARNING')
  assert params_lib.ranked_steps(run, key='config.decode_params') == [6]
  [line] = [r.getMessage() for r in caplog.records if 'not a whole record' in r.getMessage()]
  count = len(open(os.path.join(run, 'metrics.jsonl')).read().splitlines())
  assert line.startswith(f'{run}/metrics.jsonl:{count} is not a whole record')


@pytest.mark.slow
def test_resuming_with_another_batching_names_the_ways_on(tmp_path):
  """A bucketed run resumed with batching='packed' was refused with no way out."""
  config = make_config(tmp_path, n_train=200, num_train_steps=1, checkpoint_every_steps=1,
                       eval_every_steps=100, log_every_steps=1, batching='buckets',
                       pack_length=MAX_LENGTH)
  config.model.update(num_layers=1, d_model=32, d_ff=32, num_heads=2)
  workdir = str(tmp_path / 'run')
  trainer.train_and_evaluate(config, workdir)
  config.update(batching='packed', num_train_steps=2)
  with pytest.raises(errors.UserError) as raised:
    trainer.train_and_evaluate(config, workdir)
  message = str(raised.value)
  assert "it was batched with config.batching='buckets', this run with 'packed'" in message
  assert message.endswith(
      'Resume with the settings it was started with (--config.batching=buckets); or start a '
      f'new run from its parameters (--config.init_from={workdir} and another --workdir: new '
      'Adam moments and schedule); or train this one from step 0 (--config.restart=True, its '
      'checkpoints moved aside).')
  assert checkpoints.checkpoint_steps(workdir) == [1]


# ------------------------------------------------------------ the vocabulary


def test_a_missing_vocabulary_under_checkpoints_is_an_error(tmp_path):
  """It was trained anew without a warning and the checkpoints resumed with it."""
  config = make_config(tmp_path, num_train_steps=2)
  workdir = tmp_path / 'work'
  (workdir / 'checkpoints' / '2').mkdir(parents=True)
  with pytest.raises(errors.UserError, match=r'vocab/spm.model: missing, but .* checkpoints'):
    trainer.train_and_evaluate(config, str(workdir))
  assert not (workdir / 'vocab').exists()


def test_resuming_with_a_vocabulary_other_than_the_recorded_one_is_an_error(run, monkeypatch):
  config = tiny_config()
  config.num_train_steps = 9
  monkeypatch.setattr(vocabulary, 'fingerprint', lambda tokenizer: 'another')
  data_state = checkpoints.read_data_state(run, 6)
  assert data_state.get(vocabulary.VOCABULARY) is not None  # recorded with each checkpoint
  with pytest.raises(errors.UserError, match='not the vocabulary the checkpoints were trained'):
    trainer.train_and_evaluate(config, run)


def test_resuming_another_model_shape_is_a_user_error(run):
  """The message was right, but a ValueError: a 95-line traceback."""
  config = tiny_config()
  config.model.d_ff = 128
  with pytest.raises(errors.UserError, match='config.model.d_ff'):
    trainer.train_and_evaluate(config, run)


# ------------------------------------------- one line for every mistake, on the CLI


def damage_config(run, content: bytes):
  with open(os.path.join(run, 'config.json'), 'wb') as f:
    f.write(content)


def config_file(json_path: str, tmp_path) -> str:
  """--config=FILE of a config recorded as JSON (a run's config.json), as a config file."""
  path = tmp_path / f'config_{abs(hash(json_path))}.py'
  path.write_text('import json\nimport ml_collections\n\n\ndef get_config():\n'
                  f'  with open({json_path!r}) as f:\n'
                  '    return ml_collections.ConfigDict(json.load(f))\n')
  return f'--config={path}'


def checkpoints_without_vocabulary(run, tmp_path):
  """A run on text files (which trains a vocabulary) whose vocab/ is gone, checkpoints kept."""
  (tmp_path / 'files.json').write_text(make_config(tmp_path, num_train_steps=2).to_json())
  (tmp_path / 'files_run' / 'checkpoints' / '2').mkdir(parents=True)


def hold_lock(run, tmp_path):
  """A running trainer's lock (released when the test's process ends or the file is closed)."""
  handle = workdir_lib._lock(os.path.join(run, workdir_lib.LOCK))
  hold_lock.handles.append(handle)
hold_lock.handles = []


def no_tfds(run, tmp_path):
  """A Python without the extra `wmt`: `import tensorflow` and `import tensorflow_datasets`
  fail (None in sys.modules; the test puts it back)."""
  return {'tensorflow': None, 'tensorflow_datasets': None}


def not_utf8_input(run, tmp_path):
  (tmp_path / 'in.txt').write_bytes(b'5 6 7\n8 \xff 9\n')


def config_without_get_config(run, tmp_path):
  (tmp_path / 'no_get_config.py').write_text('import ml_collections\nCONFIG = None\n')


def provenance_a_folder(run, tmp_path):
  os.remove(os.path.join(run, workdir_lib.PROVENANCE))
  os.makedirs(os.path.join(run, workdir_lib.PROVENANCE))


# Every mistake the README documents (and each of the issue's), as a user makes it on the
# command line. name: (what to do first, arguments, what the line names); `{run}`, `{tmp}`,
# `{recorded}` (--config=FILE of the run's recorded config) and `{files}` (that of
# checkpoints_without_vocabulary's run) are filled in.
MISTAKES = {
    # the workdir and what is recorded in it
    'config.json truncated': (lambda run, tmp: damage_config(run, b'{"model": {"d_mo'),
                              ['--mode=eval'], 'config.json: damaged'),
    'config.json not UTF-8': (lambda run, tmp: damage_config(run, b'\xff\xfe{}'),
                              ['--mode=translate', '--input=-'], 'config.json: damaged'),
    'config.json a list': (lambda run, tmp: damage_config(run, b'[1, 2]'), ['--mode=average'],
                           'config.json: damaged, a JSON list'),
    'workdir is a file': ('file', ['--mode=eval'], 'is a file, not a folder'),
    'workdir a URL': (None, ['--workdir=gs://bucket/run', '--config=experiments/demo.py'],
                      '--workdir=gs://bucket/run: URLs are not supported as workdirs'),
    'nothing recorded': ('empty', ['--mode=eval'], 'config.json: no recorded run there'),
    # training over what a run already has
    'another model shape': (None, ['{recorded}', '--config.model.d_ff=128'],
                            'config.model.d_ff'),
    'a second trainer': (hold_lock, ['{recorded}', '--config.num_train_steps=9'],
                         'is in use by another training run'),
    'vocabulary missing under checkpoints': (
        checkpoints_without_vocabulary, ['--workdir={tmp}/files_run', '{files}'],
        'vocab/spm.model: missing'),
    'restore_step with no such checkpoint': (None, ['{recorded}', '--config.restore_step=5'],
                                             'config.restore_step=5'),
    'tfds without the extra wmt': (no_tfds, ['--config=experiments/demo.py',
                                             '--config.dataset=tfds', '--workdir={tmp}/wmt'],
                                   "pip install 't2t_jax[wmt]'"),
    # decoding a trained run
    'override contradicting the trained model': (None, ['--mode=eval', '--config.model.d_ff=128'],
                                                 'config.model.d_ff'),
    'average over fewer checkpoints': (None, ['--mode=average', '--config.average_last=4'],
                                       'config.average_allow_fewer=True'),
    'restore_step unreadable for decoding': (None, ['--mode=eval', '--config.restore_step=4'],
                                             'config.restore_step=4'),
    'translate without --input': (None, ['--mode=translate'], '--input=FILE'),
    'n_best wider than the beam': (None, ['--mode=translate', '--input=-', '--n_best=9'],
                                   'config.beam_size'),
    'input missing': (None, ['--mode=translate', '--input={tmp}/none.txt'], 'none.txt'),
    'input line not UTF-8': (not_utf8_input, ['--mode=translate', '--input={tmp}/in.txt'],
                             'line 2'),
    'output in a missing folder': (None, ['--mode=translate', '--input=-',
                                          '--output=/nonexistent/out.txt'], 'no folder'),
    'output is a folder': (None, ['--mode=translate', '--input=-', '--output=.'], 'is a folder'),
    'stdin closed': (None, ['--mode=translate', '--input=-'], 'standard input is closed'),
    'export without --output': (None, ['--mode=export'], '--output=DIR'),
    'attention without --input': (None, ['--mode=attention'], '--input='),
    # Table 3's study
    'study override of a varied key': (None, ['--config=experiments/table3.py', '--mode=study',
                                              '--rows=A_h1', '--config.model.num_heads=2',
                                              '--workdir={tmp}/study'], 'row A_h1 sets it'),
    '--rows outside study': (None, ['--mode=eval', '--rows=A_h1'], '--rows'),
    '--rows empty': (None, ['--config=experiments/table3.py', '--mode=study', '--rows=',
                            '--workdir={tmp}/study'], '--rows=: no row named'),
    # the command line's own flags and files
    'config file without get_config': (config_without_get_config,
                                       ['--config={tmp}/no_get_config.py', '--mode=params'],
                                       'no_get_config.py'),
    'provenance.jsonl a folder': (provenance_a_folder,
                                  ['{recorded}', '--config.num_train_steps=9'],
                                  'provenance.jsonl: a folder'),
    '--distributed without a cluster': (None, ['--distributed', '--mode=params'],
                                        '--distributed: no cluster to join'),
    '--layers not numbers': (None, ['--mode=attention', '--input=5 6', '--layers=x'],
                             '--layers=x: layer numbers'),
}


# Mistakes that only a process of its own meets, and what starts the command: a process
# whose fd 0 is closed (sys.stdin is None; the shell closes it, where a preexec_fn would fork
# this JAX process), one that has not started JAX before --distributed, and one new to
# ml_collections.
IN_A_PROCESS = {'stdin closed': ['bash', '-c', 'exec "$@" <&-', 'bash'],
                '--distributed without a cluster': [],
                # ml_collections loads --config by importlib's load_module, into one module
                # of a process that keeps what an earlier config file defined: a file
                # without get_config is one only to a process that loaded no other.
                'config file without get_config': []}


@pytest.mark.parametrize('name', [pytest.param(name, marks=pytest.mark.e2e)
                                  if name in IN_A_PROCESS else name for name in sorted(MISTAKES)])
def test_every_mistake_is_one_line(cli, run, tmp_path, monkeypatch, name):
  damage, args, named = MISTAKES[name]
  workdir = run
  if damage == 'file':
    workdir = str(tmp_path / 'a_file')
    open(workdir, 'w').close()
  elif damage == 'empty':
    workdir = str(tmp_path / 'empty')
  elif damage:
    for module, value in (damage(run, tmp_path) or {}).items():
      monkeypatch.setitem(sys.modules, module, value)
  args = [a.format(run=run, tmp=tmp_path,
                   recorded=config_file(os.path.join(run, 'config.json'), tmp_path),
                   files=config_file(str(tmp_path / 'files.json'), tmp_path)) for a in args]
  if not any(a.startswith('--workdir=') for a in args):
    args.insert(0, f'--workdir={workdir}')
  try:
    if name in IN_A_PROCESS:
      result = subprocess.run([*IN_A_PROCESS[name], *COMMAND, *args], cwd=ROOT,
                              env=cpu_env(2), capture_output=True, text=True, timeout=300)
    else:
      result = cli(*args)
  finally:
    while hold_lock.handles:
      hold_lock.handles.pop().close()
  assert result.returncode == 1, result.stderr[-3000:]
  line = the_one_error(result.stderr)
  assert named in line, line


@pytest.mark.e2e
def test_a_closed_output_pipe_ends_quietly(run, tmp_path):
  """`... | head -1`: the reader is gone; no traceback, no message, as Unix tools do."""
  lines = tmp_path / 'in.txt'
  lines.write_text('5 6 7\n' * 20)
  command = (f'{sys.executable} -m t2t_jax.main --workdir={run} --mode=translate '
             f'--input={lines} | true; echo "status ${{PIPESTATUS[0]}}" >&2')
  env = cpu_env(2)
  result = subprocess.run(['bash', '-c', command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.stderr.strip().splitlines()[-1] == 'status 141', result.stderr[-3000:]
  assert 'Traceback' not in result.stderr and 'Broken pipe' not in result.stderr


@pytest.mark.e2e
def test_a_peer_that_never_starts_is_named_in_one_line(tmp_path):
  """`--distributed` with a peer that never starts once said nothing for 300 s, then
  aborted with a C++ stack trace."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  result = run_process('--distributed', '--distributed_start_timeout=4',
                       '--config=experiments/demo.py', f'--workdir={tmp_path}', '--mode=params',
                       devices=1, timeout=120, env={
                           'JAX_COORDINATOR_ADDRESS': f'127.0.0.1:{port}',
                           'JAX_NUM_PROCESSES': '3', 'JAX_PROCESS_ID': '0'})
  assert result.returncode == 1, result.stderr[-3000:]
  assert 'Check failure' not in result.stderr and 'Traceback' not in result.stderr
  lines = [line for line in result.stderr.strip().splitlines() if not re.match(r'I\d{4} ', line)]
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith('t2t_jax: error: --distributed: process 0 of 3 waited 4 s at '
                             f'127.0.0.1:{port} for process(es) 1, 2, which never connected')


TENSORSTORE_FULL_DISK = ValueError(
    'RESOURCE_EXHAUSTED: Error writing local file "run/checkpoints/7.orbax-checkpoint-tmp/'
    'params/_sharding": Failed to write 7716 bytes [errno=28]')


def test_a_full_disk_during_a_checkpoint_names_the_folder_once(run, monkeypatch):
  """It named no file, after ~250 lines of orbax's background-thread tracebacks; TensorStore
  reports it as a ValueError, not an OSError."""
  checkpointer = checkpoints.Checkpointer(run, keep=5)
  def full(*args, **kwargs):
    raise TENSORSTORE_FULL_DISK
  monkeypatch.setattr(checkpoints.ocp.CheckpointManager, 'save', full)
  monkeypatch.setattr(checkpoints.ocp.CheckpointManager, 'wait_until_finished', full)
  state = types.SimpleNamespace(step=np.int32(7), params={}, opt_state={}, rng=None)
  for call in (lambda: checkpointer.save(state, {}), checkpointer.wait):
    with pytest.raises(checkpoints.CheckpointWriteError) as info:
      call()
    assert errors.is_for_user(info.value)
    assert str(info.value).startswith(f'{checkpointer.directory}: cannot write checkpoints: '
                                      'RESOURCE_EXHAUSTED')
  assert errors.is_for_user(OSError(28, 'No space left on device'))
  assert not errors.is_for_user(ValueError('shapes (3,) and (4,) differ'))
  assert not errors.is_for_user(ValueError('RESOURCE_EXHAUSTED: Out of memory allocating'))


def test_orbax_tracebacks_of_a_full_disk_are_not_logged_again():
  """main's filter drops orbax's background-thread reports of the error it prints itself."""
  record = lambda exc, path='/site-packages/orbax/checkpoint/future.py': logging.LogRecord(  # noqa: E731
      'absl', logging.ERROR, path, 1, 'raised an exception', None,
      (type(exc), exc, None))
  quiet_filter = quiet.QuietLibraries()
  assert not quiet_filter.filter(record(TENSORSTORE_FULL_DISK))
  assert not quiet_filter.filter(record(OSError(28, 'No space left on device')))
  assert quiet_filter.filter(record(RuntimeError('a bug in orbax')))
  assert quiet_filter.filter(record(TENSORSTORE_FULL_DISK, path='/work/t2t_jax/trainer.py'))


def raised_in(filename: str, error: Exception) -> Exception:
  """`error` with a traceback through a file of that name (orbax's code, say)."""
  try:
    exec(compile('raise error', filename, 'exec'), {'error': error})
  except Exception as e:  # caught to be returned with its traceback
    return e


def test_asyncios_reports_of_orbax_tasks_are_not_logged_again():
  """A truncated checkpoint: every array's read task fails, the restore raises one error
  (named in a warning), and asyncio reported each other task's failure again."""
  def record(error):
    return logging.LogRecord('asyncio', logging.ERROR, '/python3/asyncio/base_events.py', 1,
                             'Task exception was never retrieved', None,
                             (type(error), error, error.__traceback__))
  quiet_filter = quiet.QuietLibraries()
  orbax_file = '/site-packages/orbax/checkpoint/_src/serialization/serialization.py'
  assert not quiet_filter.filter(record(raised_in(orbax_file, ValueError('OUT_OF_RANGE'))))
  assert quiet_filter.filter(record(raised_in('/t2t_jax/decoding/decode.py', ValueError('a bug'))))


def test_asyncios_reports_of_tensorstore_futures_are_not_logged_again(tmp_path):
  """orbax also hands TensorStore's futures to asyncio as tasks of their own: a failed one's
  traceback holds no orbax frame, only asyncio's, awaiting the future."""
  import tensorstore as ts

  async def failures():
    missing = {'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': str(tmp_path / 'none')}}
    tensorstore_task = asyncio.ensure_future(ts.open(missing, open=True))

    async def other():
      raise ValueError('a bug')
    return await asyncio.gather(tensorstore_task, asyncio.ensure_future(other()),
                                return_exceptions=True)
  from_tensorstore, from_elsewhere = asyncio.run(failures())
  assert isinstance(from_tensorstore, ValueError) and 'NOT_FOUND' in str(from_tensorstore)

  def record(error):
    return logging.LogRecord('asyncio', logging.ERROR, '/python3/asyncio/base_events.py', 1,
                             'Task exception was never retrieved', None,
                             (type(error), error, error.__traceback__))
  quiet_filter = quiet.QuietLibraries()
  assert not quiet_filter.filter(record(from_tensorstore))
  assert quiet_filter.filter(record(from_elsewhere))


@pytest.mark.slow
def test_a_truncated_checkpoint_is_named_without_a_flood(cli, run, tmp_path):
  """It was recovered correctly, but among 5,145 lines of log (106 without the damage):
  orbax's wrapped TensorStore spec in each warning, asyncio's and Python's reports of each
  failed read task."""
  data = [os.path.join(folder, name) for folder, _, names in
          os.walk(os.path.join(run, 'checkpoints', '6')) for name in names
          if os.path.basename(folder) == 'd']  # the arrays' data files
  assert data
  for path in data:
    os.truncate(path, os.path.getsize(path) // 2)
  result = cli(f'--workdir={run}', config_file(os.path.join(run, 'config.json'), tmp_path),
               '--config.num_train_steps=9')
  assert result.returncode == 0, result.stderr[-3000:]
  for noise in ('Traceback', 'Task exception', 'Exception ignored', 'TensorStore({'):
    assert noise not in result.stderr, result.stderr[-3000:]
  damaged = [line for line in result.stderr.splitlines() if 'OUT_OF_RANGE' in line]
  # Two retries, then set aside: of the metadata's read where that lay in a truncated half
  # (where orbax puts it varies from run to run), else of the arrays'.
  assert len(damaged) == 3, damaged
  assert 'moved it to' in damaged[-1] and 'corrupt-6' in damaged[-1]
  failed = [line for line in result.stderr.splitlines() if 'checkpoints/6 failed' in line]
  assert failed and set(failed) <= set(damaged)  # each names the reason, not orbax's wrapper
  assert os.path.isdir(os.path.join(run, 'checkpoints', '9'))


def test_a_waiting_process_says_whom_it_waits_for(monkeypatch, caplog):
  """Until the others connect, a process logs every WAIT_LOG_S seconds whom it waits for."""
  monkeypatch.setattr(distributed, 'WAIT_LOG_S', 0.1)
  caplog.set_level(logging.INFO)
  with distributed._waiting_for_peers({'process_id': 1, 'num_processes': 3,
                                       'coordinator_address': 'head:1234'}, timeout_s=60):
    time.sleep(0.35)
  waits = [r.getMessage() for r in caplog.records if 'waiting' in r.getMessage()]
  assert len(waits) >= 2, waits
  assert waits[0].startswith('Process 1 of 3: waiting 0 s so far at head:1234 for process(es) '
                             '0, 2 to connect (at most 60 s).')
  time.sleep(0.3)  # connected: it says no more
  assert len([r for r in caplog.records if 'waiting' in r.getMessage()]) == len(waits)


def test_native_hand_overs_to_a_closed_event_loop_are_not_reported(monkeypatch):
  """After a failed save orbax closes its asyncio loop, and TensorStore's native threads
  then hand each pending write to it: "Event loop is closed", raised with no Python frame
  below call_soon_threadsafe and reported as unraisable (20 to 250 tracebacks on a full
  disk). main's unraisable hook drops those; one with a Python caller still shows."""
  reported = []
  monkeypatch.setattr(sys, 'unraisablehook', reported.append)
  quiet.install()
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    error = e
  native = types.SimpleNamespace(exc_type=RuntimeError, exc_value=error, err_msg=None,
                                 exc_traceback=error.__traceback__.tb_next, object=None)
  python = types.SimpleNamespace(**{**vars(native), 'exc_traceback': error.__traceback__})
  assert native.exc_traceback.tb_frame.f_code.co_name == 'call_soon_threadsafe'
  sys.unraisablehook(native)
  sys.unraisablehook(python)
  assert reported == [python]


def test_asyncios_reports_of_tensorstore_errors_raised_to_orbax_are_dropped():
  """A TensorStore read or write that failed (its error names its spec) is raised to orbax's
  caller, and asyncio reports its future again when collected, with no traceback: dropped.
  Another error asyncio reports still shows."""
  def record(error):
    return logging.LogRecord('asyncio', logging.ERROR, '/usr/lib/asyncio/base_events.py', 1,
                             'Future exception was never retrieved', None,
                             (type(error), error, None))
  quiet_filter = quiet.QuietLibraries()
  assert not quiet_filter.filter(record(ValueError(
      'OUT_OF_RANGE: Error reading "params/d/5ec5" [tensorstore_spec=\'{"driver":"zarr"}\']')))
  assert quiet_filter.filter(record(ValueError('a bug in a callback')))
