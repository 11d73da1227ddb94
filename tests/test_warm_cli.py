"""tests/warm_cli.py: a forked command line behaves as the same command in a new interpreter
(the oracle: subprocess itself), and only commands it can fork faithfully are forked."""
import signal
import subprocess
import sys

import pytest

import warm_cli
from helpers import ROOT, TINY_CLI, cpu_env


@pytest.fixture(autouse=True)
def forking(monkeypatch):
  monkeypatch.delenv('T2T_JAX_TEST_FORK', raising=False)  # what is tested here is the fork


COMMANDS = {
    'params': [*TINY_CLI, '--mode=params'],
    'a config that does not exist': ['--config=experiments/nope.py', '--mode=params'],
    'a stdin translation without a run': ['--mode=translate', '--input=-', '--workdir=nowhere'],
}


@pytest.mark.parametrize('name', sorted(COMMANDS))
def test_a_forked_command_prints_and_exits_as_a_new_interpreter(name):
  args = [*warm_cli.COMMAND, *COMMANDS[name]]
  kwargs = dict(cwd=ROOT, env=cpu_env(2), capture_output=True, text=True, input='5 6\n',
                timeout=300)
  assert warm_cli._forkable(args, {'cwd': ROOT, 'env': kwargs['env']})  # noqa: SLF001
  forked, new = warm_cli.run(args, **kwargs), subprocess.run(args, **kwargs)
  assert forked.returncode == new.returncode
  assert forked.stdout == new.stdout
  # The logs differ in times and thread ids: the last line (a result or the error) does not.
  assert forked.stderr.strip().splitlines()[-1:] == new.stderr.strip().splitlines()[-1:]


def test_a_forked_command_is_polled_killed_and_waited_like_a_process(tiny_workdir):
  """A stdin translation waits for lines: alive until killed, then killed by SIGKILL."""
  process = warm_cli.popen([*warm_cli.COMMAND, *TINY_CLI, '--mode=translate', '--input=-',
                            f'--workdir={tiny_workdir}'], cwd=ROOT, env=cpu_env(2),
                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  assert isinstance(process, warm_cli._ForkedPopen)  # noqa: SLF001
  with pytest.raises(subprocess.TimeoutExpired):
    process.wait(timeout=2)
  assert process.poll() is None
  process.kill()
  assert process.wait(timeout=60) == -signal.SIGKILL
  assert process.poll() == -signal.SIGKILL
  process.stdin.close()


def test_what_a_fork_cannot_give_starts_a_new_interpreter():
  env = cpu_env(2)
  assert not warm_cli._forkable([sys.executable, '-c', 'pass'], {'env': env})  # noqa: SLF001
  assert not warm_cli._forkable([*warm_cli.COMMAND], {'env': env,  # noqa: SLF001
                                                      'preexec_fn': lambda: None})
  # A variable read when modules are imported (PYTHONPATH here) differs from the forkserver's.
  assert not warm_cli._forkable([*warm_cli.COMMAND], {  # noqa: SLF001
      'env': dict(env, PYTHONPATH='/elsewhere')})
  assert not warm_cli._forkable([*warm_cli.COMMAND], {'env': {}})  # noqa: SLF001  (an empty one)
  assert warm_cli._forkable([*warm_cli.COMMAND], {'env': dict(env, XLA_FLAGS='')})  # noqa: SLF001


def test_a_test_process_that_imported_tensorflow_sacremoses_or_torch_still_forks():
  """They set variables in os.environ when imported (the tests of tfds, of the tokenized
  BLEU and of the export import them, the export's at collection); the commands started
  after them must still be forks, not new interpreters."""
  import sacremoses  # noqa: F401
  import tensorflow  # noqa: F401
  import transformers

  assert transformers.MarianMTModel  # its import sets torch's TORCHINDUCTOR_CACHE_DIR

  assert warm_cli._forkable([*warm_cli.COMMAND, '--mode=params'], {})  # noqa: SLF001
  assert warm_cli._forkable([*warm_cli.COMMAND, '--mode=params'], {'env': cpu_env(2)})  # noqa: SLF001
