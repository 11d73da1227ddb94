"""Eight CPU devices for every test, so data parallelism is exercised without accelerators.

Must run before JAX initialises its backend: pytest imports conftest.py first.
"""
import atexit
import functools
import os
import shutil
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# A home of the test run's own, made by its first process (pytest-xdist's workers inherit it)
# and removed when that process exits: nothing a test starts writes to the user's home, and
# the default config.compilation_cache_dir ('~/.cache/t2t_jax/xla') becomes one compilation
# cache for the whole run. Every process compiles into it: both test processes, and every
# `main.py` a test starts that keeps the config's cache on. The suite compiles
# the same tiny programs again and again, in process after process (each 1-, 2- and
# 8-device run, each host of a two-process run); from the cache, a repeat costs a file read.
if 'T2T_JAX_TEST_HOME' not in os.environ:
  os.environ['T2T_JAX_TEST_HOME'] = tempfile.mkdtemp(prefix='t2t_jax-tests-')
  atexit.register(shutil.rmtree, os.environ['T2T_JAX_TEST_HOME'], ignore_errors=True)
os.environ['HOME'] = os.environ['T2T_JAX_TEST_HOME']
os.environ['JAX_COMPILATION_CACHE_DIR'] = os.path.expanduser('~/.cache/t2t_jax/xla')
# Test programs compile in well under XLA's 1 s default (helpers.TEST_XLA_FLAGS); skip only
# the trivial ones.
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0.3'
# experiments/ is imported as a package by configs that build on each other.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import helpers  # tests/helpers.py; it creates no JAX backend

os.environ['XLA_FLAGS'] = (f"{os.environ.get('XLA_FLAGS', '')} "
                           f'--xla_force_host_platform_device_count=8 {helpers.TEST_XLA_FLAGS}'
                           ).strip()

import jax
import pytest

from t2t_jax.platform import xla  # after the environment above

xla.configure_cpu()

# Tests also train and decode the same tiny models in this process, each time with freshly
# built jitted functions: the run's cache (above) serves those repeats too. Results are the
# same executables either way.
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs',
                  float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))


@pytest.fixture(autouse=True)
def _the_runs_compilation_cache():
  """The run's cache again after a test whose Translator chose another (its config's)."""
  yield
  xla.enable_compilation_cache(os.environ['JAX_COMPILATION_CACHE_DIR'])


@pytest.fixture(scope='session')
def tiny_workdir(tmp_path_factory) -> str:
  """A run of helpers.tiny_config() trained for 6 steps (checkpoints at 3 and 6), shared by
  the tests of translation and evaluation."""
  from t2t_jax.modes import train  # here: only the tests that need a trained run import it

  path = str(tmp_path_factory.mktemp('trained'))
  train.train_and_evaluate(helpers.tiny_config(), path)
  return path


@pytest.fixture
def run(tiny_workdir, tmp_path):
  """A copy of the tiny trained run (checkpoints at steps 3 and 6), free to damage, without
  what other tests of this process may have added to it (means, evaluations)."""
  return str(shutil.copytree(tiny_workdir, tmp_path / 'run', ignore=lambda folder, names: [
      n for n in names if folder == tiny_workdir
      and (n in ('averaged', 'eval', 'attention') or n.startswith('previous-'))]))


@pytest.fixture
def cli(capfd):
  """The command line in this process: `cli(*args, input='')` runs `python -m t2t_jax.main
  ARGS` as helpers.run_main does and returns a subprocess.CompletedProcess (text output)."""
  return functools.partial(helpers.run_main, capfd)
