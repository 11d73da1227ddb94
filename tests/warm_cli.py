"""`python -m t2t_jax.main ...` processes for the tests, without the ~2 s a new interpreter
spends importing JAX, Flax, orbax and the package: one forkserver per test process imports
t2t_jax.main once, and each command line is a fork of it (multiprocessing's forkserver), with
its own pid, arguments, environment, working directory, standard streams, signals and exit
status. So `popen` and `run` stand in for subprocess.Popen and subprocess.run of that command.

What such a process does not share with `python -m t2t_jax.main`: the start itself (main.py's
`__main__` block, huge pages' re-exec) and what modules read from the environment when
imported. So a command whose environment differs from the one the test run began with in
anything but the variables read at run time (_RUN_TIME_VARIABLES) and those libraries set when
imported (_SET_BY_IMPORTS), or that asks for what a fork cannot give (preexec_fn and the
like), starts a real process; and the tests of the start (the console script, huge pages,
the README and the notebook) start real processes themselves.
T2T_JAX_TEST_FORK=0 starts every command as a real process.
"""
from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from multiprocessing import forkserver, reduction

COMMAND = [sys.executable, '-m', 't2t_jax.main']
# Read when the run starts (XLA's flags when its backend starts, jax.distributed's when it is
# initialized), not when t2t_jax.main is imported; and pytest's name of the running test.
_RUN_TIME_VARIABLES = frozenset(['XLA_FLAGS', 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES',
                                 'JAX_PROCESS_ID', 'PYTEST_CURRENT_TEST', 'T2T_JAX_TEST_FORK'])
# Set in os.environ by libraries when a test imports them (TensorFlow for tfds, joblib for
# sacremoses, torch for the export's check); a command that imports them sets them alike, and
# t2t_jax.main's imports do not read them, so a test process that has imported them still forks.
_SET_BY_IMPORTS = frozenset(['TF2_BEHAVIOR', 'TPU_ML_PLATFORM', 'TPU_ML_PLATFORM_VERSION',
                             'ENABLE_RUNTIME_UPTIME_TELEMETRY', 'HDF5_PLUGIN_PATH',
                             'KMP_INIT_AT_FORK', 'TORCHINDUCTOR_CACHE_DIR'])
_NOT_COMPARED = _RUN_TIME_VARIABLES | _SET_BY_IMPORTS
# Popen arguments a forked command takes; any other starts a real process.
_FORKABLE_ARGUMENTS = frozenset(['cwd', 'env', 'stdin', 'stdout', 'stderr', 'text'])

# The environment the forkserver imports t2t_jax.main in: this process's when the test run
# began (conftest.py imports this module, through helpers.py), not a test's that happens to
# start it with a variable patched, which would make every later command a real process.
_ENV = dict(os.environ)
_forkserver: dict = {}


def popen(args: list[str], **kwargs) -> subprocess.Popen:
  """subprocess.Popen(args, **kwargs), forked where args is COMMAND plus arguments."""
  if _forkable(args, kwargs):
    return _ForkedPopen(args, **kwargs)
  return subprocess.Popen(args, **kwargs)


def run(args: list[str], *, input=None, timeout: float | None = None,  # noqa: A002
        capture_output: bool = False, **kwargs) -> subprocess.CompletedProcess:
  """subprocess.run(args, ...) (without check), forked where popen forks."""
  if input is not None:
    kwargs['stdin'] = subprocess.PIPE
  if capture_output:
    kwargs['stdout'] = kwargs['stderr'] = subprocess.PIPE
  with popen(args, **kwargs) as process:
    try:
      stdout, stderr = process.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
      raise
    except BaseException:
      process.kill()
      raise
  return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _forkable(args: list[str], kwargs: dict) -> bool:
  if os.environ.get('T2T_JAX_TEST_FORK') == '0':
    return False
  if list(args[:len(COMMAND)]) != COMMAND or not set(kwargs) <= _FORKABLE_ARGUMENTS:
    return False
  env = os.environ if kwargs.get('env') is None else kwargs['env']  # {}: an empty one
  return all(env.get(key) == _ENV.get(key) for key in set(env) | set(_ENV)
             if key not in _NOT_COMPARED)


def _context() -> multiprocessing.context.BaseContext:
  if 'context' not in _forkserver:
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload(['t2t_jax.main'])
    current = dict(os.environ)
    os.environ.clear()
    os.environ.update(_ENV)
    try:
      forkserver.ensure_running()
    finally:
      os.environ.clear()
      os.environ.update(current)
    _forkserver['context'] = context
  return _forkserver['context']


class _Fd:
  """A file descriptor for the forked process: pickled as the forkserver passes one."""

  def __init__(self, fd: int):
    self.fd = fd

  def __reduce__(self):
    return _detach, (reduction.DupFd(self.fd),)


def _detach(dup_fd) -> int:
  return dup_fd.detach()


class _ForkedPopen(subprocess.Popen):
  """subprocess.Popen whose child is forked by the forkserver, not executed: Popen makes the
  pipes and wraps their ends as usual; starting, polling and waiting go through the
  forkserver, which is the child's parent."""

  def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                     startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                     errread, errwrite, *unused):
    try:
      # A stream not redirected is this process's own, as a child process would inherit it.
      fds = [_Fd(fd if fd != -1 else std) for std, fd in enumerate((p2cread, c2pwrite,
                                                                     errwrite))]
      self._process = _context().Process(
          target=_run_main, daemon=True,
          args=(list(args[len(COMMAND):]), dict(env if env is not None else os.environ),
                os.path.abspath(cwd or os.getcwd()), fds))
      self._process.start()
      self.pid = self._process.pid
      self._child_created = True
    finally:
      # The child's ends of the pipes, closed here as subprocess does after a fork.
      for ours, childs in ((p2cwrite, p2cread), (c2pread, c2pwrite), (errread, errwrite)):
        if ours != -1 and childs != -1:
          os.close(childs)
      if hasattr(self, '_devnull'):
        os.close(self._devnull)

  def _internal_poll(self, *unused, **unused_kwargs):
    if self.returncode is None:
      self.returncode = self._process.exitcode
    return self.returncode

  def _wait(self, timeout):
    if self.returncode is None:
      self._process.join(timeout)
      if self._process.exitcode is None:
        raise subprocess.TimeoutExpired(self.args, timeout)
      self.returncode = self._process.exitcode
    return self.returncode


def _run_main(argv: list[str], env: dict, cwd: str, fds: list[int]) -> None:
  """In the forked process: its streams, environment and directory, then t2t_jax.main as
  `python -m` runs it, then the end of an interpreter (threads joined, atexit, streams
  flushed) and its exit status."""
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  for std, fd in enumerate(fds):
    if fd != std:
      os.dup2(fd, std)
      os.close(fd)
  os.environ.clear()
  os.environ.update(env)
  os.chdir(cwd)
  _reopen_stdin()
  signal.signal(signal.SIGINT, signal.default_int_handler)
  from t2t_jax import main  # imported by the forkserver already

  sys.argv = [main.__file__, *argv]
  sys.modules['__main__'] = main  # absl's --help reads the main module's docstring
  try:
    main.run()
    status = 0
  except SystemExit as e:
    status = _exit_status(e.code)
  except KeyboardInterrupt:
    sys.excepthook(*sys.exc_info())
    status = -signal.SIGINT
  except BaseException:  # noqa: BLE001  (what the interpreter does with an uncaught one)
    sys.excepthook(*sys.exc_info())
    status = 1
  threading._shutdown()  # noqa: SLF001  (the interpreter joins non-daemon threads at exit)
  atexit._run_exitfuncs()  # noqa: SLF001
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  if status < 0:  # an uncaught KeyboardInterrupt ends the interpreter by SIGINT
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
  os._exit(status)


def _exit_status(code) -> int:
  """The exit status of SystemExit(code), as the interpreter makes it."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  print(code, file=sys.stderr)
  return 1


def _reopen_stdin() -> None:
  """sys.stdin on fd 0 as the interpreter makes it (multiprocessing closed the forkserver's).
  sys.stdout and sys.stderr stay the forkserver's, now on this process's fds 1 and 2: the
  same objects, which absl's logging looks for (it replaces handlers that write to
  sys.stderr) and made for the same environment."""
  like = sys.__stdin__
  sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, 'r', closefd=False)),
                                               encoding=like.encoding, errors=like.errors)
