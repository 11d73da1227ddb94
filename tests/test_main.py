"""The command line as a new user meets it: a mistake is one line naming what is wrong and
what would be right, not a traceback, and nothing is done before it is found."""
import errno
import logging
import os
import re
import subprocess
import sys
import threading

import jax
import pytest
from absl import logging as absl_logging
from absl.testing import flagsaver

from experiments import table3
from helpers import ROOT, tiny_config
from t2t_jax import cli as cli_lib
from t2t_jax import main
from t2t_jax.config.modes import MODES
from t2t_jax.model.transformer import ModelConfig, init_param_count
from t2t_jax.modes import params as params_mode
from t2t_jax.platform import errors


def one_error_line(result):
  """The one line of stderr (asserting that there is just one and no traceback)."""
  assert result.returncode != 0, result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  return lines[0]


def test_misspelt_key_names_the_nearest_key(cli, tmp_path):
  line = one_error_line(cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
                            '--config.modle.d_model=3'))
  assert line == 't2t_jax: error: config.modle: no such key; did you mean config.model?'
  assert not os.listdir(tmp_path)


def test_misspelt_nested_key_names_the_nearest_key_at_its_level(cli, tmp_path):
  line = one_error_line(cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
                            '--config.model.d_modle=3'))
  assert line == ('t2t_jax: error: config.model.d_modle: no such key; '
                  'did you mean config.model.d_model?')


def test_missing_config_file_lists_the_experiments(cli, tmp_path):
  line = one_error_line(cli('--config=experiments/nope.py', f'--workdir={tmp_path}'))
  assert line.startswith('t2t_jax: error: --config=experiments/nope.py: no such file;')
  for name in ('demo', 'table3', 'wmt_ende_base', 'wmt_ende_big', 'wmt_enfr_big'):
    assert f'experiments/{name}.py' in line
  assert not os.listdir(tmp_path)


def test_misspelt_config_file_names_the_nearest_one(cli):
  line = one_error_line(cli('--config=experiments/tabel3.py:B_dk16', '--mode=params'))
  assert line.endswith('no such file; did you mean experiments/table3.py:B_dk16?')


def test_unknown_table3_row_lists_every_row(cli, tmp_path):
  line = one_error_line(cli('--config=experiments/table3.py:Z_bad',
                            f'--workdir={tmp_path}'))
  assert line.startswith("t2t_jax: error: experiments/table3.py: unknown row 'Z_bad'")
  for row in [*table3.ROWS, 'big']:
    assert f"'{row}'" in line


@pytest.mark.parametrize('args,named', [
    (['--config.num_train_steps=abc'], '--config.num_train_steps=abc'),  # a bad type
    (['--mode=bogus'], '--mode=bogus'),
    (['--config.warmup_steps=0'], 'config.warmup_steps: must be a positive integer, got 0'),
])
def test_other_mistakes_stay_short(cli, tmp_path, args, named):
  result = cli('--config=experiments/demo.py', f'--workdir={tmp_path}', *args)
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
  assert named in result.stderr and len(result.stderr.strip().splitlines()) <= 2
  assert not os.listdir(tmp_path)


def test_missing_config_flag_stays_short(cli, tmp_path):
  line = one_error_line(cli('--mode=params'))
  assert line == ('t2t_jax: error: --mode=params needs --config=FILE (e.g. '
                  'experiments/wmt_ende_base.py)')
  line = one_error_line(cli('--mode=eval', f'--workdir={tmp_path}'))  # nothing recorded
  assert line.startswith(f't2t_jax: error: {tmp_path}/config.json: no recorded run there')
  line = one_error_line(cli('--mode=params', f'--workdir={tmp_path}'))
  assert line.startswith(f't2t_jax: error: {tmp_path}/config.json: no recorded run there')


def test_params_of_a_trained_run_read_its_recorded_config(cli, tiny_workdir):
  """--mode=params with only --workdir counts the recorded run's parameters (it once
  ignored --workdir and asked for --config)."""
  done = cli('--mode=params', f'--workdir={tiny_workdir}')
  config = ModelConfig.from_config(tiny_config())
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == f'params: {init_param_count(config)}'


def test_eval_of_files_a_run_does_not_read_is_refused(cli, tiny_workdir):
  """`--mode=eval --config.test_files=...` on a run of another dataset scored that dataset's
  own test set."""
  result = cli(f'--workdir={tiny_workdir}', '--mode=eval', '--config.test_files=/my/test')
  assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr
  line = result.stderr.strip().splitlines()[-1]  # after the line naming the recorded config
  assert line == ("t2t_jax: error: config.test_files='/my/test': read only with "
                  "config.dataset='files', not 'synthetic', which would ignore it; add "
                  "--config.dataset=files, or leave test_files unset")


@pytest.mark.parametrize('override,named', [
    ('--config.average_last=30', 'config.average_last: must be ≤ config.keep_checkpoints (20)'),
    ('--config.eval_split=valid', "config.eval_split: must be one of ('dev', 'test')"),
])
def test_average_validates_before_work(cli, tmp_path, override, named):
  """Not even the empty-workdir check comes first: the config is read before anything."""
  line = one_error_line(cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
                            '--mode=average', override))
  assert line.startswith(f't2t_jax: error: {named}')
  assert not os.listdir(tmp_path)


def test_traceback_flag_still_shows_the_traceback(cli, tmp_path):
  result = cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
               '--config.modle.d_model=3', '--traceback')
  assert result.returncode != 0
  assert 'Traceback' in result.stderr and 'modle' in result.stderr


@pytest.mark.parametrize('error,one_line', [
    (errors.UserError('config.x: must be positive, got 0'), True),
    (errors.MissingFileError('in.txt: no such file'), True),
    (OSError(errno.ENOSPC, 'No space left on device', 'runs/x/metrics.jsonl'), True),
    (PermissionError(errno.EACCES, 'Permission denied', 'runs/x'), True),
    (ValueError('operands could not be broadcast together'), False),  # a bug inside
    (FileNotFoundError(errno.ENOENT, 'No such file or directory', '/tmp/gone'), False),
    (KeyError('params'), False),
])
def test_only_user_errors_become_one_line(monkeypatch, error, one_line):
  """main prints errors.UserError (and the system refusing a write) as one line; anything
  else is a bug and propagates with its traceback, never dressed up as a config mistake."""
  def mode(config, workdir):
    raise error
  monkeypatch.setattr(params_mode, 'run', mode)
  with flagsaver.flagsaver():
    main.FLAGS(['t2t_jax', f'--config={os.path.join(ROOT, "experiments", "demo.py")}',
                '--mode=params'])
    if one_line:
      with pytest.raises(SystemExit) as stopped:
        main.main(['t2t_jax'])
      assert stopped.value.code == f't2t_jax: error: {error}'
    else:
      with pytest.raises(type(error)):
        main.main(['t2t_jax'])


@pytest.mark.e2e
def test_the_console_script_and_python_m_t2t_jax_are_the_command_line():
  """`t2t-jax` (pyproject.toml's [project.scripts], beside this Python) and `python -m
  t2t_jax` run main.py's command line, exit status and one-line errors included."""
  script = os.path.join(os.path.dirname(sys.executable), 't2t-jax')
  assert os.path.isfile(script), 'pip install -e . makes it'
  # A process each: the console script's success, and `python -m`'s one-line error (the same
  # main.run behind both).
  done = subprocess.run([script, '--config=experiments/demo.py', '--mode=params'], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and done.stdout.strip() == 'params: 1639936', done.stderr
  wrong = subprocess.run([sys.executable, '-m', 't2t_jax', '--config=experiments/demo.py',
                          '--config.modle=3'], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
  assert wrong.returncode == 1
  assert wrong.stderr.strip() == ('t2t_jax: error: config.modle: no such key; did you mean '
                                  'config.model?')


@pytest.mark.e2e
def test_help_answers_before_anything_heavy_is_imported():
  """`--help` took 7 s and exited 1 with "Try --helpfull", naming no mode."""
  code = ('import sys\nsys.argv = ["t2t-jax", "--help"]\ntry:\n  import t2t_jax.__main__\n'
          'except SystemExit as e:\n  print("exit", e.code, "jax" in sys.modules)\n')
  done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert done.stdout.splitlines()[-1] == 'exit 0 False', done.stderr[-2000:]
  assert 'modes:' in done.stdout


def test_help_lists_every_mode_with_its_line_and_the_flags(cli):
  done = cli('--help')
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  listed = [line.split(maxsplit=1) for line in lines[lines.index('modes:') + 1:]
            if re.match(r'  \S', line)]
  assert [mode for mode, _ in listed[:len(MODES)]] == list(MODES)
  for mode, text in listed[:len(MODES)]:  # each its module's docstring's first line, wrapped
    assert cli_lib.summary(mode).startswith(text.strip()), mode
  assert all(f'  --{flag}: ' in done.stdout for flag in cli_lib.OWN_FLAGS)
  assert '--mode=help' in done.stdout and all(len(line) <= 100 for line in lines)


# ------------------------------------- the command line in this process (helpers.run_main)


def test_commands_in_one_process_do_not_leak_into_each_other(cli, tiny_workdir):
  """main runs command after command in one process: an override given to one command (of
  a recorded run, without --config) is not given to the next, nor is a --config file's."""
  run = f'--workdir={tiny_workdir}'
  assert cli(run, '--mode=params', '--config.model.dtype=float32').returncode == 0
  refused = cli(run, '--mode=params', '--config.vocab_size=33')
  assert 'config.vocab_size=33 contradicts' in refused.stderr
  again = cli(run, '--mode=params')
  assert again.returncode == 0 and again.stdout.startswith('params: '), again.stderr
  bigger = cli('--config=experiments/demo.py', '--mode=params', '--config.model.d_model=256')
  plain = cli('--config=experiments/demo.py', '--mode=params')
  assert bigger.stdout != plain.stdout == 'params: 1639936\n'


def process_state() -> dict:
  """What a command may change for the whole process, and a process's end would discard."""
  absl_handler = absl_logging.get_absl_handler()
  return {'flags': main.FLAGS.flag_values_dict(), 'environ': dict(os.environ),
          'cwd': os.getcwd(), 'argv': list(sys.argv), 'stdin': sys.stdin,
          'unraisablehook': sys.unraisablehook, 'handlers': list(logging.root.handlers),
          'levels': (logging.root.level, logging.getLogger('absl').level),
          'stream': absl_handler.python_handler.stream,
          'cache': jax.config.jax_compilation_cache_dir,
          'threads': {t for t in threading.enumerate() if not t.daemon}}


def test_a_command_in_this_process_leaves_it_as_it_found_it(cli, tiny_workdir, tmp_path):
  """The `cli` fixture puts back what a command sets for the whole process (flags, the
  environment, the log handler and levels, JAX's cache directory, ...), so that no test
  depends on which commands an earlier test in its process ran."""
  before = process_state()
  done = cli(f'--workdir={tiny_workdir}', '--mode=translate', '--input=-', '--verbosity=1',
             '--config.compilation_cache_dir=', input='5 6 7\n')
  assert done.returncode == 0 and done.stdout.count('\n') == 1, done.stderr[-3000:]
  assert process_state() == before
  failed = cli('--config=experiments/demo.py', f'--workdir={tmp_path}', '--config.modle=3')
  assert failed.returncode == 1 and failed.stderr == (
      't2t_jax: error: config.modle: no such key; did you mean config.model?\n')
  assert process_state() == before
