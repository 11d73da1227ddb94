"""Eight CPU devices for every test, so data parallelism is exercised without accelerators.

Must run before JAX initialises its backend: pytest imports conftest.py first.
"""
import os
import sys

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# experiments/ is imported as a package by configs that build on each other.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from t2t_jax import xla  # noqa: E402  (after the environment above)

xla.configure_cpu()


@pytest.fixture(scope='session')
def tiny_workdir(tmp_path_factory) -> str:
  """A run of test_evaluate.tiny_config() trained for 6 steps (checkpoints at 3 and 6),
  shared by the tests of translation and evaluation."""
  # Imported when a test asks for this: test_evaluate is a test module, and the trainer
  # loads JAX, which the environment above must precede.
  import test_evaluate
  from t2t_jax import train

  path = str(tmp_path_factory.mktemp('trained'))
  train.train_and_evaluate(test_evaluate.tiny_config(), path)
  return path
