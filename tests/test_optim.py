"""The §5.3 learning rate and Adam(0.9, 0.98, 1e-9)."""
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import wmt_ende_base
from t2t_jax.training import optim


def paper_lrate(step_num, d_model=512, warmup_steps=4000):
  return d_model ** -0.5 * min(step_num ** -0.5, step_num * warmup_steps ** -1.5)


@pytest.mark.parametrize('step_num', [1, 2, 4000, 4001, 100000])
def test_schedule_matches_formula(step_num):
  schedule = optim.rsqrt_warmup(512, 4000)
  np.testing.assert_allclose(schedule(step_num), paper_lrate(step_num), rtol=1e-6)


def test_schedule_peaks_at_warmup():
  schedule = optim.rsqrt_warmup(512, 4000)
  np.testing.assert_allclose(schedule(4000), 512 ** -0.5 * 4000 ** -0.5, rtol=1e-6)
  assert schedule(3999) < schedule(4000) > schedule(4001)


@pytest.mark.parametrize('step_num', [1, 2, 10, 4000, 100000])
def test_rsqrt_without_warmup_is_the_papers_decay_from_its_peak(step_num):
  """lr_schedule='rsqrt': step 1 at §5.3's peak, then §5.3's rate that many steps past it."""
  config = wmt_ende_base.get_config()
  config.lr_schedule = 'rsqrt'
  schedule = optim.learning_rate_schedule(config)  # of optax's count: step_num - 1
  np.testing.assert_allclose(schedule(step_num - 1), paper_lrate(step_num + 4000 - 1),
                             rtol=1e-6)
  config.learning_rate = 1e-4  # another peak, the same shape
  np.testing.assert_allclose(optim.learning_rate_schedule(config)(step_num - 1),
                             1e-4 * paper_lrate(step_num + 3999) / paper_lrate(4000), rtol=1e-6)


def test_a_constant_rate_is_constant():
  config = wmt_ende_base.get_config()
  config.update(lr_schedule='constant', learning_rate=2e-5)
  schedule = optim.learning_rate_schedule(config)
  assert [float(schedule(count)) for count in (0, 1, 3999, 10**6)] == [2e-5] * 4


def test_optimizer_is_adam_with_paper_hyperparameters():
  """Three updates against a NumPy Adam with β1 0.9, β2 0.98, ε 1e-9 and the schedule."""
  config = wmt_ende_base.get_config()
  tx = optim.make_optimizer(config)
  params = jnp.array([0.5, -1.0, 2.0])
  state = tx.init(params)
  m = v = np.zeros(3)
  expected = np.asarray(params, np.float64)
  rng = np.random.default_rng(0)
  for step_num in (1, 2, 3):
    g = rng.normal(size=3)
    updates, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
    params = params + updates
    m = 0.9 * m + 0.1 * g
    v = 0.98 * v + 0.02 * g * g
    m_hat, v_hat = m / (1 - 0.9 ** step_num), v / (1 - 0.98 ** step_num)
    expected = expected - paper_lrate(step_num) * m_hat / (np.sqrt(v_hat) + 1e-9)
  np.testing.assert_allclose(params, expected, rtol=1e-5)
