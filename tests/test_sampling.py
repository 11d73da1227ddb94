"""Sampling (decoding/sampling.py) against greedy search, itself, and the exact distribution of
every output on a tiny vocabulary."""
import itertools
import unicodedata

import jax
import numpy as np
import pytest

from helpers import (
  EXACT,
  SMALL,
  full_logits_fn,
  log_softmax64,
  make_config,
  model_params,
  output_limit,
  padded,
  trim,
)
from t2t_jax.data import pipeline
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.decoding import decode, sampling

EOS = EOS_ID
# Rows of one padded length, an empty one among them.
SRC = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0], [12, 5, 6, 1, 0], [EOS, 0, 0, 0, 0],
                [7, 7, 1, 0, 0]], np.int32)


def _sample(params, src, index, seed, **kwargs):
  ids, scores = sampling.sample(params, src, np.asarray(index, np.int32),
                                jax.random.PRNGKey(seed), **kwargs)
  return np.asarray(ids), np.asarray(scores)


@pytest.mark.parametrize('temperature', [0.5, 2.0])
def test_top_k_1_is_greedy_search(temperature):
  """One candidate a step leaves nothing to chance: greedy search's outputs whatever the
  temperature and seed, scored log P(Y|X) where greedy's is log P(Y|X) / lp(Y)."""
  params = model_params(SMALL, 1)
  greedy_ids, greedy_scores = decode.greedy_decode(params, SRC, config=SMALL, extra_length=6)
  lengths = np.array([len(trim(row)) for row in greedy_ids])
  assert len(set(lengths)) > 1  # EOS chosen at different steps
  for seed in (0, 1):
    ids, scores = _sample(params, SRC, np.arange(len(SRC)), seed, config=SMALL,
                          temperature=temperature, top_k=1, extra_length=6)
    np.testing.assert_array_equal(ids, greedy_ids)
    np.testing.assert_allclose(scores, greedy_scores * decode.length_penalty(lengths, 0.6),
                               rtol=1e-5)


def test_samples_depend_on_the_seed_and_sentence_number_not_on_the_batch():
  """The same numbered sentence gives the same sample alone, in another batch, in another
  order; another seed or number gives others. Sample j of n is the same whatever n."""
  params = model_params(SMALL, 3, embedding_scale=1.0)
  kwargs = dict(config=SMALL, temperature=1.0, extra_length=6)
  index = np.array([40, 41, 42, 43, 44])
  ids, scores = _sample(params, SRC, index, 7, **kwargs)
  assert all(trim(row)[-1] == EOS for row in ids) and trim(ids[3]) == [EOS]
  again, again_scores = _sample(params, SRC, index, 7, **kwargs)
  np.testing.assert_array_equal(again, ids)
  np.testing.assert_array_equal(again_scores, scores)
  order = np.array([2, 0, 4, 1, 3])
  shuffled, shuffled_scores = _sample(params, SRC[order], index[order], 7, **kwargs)
  np.testing.assert_array_equal(shuffled, ids[order])
  np.testing.assert_allclose(shuffled_scores, scores[order], rtol=1e-6)
  alone, alone_scores = _sample(params, np.repeat(SRC[2:3], 5, axis=0),
                                [0, 42, 1, 2, 3], 7, **kwargs)  # among other draws of it
  np.testing.assert_array_equal(alone[1], ids[2])
  np.testing.assert_allclose(alone_scores[1], scores[2], rtol=1e-6)
  assert len({tuple(trim(row)) for row in alone}) > 1  # the other numbers drew otherwise
  other_seed, _ = _sample(params, SRC, index, 8, **kwargs)
  assert [trim(row) for row in other_seed] != [trim(row) for row in ids]
  several, several_scores = _sample(params, SRC, index, 7, n_samples=6, **kwargs)
  assert several.shape == (5, 6, ids.shape[1])
  assert np.all(np.diff(several_scores, axis=1) <= 0)  # best first
  for row in range(len(SRC)):  # sample 0 of 6 is the single sample
    assert any(np.array_equal(s, ids[row]) for s in several[row])


def test_an_ensemble_of_one_model_samples_as_that_model_bit_for_bit():
  params = model_params(SMALL, 3, embedding_scale=1.0)
  kwargs = dict(temperature=0.8, top_k=5, extra_length=6, n_samples=3)
  alone = _sample(params, SRC, np.arange(5), 0, config=SMALL, **kwargs)
  ensemble = _sample((params,), SRC, np.arange(5), 0, config=(SMALL,), **kwargs)
  for ours, reference in zip(ensemble, alone, strict=True):  # ids, then scores
    np.testing.assert_array_equal(ours, reference)


# The exact distribution: every output of a 2-token input with extra_length 1 (limit 3), on
# EXACT's vocabulary (PAD, EOS, 4 words): EOS, w EOS and w w EOS, 21 outputs.
DRAWS = 20_000
SOURCE = np.array([3, EOS], np.int32)
# A second model of EXACT's vocabulary with other sizes, for an ensemble.
OTHER = EXACT.replace(num_layers=2, d_model=8, d_ff=24, num_heads=1)


def _exact_distribution(models, src_row, extra_length, temperature, top_k, top_p=1.0):
  """(outputs, P_sample of each, log P of each): each step's token has probability
  softmax(log P / T) over the top_k (0: all) of the tokens allowed (no PAD; at the limit
  only EOS), then renormalised over the fewest largest whose probabilities add up to top_p,
  log P the mean over `models` ((params, config) pairs) of their float64 log-softmax of
  fully re-decoded logits; log P(Y) sums the untempered log P."""
  limit, vocab = output_limit(src_row, extra_length), EXACT.vocab_size
  outputs = [list(w) + [EOS] for n in range(limit)
             for w in itertools.product(range(EOS + 1, vocab), repeat=n)]
  targets = padded(outputs, limit)  # [o, limit]
  src = np.repeat(src_row[None], len(outputs), axis=0)
  logp = np.mean([log_softmax64(full_logits_fn(config)(params, src, targets))
                  for params, config in models], axis=0)  # [o, limit, v]
  logp[:, :, PAD_ID] = -np.inf
  logp[:, limit - 1, np.arange(vocab) != EOS] = -np.inf
  allowed = np.ones_like(logp, bool)
  if top_k:  # the top_k largest of each step (no ties in random weights' log-probs)
    np.put_along_axis(allowed, np.argsort(-logp, axis=2)[:, :, top_k:], False, axis=2)
  step_p = np.exp(log_softmax64(np.where(allowed, logp / temperature, -np.inf)))
  if top_p < 1:  # each step's nucleus: by probability, largest first, until top_p is reached
    ranked = np.sort(step_p, axis=2)[:, :, ::-1]
    before = np.cumsum(ranked, axis=2) - ranked  # the mass of the larger ones
    smallest = np.where(before < top_p, ranked, np.inf).min(axis=2, keepdims=True)
    step_p = np.where(step_p >= smallest, step_p, 0.0)
    step_p /= step_p.sum(axis=2, keepdims=True)
  taken = lambda x: np.take_along_axis(x, targets[:, :, None], axis=2)[:, :, 0]  # noqa: E731
  real = np.arange(limit)[None] < np.array([len(o) for o in outputs])[:, None]  # [o, limit]
  return ([tuple(o) for o in outputs], np.where(real, taken(step_p), 1.0).prod(axis=1),
          np.where(real, taken(logp), 0.0).sum(axis=1))


def _chi_square(counts, expected):
  """Pearson's statistic and degrees of freedom, outputs expected fewer than 5 times pooled."""
  small = expected < 5
  observed = np.append(counts[~small], counts[small].sum())
  wanted = np.append(expected[~small], expected[small].sum())
  keep = wanted > 0
  return float(((observed - wanted)[keep] ** 2 / wanted[keep]).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize('temperature,top_k,ensemble,top_p', [
    (1.0, 0, False, 1.0), (0.6, 3, False, 1.0), (1.7, 2, False, 1.0), (1.2, 4, True, 1.0),
    (1.0, 0, False, 0.7), (1.5, 4, False, 0.8)])
def test_the_frequencies_of_samples_are_the_exact_distribution(temperature, top_k, ensemble,
                                                               top_p):
  """20,000 draws of one sentence against the exact probability of each of its 21 outputs:
  Pearson's χ² within 6 standard deviations of its mean (a miss of ~1e-9 by chance: the
  draws are seeded, so the test is deterministic), no output drawn that the top-k or the
  nucleus (top_p) excludes, and every draw scored its untempered log P(Y|X)."""
  models = [(model_params(EXACT, 4, embedding_scale=1.0), EXACT)]
  if ensemble:
    models.append((model_params(OTHER, 5, embedding_scale=1.0), OTHER))
  params, config = (tuple(p for p, _ in models), tuple(c for _, c in models)) if ensemble \
      else models[0]
  ids, scores = _sample(params, SOURCE[None], [3], 11, config=config, temperature=temperature,
                        top_k=top_k, n_samples=DRAWS, extra_length=1, top_p=top_p)
  outputs, probability, logp = _exact_distribution(models, SOURCE, 1, temperature, top_k,
                                                   top_p)
  position = {output: i for i, output in enumerate(outputs)}
  drawn = np.array([position[tuple(trim(row))] for row in ids[0]])  # KeyError: no output
  counts = np.bincount(drawn, minlength=len(outputs))
  assert probability.sum() == pytest.approx(1.0)
  assert not counts[probability == 0].any()
  # The top-k or nucleus leaves out some of the 5 tokens but PAD (else nothing), and no output
  # dominates.
  assert (probability == 0).any() == (top_k > 0 or top_p < 1) and probability.max() < 0.5
  statistic, df = _chi_square(counts, DRAWS * probability)
  assert statistic < df + 6 * np.sqrt(2 * df), (statistic, df)
  np.testing.assert_allclose(scores[0], logp[drawn], rtol=1e-4, atol=1e-5)


def test_bad_arguments_are_refused():
  src = np.ones((1, 3), np.int32)
  for kwargs in (dict(top_k=-1), dict(top_k=14), dict(n_samples=0), dict(extra_length=-1)):
    with pytest.raises(ValueError, match='top_k must be in'):
      sampling.draw(model_params(SMALL, 0), src, np.zeros(1, np.int32),
                    jax.random.PRNGKey(0), config=SMALL, **kwargs)


@pytest.mark.slow
def test_samples_never_hold_a_piece_that_is_no_text(tmp_path):
  """10,000 draws at temperature 2 over a real vocabulary (byte fallback on) decode to text
  without U+FFFD, control characters or the unknown piece: byte, control and unknown pieces
  are banned (the vocabulary's banned_ids). The same draws without the ban do hold them."""
  config = make_config(tmp_path, n_train=300)
  vocabulary = pipeline.get_datasets(config, str(tmp_path / 'run'), num_devices=1).tokenizer
  banned = vocabulary.banned_ids(sampling=True)
  assert len(banned) > 256 and EOS not in banned  # every byte piece, PAD, unknown
  assert set(vocabulary.banned_ids(sampling=False)) < set(banned)
  model = SMALL.replace(vocab_size=vocabulary.vocab_size)
  params = model_params(model, 3, embedding_scale=0.3)  # flat distributions: many pieces
  src = np.array([vocabulary.encode(s) + [PAD_ID] * (6 - len(vocabulary.encode(s)))
                  for s in ('ab.', 'the cat', 'x')], np.int32)

  def texts(banned_ids):
    ids, _ = _sample(params, src, [0, 1, 2], 7, config=model, temperature=2.0,
                     n_samples=3334, extra_length=8, banned_ids=banned_ids)
    return [vocabulary.decode(row) for rows in ids for row in rows]
  drawn = texts(banned)
  assert len(drawn) >= 10_000

  def no_text(text):
    return '\ufffd' in text or '⁇' in text or any(
        unicodedata.category(c) == 'Cc' for c in text)
  assert not [t for t in drawn if no_text(t)]
  assert [t for t in texts(()) if no_text(t)]  # what the ban keeps out
