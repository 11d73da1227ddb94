"""Label-smoothed cross-entropy (§5.4) against a hand computation."""
import jax
import numpy as np
import pytest

from helpers import REORDERED_F32
from t2t_jax.training import losses


def test_label_smoothing_matches_hand_computation():
  # One sequence of three positions over a vocabulary of 4; the last target is padding.
  logits = np.array([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4], [9.0, 9.0, 9.0, 9.0]]],
                    np.float32)
  targets = np.array([[2, 3, 0]])
  eps = 0.1
  expected_loss = expected_nll = 0.0
  for t in range(2):  # the real tokens
    z = logits[0, t].astype(np.float64)
    log_p = z - np.log(np.sum(np.exp(z)))
    q = np.full(4, eps / 4)  # (1 - ε)·one_hot + ε / V
    q[targets[0, t]] += 1 - eps
    expected_loss += -np.sum(q * log_p)
    expected_nll += -log_p[targets[0, t]]
  sums = losses.cross_entropy_sums(logits, targets, label_smoothing=eps)
  np.testing.assert_allclose(sums.loss, expected_loss, rtol=1e-6)
  np.testing.assert_allclose(sums.nll, expected_nll, rtol=1e-6)
  assert float(sums.num_tokens) == 2.0
  assert float(sums.correct) == 1.0  # argmax of position 1 is 3 = target; position 0 is 0 ≠ 2


@pytest.mark.parametrize('eps', [0.0, 0.1, 0.2])
def test_smoothed_loss_is_minimised_by_the_smoothed_distribution(eps):
  """The optimum of the smoothed objective is p = q, where it equals the entropy of q."""
  vocab, target = 5, 3
  q = np.full(vocab, eps / vocab)
  q[target] += 1 - eps
  logits = np.log(np.maximum(q, 1e-30))[None, None].astype(np.float32)
  sums = losses.cross_entropy_sums(logits, np.array([[target]]), label_smoothing=eps)
  entropy = -np.sum(q * np.log(np.maximum(q, 1e-30)))
  np.testing.assert_allclose(sums.loss, entropy, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('form', losses.LOSS_FORMS)
def test_loss_and_gradient_match_a_float64_rederivation(form):
  """Value and gradient w.r.t. the logits against NumPy in float64: d loss / d z =
  w·(softmax(z) - q) per token, q the smoothed target distribution (1e-5); the same for
  each form of the loss, and for the gradient of the nll (q = one_hot(y))."""
  rng = np.random.default_rng(0)
  vocab, eps = 37, 0.1
  logits = (3 * rng.normal(size=(2, 5, vocab))).astype(np.float32)
  targets = rng.integers(1, vocab, (2, 5))
  targets[1, 3:] = 0  # padding
  z = logits.astype(np.float64)
  log_p = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(
      -1, keepdims=True)
  q = np.full(z.shape, eps / vocab)
  np.put_along_axis(q, targets[..., None], 1 - eps + eps / vocab, axis=-1)
  w = (targets != 0)[..., None]
  expected_loss = -np.sum(w * q * log_p)
  expected_grad = w * (np.exp(log_p) - q)
  loss, grad = jax.value_and_grad(
      lambda x: losses.cross_entropy_sums(x, targets, label_smoothing=eps, form=form).loss)(
          logits)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  np.testing.assert_allclose(grad, expected_grad, atol=1e-5)
  nll_grad = jax.grad(
      lambda x: losses.cross_entropy_sums(x, targets, label_smoothing=eps, form=form).nll)(logits)
  one_hot = np.zeros(z.shape)
  np.put_along_axis(one_hot, targets[..., None], 1.0, axis=-1)
  np.testing.assert_allclose(nll_grad, w * (np.exp(log_p) - one_hot), atol=1e-5)
  sums = losses.cross_entropy_sums(logits, targets, label_smoothing=eps, form=form)
  np.testing.assert_allclose(sums.nll, -np.sum(np.take_along_axis(log_p, targets[..., None], -1)
                                               * w), rtol=1e-5)
  assert float(sums.correct) == float(np.sum((z.argmax(-1) == targets) * w[..., 0]))


def test_the_forms_agree_to_float32_rounding():
  """'one_pass' gives 'autodiff''s sums and gradient to float32 rounding (the same terms,
  summed in another order), on a wider vocabulary than the re-derivation's."""
  rng = np.random.default_rng(1)
  logits = (4 * rng.normal(size=(3, 7, 1000))).astype(np.float32)
  targets = rng.integers(0, 1000, (3, 7))
  results = {}
  for form in losses.LOSS_FORMS:
    loss = lambda x, form=form: losses.cross_entropy_sums(  # noqa: E731
        x, targets, label_smoothing=0.1, form=form).loss
    results[form] = (jax.value_and_grad(loss)(logits),
                     losses.cross_entropy_sums(logits, targets, label_smoothing=0.1, form=form))
  (value, grad), sums = results['autodiff']
  (value_1, grad_1), sums_1 = results['one_pass']
  np.testing.assert_allclose(value_1, value, rtol=REORDERED_F32)
  np.testing.assert_allclose(grad_1, grad, rtol=REORDERED_F32, atol=REORDERED_F32 * np.abs(
      grad).max())
  for a, b in zip(sums_1, sums, strict=True):
    np.testing.assert_allclose(a, b, rtol=REORDERED_F32)
