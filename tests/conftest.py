"""Eight CPU devices for every test, so data parallelism is exercised without accelerators.

Must run before JAX initialises its backend: pytest imports conftest.py first.
"""
import atexit
import os
import shutil
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# experiments/ is imported as a package by configs that build on each other.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import helpers  # noqa: E402  (tests/helpers.py; it creates no JAX backend)

os.environ['XLA_FLAGS'] = (f"{os.environ.get('XLA_FLAGS', '')} "
                           f'--xla_force_host_platform_device_count=8 {helpers.TEST_XLA_FLAGS}'
                           ).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

from t2t_jax.platform import xla  # noqa: E402  (after the environment above)

xla.configure_cpu()

# Tests train and decode the same tiny models again and again, each time with freshly built
# jitted functions: a compilation cache for this test process (each xdist worker its own,
# removed at exit) serves the repeats, which nearly halves the training tests' time.
# Subprocesses (main.py) use their config's compilation_cache_dir, as a user's runs do;
# results are the same executables either way.
_XLA_CACHE = tempfile.mkdtemp(prefix='t2t_jax-test-xla-')
atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', _XLA_CACHE)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.3)  # skip the trivial ones


@pytest.fixture(scope='session')
def tiny_workdir(tmp_path_factory) -> str:
  """A run of helpers.tiny_config() trained for 6 steps (checkpoints at 3 and 6), shared by
  the tests of translation and evaluation."""
  from t2t_jax import trainer  # here: only the tests that need a trained run import it

  path = str(tmp_path_factory.mktemp('trained'))
  trainer.train_and_evaluate(helpers.tiny_config(), path)
  return path
