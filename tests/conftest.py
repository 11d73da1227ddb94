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

from t2t_jax import xla  # noqa: E402  (after the environment above)

xla.configure_cpu()
