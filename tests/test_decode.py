"""Beam search (§6.1) against exhaustive search, a Python greedy loop and full re-decoding."""
import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (
  EXACT,
  REORDERED_F32,
  SMALL,
  full_logits_fn,
  log_softmax64,
  model_params,
  output_limit,
  padded,
  trim,
)
from t2t_jax.data import synthetic, tokenizer
from t2t_jax.decoding import decode, sampling
from t2t_jax.model import cache as cache_lib
from t2t_jax.model import kernels
from t2t_jax.model.transformer import PAD_ID, Transformer

EOS = decode.EOS_ID


def _score(params, config, src_row, outputs, alpha, width=16):
  """log P(Y|X) / lp(Y) of each output (ids ending in EOS), by full re-decoding."""
  targets = padded(outputs, width)  # [n, width]
  src = np.repeat(src_row[None], len(outputs), axis=0)
  logp = log_softmax64(full_logits_fn(config)(params, src, targets))  # [n, width, v]
  token_logp = np.take_along_axis(logp, targets[:, :, None], axis=2)[:, :, 0]
  lengths = np.array([len(output) for output in outputs])
  total = np.where(np.arange(width) < lengths[:, None], token_logp, 0.0).sum(axis=1)
  return total / ((5.0 + lengths) / 6.0) ** alpha


def _exhaustive_n_best(params, config, src_row, extra_length, alpha, n_best):
  """The n_best best (ids, score) over every output w_1 … w_{n-1} EOS with n ≤ the limit,
  best first."""
  words = range(EOS + 1, config.vocab_size)  # neither PAD nor EOS
  outputs = [list(w) + [EOS] for n in range(output_limit(src_row, extra_length))
             for w in itertools.product(words, repeat=n)]
  scores = _score(params, config, src_row, outputs, alpha)
  return [(outputs[i], scores[i]) for i in np.argsort(-scores, kind='stable')[:n_best]]


def _exhaustive(params, config, src_row, extra_length, alpha):
  """The best (ids, score) over every output w_1 … w_{n-1} EOS with n ≤ the limit."""
  return _exhaustive_n_best(params, config, src_row, extra_length, alpha, 1)[0]


def _constant_params(config, logits):
  """Weights whose decoder ignores its input: every step has the same next-token logits,
  `logits[token]` for the tokens given and -30 for the rest."""
  params = model_params(config, 0, embedding_scale=1.0)
  last = params['decoder'][f'layer_{config.num_layers - 1}']['ffn_sublayer']['layer_norm']
  last['scale'] = jnp.zeros_like(last['scale'])  # the decoder output is the bias alone
  last['bias'] = jnp.zeros_like(last['bias']).at[0].set(1.0)
  column = np.full(config.vocab_size, -30.0, np.float32)  # output logits = embedding[:, 0]
  column[list(logits)] = list(logits.values())
  params['shared_embedding']['embedding'] = params['shared_embedding']['embedding'].at[
      :, 0].set(column)
  return params, log_softmax64(column)


_jit_search = jax.jit(decode.search, static_argnames=(
    'config', 'beam_size', 'extra_length', 'eos_id', 'early_stop', 'use_cache', 'n_best'))


def test_length_penalty_is_gnmt_formula():
  lp = lambda length, alpha: float(decode.length_penalty(length, alpha))  # noqa: E731
  assert lp(1, 0.6) == pytest.approx(1.0)  # (5 + 1) / 6 = 1
  assert lp(7, 1.0) == pytest.approx(2.0)
  assert lp(7, 0.6) == pytest.approx(2.0 ** 0.6)
  assert lp(25, 0.5) == pytest.approx(5.0 ** 0.5)
  assert lp(40, 0.0) == pytest.approx(1.0)


def test_segment_lengths_double_up_to_the_cache_length():
  assert decode.segment_lengths(82) == [16, 32, 64, 82]
  assert decode.segment_lengths(64) == [16, 32, 64]
  assert decode.segment_lengths(5) == [5]


@pytest.mark.parametrize('forms', ['xla', 'cpu'])
def test_cached_steps_with_reordering_equal_full_decoding(forms):
  """decode_step through the shared cache, with beams re-ranked between steps (only their
  ancestry reordered), gives the logits of decoding each beam's whole history from scratch,
  in either layout of the cache (cache.LAYOUTS)."""
  c, b, k, steps = SMALL.replace(kernels=forms), 2, 3, 6
  rng = np.random.default_rng(0)
  src = rng.integers(2, c.vocab_size, (b, 5)).astype(np.int32)
  src[1, 3:] = PAD_ID
  params = model_params(c, 0, embedding_scale=1.0)
  # Jitted only to spare op-by-op dispatch; the functions are those beam search uses.
  encoded = jax.jit(functools.partial(Transformer(c).apply, method=Transformer.encode))(
      {'params': params}, src)
  init = jax.jit(decode.init_cache, static_argnames=('max_len', 'beam_size', 'config'))
  state = cache_lib.CacheState(init(params, encoded, src, steps, beam_size=k, config=c),
                               np.zeros((b, k, steps), np.int32))
  step = jax.jit(decode.decode_step, static_argnames='config')
  mask_fn = jax.jit(cache_lib.ancestry_mask, static_argnames='length')
  reorder = jax.jit(cache_lib.reorder_ancestry)
  src_k = np.repeat(src, k, axis=0)
  history = np.zeros((b, k, 0), np.int32)  # tokens fed after the start symbol
  for t in range(steps):
    last = history[:, :, -1] if t else np.full((b, k), PAD_ID, np.int32)
    ancestry, mask = mask_fn(state.ancestry, t, length=steps)
    logits, cache = step(params, state.cache, encoded, src, last, beam_mask=mask, config=c)
    state = cache_lib.CacheState(cache, ancestry)
    targets = padded(list(history.reshape(b * k, t)), steps)  # [b·k, steps]
    full = full_logits_fn(c)(params, src_k, targets)
    np.testing.assert_allclose(logits.reshape(b * k, -1), full[:, t], rtol=1e-5, atol=1e-5)
    history = np.concatenate([history, rng.integers(2, c.vocab_size, (b, k, 1))], axis=2)
    parents = rng.integers(0, k, (b, k))  # with repeats: some beams die, some split
    history = np.take_along_axis(history, parents[:, :, None], axis=1)
    state = reorder(state, parents)


def test_ancestry_mask_follows_the_parents():
  """After re-ranking, each hypothesis reads the slots its own prefix was written to."""
  ancestry = np.zeros((1, 2, 4), np.int32)
  ancestry, mask = cache_lib.ancestry_mask(ancestry, 0, 4)  # both beams wrote slot t=0
  state = cache_lib.reorder_ancestry(cache_lib.CacheState(None, ancestry), np.array([[1, 1]]))
  ancestry, mask = cache_lib.ancestry_mask(state.ancestry, 1, 4)
  state = cache_lib.reorder_ancestry(cache_lib.CacheState(None, ancestry), np.array([[1, 0]]))
  ancestry, mask = cache_lib.ancestry_mask(state.ancestry, 2, 4)
  # Beam 0 descends from step-1 beam 1 (from step-0 beam 1); beam 1 from step-1 beam 0.
  np.testing.assert_array_equal(ancestry[0, :, :3], [[1, 1, 0], [1, 0, 1]])
  np.testing.assert_array_equal(mask[0, 0, :, :3], [[False, False, True], [True, True, False]])


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.0])
@pytest.mark.parametrize('seed', [0, 1, 2])
def test_wide_beam_equals_exhaustive_search(seed, alpha):
  """With 64 beams no prefix of ≤ 3 words is ever pruned, so beam search is exact."""
  src = np.array([[2, 3, 1], [4, 1, 0]], np.int32)  # limits 4 and 3 with extra_length 1
  params = model_params(EXACT, seed)
  ids, scores = decode.beam_search(params, src, config=EXACT, beam_size=64, alpha=alpha,
                                   extra_length=1)
  for row in range(len(src)):
    best_ids, best_score = _exhaustive(params, EXACT, src[row], 1, alpha)
    assert trim(ids[row]) == best_ids
    np.testing.assert_allclose(scores[row], best_score, rtol=1e-5)


def test_wide_beam_equals_exhaustive_search_length_5():
  src = np.array([[5, 3, 1], [2, 0, 0]], np.int32)  # limits 5 and 3 with extra_length 2
  params = model_params(EXACT, 3)
  ids, scores = decode.beam_search(params, src, config=EXACT, beam_size=256, alpha=0.6,
                                   extra_length=2)
  for row in range(len(src)):
    best_ids, best_score = _exhaustive(params, EXACT, src[row], 2, 0.6)
    assert trim(ids[row]) == best_ids
    np.testing.assert_allclose(scores[row], best_score, rtol=1e-5)


def _python_greedy(params, config, src_row, extra_length, alpha, width=48):
  """Argmax of the fully re-decoded next-token log-probs until EOS or the length limit."""
  limit, outputs = output_limit(src_row, extra_length), []
  while not outputs or outputs[-1] != EOS:
    logits = full_logits_fn(config)(params, src_row[None], padded([outputs], width))
    logp = log_softmax64(logits[0, len(outputs)])
    logp[PAD_ID] = -np.inf
    outputs.append(EOS if len(outputs) + 1 == limit else int(logp.argmax()))
  return outputs, _score(params, config, src_row, [outputs], alpha, width)[0]


@pytest.mark.parametrize('seed,extra_length', [(0, 6), (1, 6), (6, 30)])
def test_greedy_decode_equals_python_greedy_loop(seed, extra_length):
  """With extra_length 30 the cache grows twice (segment_lengths: 16, 32, 35) and this seed
  emits EOS at 25 and 27 tokens, unforced."""
  src = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0], [12, 5, 6, 1, 0]], np.int32)
  params = model_params(SMALL, seed, embedding_scale=1.0 if extra_length > 6 else 3.0)
  ids, scores = decode.greedy_decode(params, src, config=SMALL, extra_length=extra_length)
  lengths = []
  for row in range(len(src)):
    expected_ids, expected_score = _python_greedy(params, SMALL, src[row], extra_length, 0.6)
    assert trim(ids[row]) == expected_ids
    np.testing.assert_allclose(scores[row], expected_score, rtol=1e-5)
    lengths.append(len(expected_ids))
  assert len(set(lengths)) > 1  # EOS chosen at different steps: not all forced at the limit


def test_best_possible_score_uses_each_sentences_own_limit():
  live, step, limits = np.array([-2.0, -3.0]), 4, np.array([10, 30])
  for alpha in (0.0, 0.6, 1.0):
    np.testing.assert_allclose(decode.best_possible_score(live, step, limits, alpha),
                               live / ((5.0 + limits) / 6.0) ** alpha, rtol=1e-6)
  # α < 0: lp falls with length, so the shortest finish (step + 1 tokens) is the best.
  np.testing.assert_allclose(decode.best_possible_score(live, step, limits, -0.5),
                             live / ((5.0 + step + 1) / 6.0) ** -0.5, rtol=1e-6)


@pytest.mark.parametrize('n_best', [None, 3])
@pytest.mark.parametrize('alpha,limit', [(0.6, 30), (1.0, 20)])
def test_search_stops_at_the_first_step_the_bound_allows(alpha, limit, n_best):
  """Each step emits EOS with probability 0.3 and one word with 0.7: the first step at
  which the n-th best finished score exceeds 0.7^t / lp(limit) has a closed form. (The
  other words have logits of -30: outputs with them finish too, far below these.)"""
  params, logp = _constant_params(SMALL, {7: np.log(0.7), EOS: np.log(0.3)})
  src = np.full((1, limit - 5), 4, np.int32)
  beams = _jit_search(params, src, config=SMALL, beam_size=4, alpha=alpha, extra_length=5,
                      n_best=n_best)
  kept = n_best or 1
  lp = lambda n: ((5.0 + n) / 6.0) ** alpha  # noqa: E731
  finished = [((n - 1) * logp[7] + logp[EOS]) / lp(n) for n in range(1, limit + 1)]
  stop = next(t for t in range(kept, limit + 1)
              if sorted(finished[:t])[-kept] > t * logp[7] / max(lp(t + 1), lp(limit)))
  assert int(beams.step) == stop < limit
  best = np.argsort(finished[:stop])[::-1][:kept]  # output lengths - 1, best first
  seqs = beams.finished_seq.reshape(kept, -1)[:, 1:]  # [n, T]
  assert [trim(seq) for seq in seqs] == [[7] * int(i) + [EOS] for i in best]
  np.testing.assert_allclose(beams.finished_score.reshape(kept), np.take(finished, best),
                             rtol=1e-5)


def test_an_empty_row_does_not_keep_an_n_best_search_running():
  """An empty line finishes once and never fills n > 1 slots; with nothing left live it is
  done all the same, and the batch stops where its other row does (14 of 30 steps)."""
  params, logp = _constant_params(SMALL, {7: np.log(0.7), EOS: np.log(0.3)})
  src = np.zeros((2, 25), np.int32)
  src[0], src[1, 0] = 4, EOS
  run = functools.partial(_jit_search, params, config=SMALL, beam_size=4, alpha=0.6,
                          extra_length=5, n_best=3)
  beams, alone = run(src), run(src[:1])
  assert int(beams.step) == int(alone.step) == 14
  np.testing.assert_array_equal(beams.finished_seq[0], alone.finished_seq[0])
  np.testing.assert_allclose(beams.finished_score[1], [logp[EOS], -np.inf, -np.inf],
                             rtol=1e-6)
  assert trim(beams.finished_seq[1, 0, 1:]) == [EOS]


def test_beam_size_1_is_greedy_even_where_a_wider_beam_finds_better():
  """P(EOS) = 0.55 each step, so greedy stops at once; with α = 3 a long output scores
  better, which 2 candidates a step (the k > 1 rule) would find."""
  params, _ = _constant_params(SMALL, {7: np.log(0.45), EOS: np.log(0.55)})
  src = np.full((1, 5), 4, np.int32)
  greedy_ids, _ = decode.beam_search(params, src, config=SMALL, beam_size=1, alpha=3.0)
  beam_ids, _ = decode.beam_search(params, src, config=SMALL, beam_size=2, alpha=3.0)
  assert trim(greedy_ids[0]) == [EOS]
  assert len(trim(beam_ids[0])) > 1


@pytest.mark.parametrize('alpha,n_best', [(0.0, None), (0.6, None), (1.5, None), (0.0, 2),
                                          (0.0, 3)])
def test_early_stopping_changes_nothing_but_the_step_count(alpha, n_best):
  """Also for the n best, where the search stops once no live hypothesis can beat the n-th
  (here at 10 and 14 of 18 steps; with α > 0 the n ≥ 2 searches run to the end)."""
  rng = np.random.default_rng(1)
  src = rng.integers(2, EXACT.vocab_size, (8, 6)).astype(np.int32)
  src[np.arange(6)[None, :] >= rng.integers(1, 7, (8, 1))] = PAD_ID  # lengths 1..6
  params = model_params(EXACT, 5, embedding_scale=2.0)
  run = functools.partial(_jit_search, params, src, config=EXACT, beam_size=3, alpha=alpha,
                          extra_length=12, n_best=n_best)
  early, full = run(early_stop=True), run(early_stop=False)
  np.testing.assert_array_equal(early.finished_seq, full.finished_seq)
  np.testing.assert_allclose(early.finished_score, full.finished_score, rtol=1e-6)
  assert int(full.step) == max(output_limit(row, 12) for row in src)
  assert int(early.step) < int(full.step)  # it did stop early


def test_uncached_search_equals_cached_search():
  """Over three cache lengths (16, 32, 35): growing the cache loses nothing."""
  src = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0]], np.int32)
  params = model_params(SMALL, 8, embedding_scale=1.0)  # outputs of 35 and 16 tokens
  kwargs = dict(config=SMALL, beam_size=4, extra_length=30, early_stop=False)
  ids, scores = decode.beam_search(params, src, **kwargs)
  ids_uncached, scores_uncached = decode.beam_search(params, src, use_cache=False, **kwargs)
  np.testing.assert_array_equal(ids, ids_uncached)
  np.testing.assert_allclose(scores, scores_uncached, rtol=1e-5)


@pytest.mark.parametrize('positional', ['sinusoidal', 'learned'])
def test_each_sentence_has_its_own_length_limit(positional):
  """A short input stops at its own len + extra even beside a long one, and a learned
  embedding's max_len caps the cache."""
  c = SMALL.replace(positional=positional, max_len=12)
  src = np.zeros((3, 10), np.int32)
  src[0, :10], src[1, :1] = 5, 5  # lengths 10, 1, 0
  # Every output pays log P(EOS) ≈ -20 once and ≈ 0 a word: with α > 0 longest is best.
  params, _ = _constant_params(c, {7: 10.0, EOS: -10.0})
  ids, scores = decode.beam_search(params, src, config=c, extra_length=3)
  cap = 12 if positional == 'learned' else 13
  assert ids.shape == (3, cap)
  assert [len(trim(row)) for row in ids] == [cap, 1 + 3, 1]
  assert all(trim(row)[:-1] == [7] * (len(trim(row)) - 1) for row in ids)
  assert np.isfinite(scores).all()


@pytest.mark.parametrize('empty', [[0, 0, 0, 0, 0], [EOS, 0, 0, 0, 0]])
def test_empty_source_row_decodes_to_eos_without_nan(empty):
  src = np.array([[4, 9, 7, 2, 1], empty], np.int32)
  params = model_params(SMALL, 4)
  ids, scores = decode.beam_search(params, src, config=SMALL, extra_length=5)
  assert list(np.asarray(ids[1])) == [EOS] + [PAD_ID] * (ids.shape[1] - 1)
  assert np.isfinite(scores).all()
  # The empty row disturbs no other (same shape as above: no new compilation).
  alone_ids, alone_scores = decode.beam_search(params, src[[0, 0]], config=SMALL,
                                               extra_length=5)
  np.testing.assert_array_equal(ids[0], alone_ids[0])
  np.testing.assert_allclose(scores[0], alone_scores[0], rtol=1e-6)


def test_a_sentence_decodes_alike_in_any_batch():
  """Beam search's output for a sentence does not depend on the batch it is decoded in: its
  neighbours, their number, or the padded length of its bucket (decoding buckets double,
  config.decode_bucket_growth)."""
  params = model_params(SMALL, 5)
  rng = np.random.default_rng(0)
  sentences = [[*rng.integers(EOS + 1, SMALL.vocab_size, n).tolist(), EOS] for n in (2, 5, 3, 7)]

  def decoded(rows: int, width: int, order) -> list:
    src = np.zeros((rows, width), np.int32)  # rows past the sentences stay empty
    for r, i in enumerate(order):
      src[r, :len(sentences[i])] = sentences[i]
    ids, scores = decode.beam_search(params, src, config=SMALL, extra_length=4)
    found = [None] * len(sentences)
    for r, i in enumerate(order):
      found[i] = (trim(ids[r]), float(scores[r]))
    return found
  alone = [decoded(1, 8, [i])[i] for i in range(len(sentences))]
  for rows, width, order in ((8, 16, [3, 1, 0, 2]), (6, 32, [2, 3, 0, 1])):
    together = decoded(rows, width, order)
    assert [ids for ids, _ in together] == [ids for ids, _ in alone], (rows, width)
    # Other shapes: XLA may order a sum differently.
    np.testing.assert_allclose([s for _, s in together], [s for _, s in alone],
                               rtol=REORDERED_F32)


def test_eos_id_is_the_tokenizers():
  assert decode.EOS_ID == synthetic.EOS_ID == tokenizer.EOS_ID


@pytest.mark.parametrize('kwargs', [dict(beam_size=0), dict(beam_size=2, n_best=3),
                                    dict(beam_size=1, n_best=2), dict(n_best=0)])
def test_bad_arguments_are_refused(kwargs):
  with pytest.raises(ValueError, match='n_best' if 'n_best' in kwargs else 'beam_size'):
    decode.beam_search(model_params(SMALL, 0), np.ones((1, 3), np.int32), config=SMALL, **kwargs)


@pytest.mark.parametrize('n,k', [(148_000, 8), (148_000, 1), (20_000, 2), (8000, 8), (97, 4)])
def test_top_k_equals_lax_top_k_with_ties(n, k):
  """Values and indices as lax.top_k's, also with many ties and -inf rows."""
  rng = np.random.default_rng(n)
  x = rng.integers(0, 6, (5, n)).astype(np.float32)  # a handful of values: ties everywhere
  x[1] = -np.inf
  x[2, :n // 2] = -np.inf
  x[3] = rng.normal(size=n)
  for ours, reference in zip(jax.jit(kernels.block_top_k, static_argnames='k')(x, k=k),
                             jax.lax.top_k(x, k), strict=True):  # values, then indices
    np.testing.assert_array_equal(ours, reference)


def test_row_max_and_log_probs_equal_jnp_max_and_log_softmax():
  """row_max is jnp.max's values (ties, -inf rows, signed zeros, both signs' extremes), and
  the search's log-probs are jax.nn.log_softmax's, bit for bit."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 3, 37000)).astype(np.float32) * 30
  x[0] = rng.integers(-2, 3, (3, 37000))  # ties everywhere, zeros among them
  x[1, 0] = -np.inf
  x[1, 1, ::2] = -np.inf
  x[2, 0, 17] = np.finfo(np.float32).max
  x[2, 1] = np.finfo(np.float32).min
  x[3] = -0.0
  np.testing.assert_array_equal(jax.jit(kernels.row_max)(x), np.max(x, axis=-1))
  finite = x[2:]
  limits = np.full((4,), 100)
  log_probs = jax.jit(lambda x: decode.ban_tokens(decode.log_softmax(x, kernels.row_max), 0,
                                                  limits, EOS))  # the search's, as its steps
  ours = log_probs(finite)
  reference = jax.nn.log_softmax(finite, axis=-1)
  reference = np.where(np.arange(37000) == PAD_ID, -np.inf, reference)
  np.testing.assert_array_equal(ours, reference)
  finite[0, 0, 5] = np.nan  # a NaN logit still makes its row's log-probs NaN, as before
  ours = np.asarray(log_probs(finite))
  assert np.isnan(np.delete(ours[0, 0], PAD_ID)).all() and not np.isnan(ours[0, 1]).any()


@pytest.mark.parametrize('forms', ['cpu', 'xla'])
def test_the_decoding_cache_is_not_copied_each_step(forms):
  """The loops write each layer's cached keys and values in place (checked in the compiled
  program: no copy of a full-length cache array). The 'cpu' layout needs xla.CPU_FLAGS'
  region-based copy insertion for it: with XLA's default analysis, it is copied every step."""
  c = SMALL.replace(kernels=forms)
  src = np.array([[5, 6, 7, 1], [4, 1, 0, 0]], np.int32)
  lowered = decode.beam_search.lower(model_params(c, 0), src, config=c, beam_size=4,
                                     early_stop=False)
  length = decode.max_decode_length(src.shape[1], c, 50)
  h, d = c.num_heads, c.key_size
  if forms == 'cpu':
    keys = f'f32[2,{h},{d},4,{length}]'  # [b, h, d, k, T]
    values = f'f32[2,{h},4,{length},{d}]'  # [b, h, k, T, d]
  else:
    keys = values = f'f32[2,4,{length},{h},{d}]'  # [b, k, T, h, d]
  arrays = lambda text, cache: re.findall(rf'= {re.escape(cache)}\S* (\S+)\(', text)  # noqa: E731
  compiled = lowered.compile().as_text()
  assert arrays(compiled, keys) and arrays(compiled, values)  # the layout looked for
  assert 'copy' not in arrays(compiled, keys) + arrays(compiled, values)
  if forms == 'cpu':
    off = lowered.compile(
        compiler_options={'xla_cpu_copy_insertion_use_region_analysis': False}).as_text()
    assert 'copy' in arrays(off, keys) and 'copy' in arrays(off, values)


# n-best: the n best finished hypotheses of each sentence.


def _python_beam_search(params, config, src_row, extra_length, alpha, beam, n_best,
                        width=16):
  """The n_best best (ids, score) of a beam search in plain Python, best first.

  Independent of decode.py but for the rules it states: each step re-decodes every live
  prefix from scratch (float64 log-softmax), takes the 2·beam best extensions (ties: lower
  parent, then lower token, as lax.top_k over parent·v + token), keeps the best `beam` that
  do not end in EOS as live and scores those that do. It never stops early: it runs to the
  limit, so a search that stops early must give the same result. The finished are ranked
  by a stable sort of everything that ever finished, in the order it finished, so a tie
  keeps the earlier one.
  """
  limit, vocab = output_limit(src_row, extra_length), config.vocab_size
  live, finished = [([], 0.0)], []  # (prefix, log P); (output, score)
  for t in range(limit):
    prefixes = [prefix for prefix, _ in live] + [[]] * (beam - len(live))  # one shape
    logits = full_logits_fn(config)(params, np.repeat(src_row[None], beam, axis=0),
                                    padded(prefixes, width))
    logp = log_softmax64(logits[:len(live), t])  # [live, v]
    logp[:, PAD_ID] = -np.inf
    if t + 1 == limit:  # only EOS may follow
      logp[:, np.arange(vocab) != EOS] = -np.inf
    candidates = sorted(((logprob + logp[i, w], i, w) for i, (_, logprob) in enumerate(live)
                         for w in range(vocab)), key=lambda c: (-c[0], c[1], c[2]))
    candidates = [c for c in candidates[:2 * beam] if np.isfinite(c[0])]
    finished += [(live[i][0] + [w], logprob / ((5.0 + t + 1) / 6.0) ** alpha)
                 for logprob, i, w in candidates if w == EOS]
    live = [(live[i][0] + [w], logprob) for logprob, i, w in candidates if w != EOS][:beam]
  return sorted(finished, key=lambda f: -f[1])[:n_best]


def _check_n_best(ids, scores, expected):
  """ids [n, T] and scores [n] of one sentence against the expected (ids, score) list; the
  slots beyond it hold no hypothesis (0s, -inf)."""
  for j, (expected_ids, expected_score) in enumerate(expected):
    assert trim(ids[j]) == expected_ids, j
    np.testing.assert_allclose(scores[j], expected_score, rtol=1e-5)
  assert np.all(np.asarray(ids[len(expected):]) == PAD_ID)
  assert np.all(np.asarray(scores[len(expected):]) == -np.inf)


@pytest.mark.parametrize('alpha', [0.0, 0.6, 1.0])
@pytest.mark.parametrize('seed', [0, 1])
def test_wide_beam_n_best_equals_exhaustive_top_n(seed, alpha):
  """With 64 beams nothing is pruned: ≤ 16 live prefixes of ≤ 2 words have ≤ 80 < 2·64
  extensions, and at the limit only the 64 EOS extensions of the 3-word prefixes are
  finite. So every output (85 and 21 here) finishes, and the n best are exactly the top n
  of exhaustive search."""
  src = np.array([[2, 3, 1], [4, 1, 0]], np.int32)  # limits 4 and 3 with extra_length 1
  params = model_params(EXACT, seed)
  ids, scores = decode.beam_search(params, src, config=EXACT, beam_size=64, alpha=alpha,
                                   extra_length=1, n_best=8)
  assert ids.shape == (2, 8, 4) and scores.shape == (2, 8)
  for row in range(len(src)):
    _check_n_best(ids[row], scores[row], _exhaustive_n_best(params, EXACT, src[row], 1,
                                                            alpha, 8))


@pytest.mark.parametrize('beam,n_best', [(3, 3), (4, 2)])
def test_n_best_equals_python_beam_search(beam, n_best):
  """A narrow beam prunes, so the reference is a beam search with the same pruning (above),
  not exhaustive search: it checks the merge, the pruning of finished candidates (only the
  2·beam best extensions can finish) and, since it never stops early, the n-th-best stop
  rule (the search stops after 10 and 5 of 11 steps). The empty row finishes once: its
  other slots stay empty."""
  src = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0], [12, 5, 6, 1, 0], [EOS, 0, 0, 0, 0]],
                 np.int32)
  params = model_params(SMALL, 2)
  beams = _jit_search(params, src, config=SMALL, beam_size=beam, alpha=0.6, extra_length=6,
                      n_best=n_best)
  for row in range(len(src)):
    expected = _python_beam_search(params, SMALL, src[row], 6, 0.6, beam, n_best)
    assert len(expected) == (1 if row == 3 else n_best)
    _check_n_best(beams.finished_seq[row, :, 1:], beams.finished_score[row], expected)


def test_n_best_hypotheses_are_sorted_distinct_and_end_in_eos():
  """Long outputs (the cache grows: 16, 32, 35): each sentence's n best are distinct,
  sorted, end in EOS (then 0s), score log P / lp by full re-decoding, and the first is the
  single best of n_best=None."""
  src = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0]], np.int32)
  params = model_params(SMALL, 8, embedding_scale=1.0)  # outputs of 35 and 16 tokens
  kwargs = dict(config=SMALL, beam_size=4, extra_length=30)
  ids, scores = decode.beam_search(params, src, n_best=4, **kwargs)  # [b, 4, T], [b, 4]
  best_ids, best_scores = decode.beam_search(params, src, **kwargs)
  np.testing.assert_array_equal(ids[:, 0], best_ids)
  np.testing.assert_array_equal(scores[:, 0], best_scores)
  assert np.isfinite(scores).all() and np.all(np.diff(scores, axis=1) <= 0)
  for row in range(len(src)):
    outputs = [trim(output) for output in ids[row]]
    assert all(output[-1] == EOS and EOS not in output[:-1] for output in outputs)
    assert all(np.all(np.asarray(ids[row, j, len(output):]) == PAD_ID)
               for j, output in enumerate(outputs))
    assert len({tuple(output) for output in outputs}) == len(outputs)
    np.testing.assert_allclose(scores[row], _score(params, SMALL, src[row], outputs, 0.6,
                                                   width=48), rtol=1e-4)


def test_keep_best_is_merge_n_best_with_n_1():
  """The n = 1 update that the search uses (an argmax and a compare, as before n-best) is
  the top-n merge at n = 1, also with ties (few distinct scores) and -inf."""
  rng = np.random.default_rng(0)
  b, c, length = 256, 8, 5
  scores = rng.integers(-3, 0, (b, c)).astype(np.float32)  # this step's candidates
  scores[rng.random((b, c)) < 0.4] = -np.inf
  scores[0] = -np.inf
  finished_score = rng.integers(-3, 0, (b, 1)).astype(np.float32)
  finished_score[rng.random((b, 1)) < 0.3] = -np.inf
  seqs = rng.integers(1, 100, (b, c, length)).astype(np.int32)
  finished_seq = rng.integers(1, 100, (b, 1, length)).astype(np.int32)
  args = (finished_seq, finished_score, seqs, scores)
  for ours, reference in zip(decode.keep_best(*args), decode.merge_n_best(*args),
                             strict=True):  # sequences, then scores
    np.testing.assert_array_equal(ours, reference)


def test_merge_n_best_keeps_the_earlier_of_a_tie():
  finished_seq = np.array([[[1], [2]], [[1], [0]], [[1], [0]]], np.int32)  # [b=3, n=2, 1]
  finished_score = np.array([[-1.0, -2.0], [-1.0, -np.inf], [-1.0, -np.inf]], np.float32)
  seqs = np.array([[[3], [4], [5], [6]]] * 3, np.int32)  # [3, c=4, 1]
  scores = np.array([[-2.0, -3.0, -np.inf, -np.inf], [-np.inf, -1.5, -1.5, -np.inf],
                     [-np.inf] * 4], np.float32)
  merged_seq, merged_score = decode.merge_n_best(finished_seq, finished_score, seqs, scores)
  # A new -2 does not displace the kept -2; of two new -1.5s the first (4) is kept; an
  # unfilled slot (-inf) takes no -inf candidate's sequence.
  np.testing.assert_array_equal(merged_seq[:, :, 0], [[1, 2], [1, 4], [1, 0]])
  np.testing.assert_array_equal(merged_score, [[-1.0, -2.0], [-1.0, -1.5], [-1.0, -np.inf]])


def test_single_best_is_unchanged_by_n_best():
  """Outputs recorded from the search before n-best existed (beam 4, α = 0.6; two stop
  before their limits of 8 and 10): n_best=None still gives them, and n_best=1 the same
  numbers with an n axis of 1. The scores were recorded on one host: another's kernels sum
  the float32 log-probabilities in another order."""
  src = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0], [12, 5, 6, 1, 0]], np.int32)
  params = model_params(SMALL, 1)
  ids, scores = decode.beam_search(params, src, config=SMALL, extra_length=6)
  assert [trim(row) for row in ids] == [[3] * 10 + [EOS], [3, 3, EOS], [3, 3, 3, EOS]]
  np.testing.assert_allclose(scores, [-4.848259925842285, -3.381378412246704,
                                      -4.282695293426514], rtol=REORDERED_F32)
  ids_1, scores_1 = decode.beam_search(params, src, config=SMALL, extra_length=6, n_best=1)
  assert ids_1.shape == (3, 1, ids.shape[1]) and scores_1.shape == (3, 1)
  np.testing.assert_array_equal(ids_1[:, 0], ids)
  np.testing.assert_array_equal(scores_1[:, 0], scores)


# Ensembles: several models searched as one, by the mean of their log-probabilities.

# A second model of EXACT's vocabulary with other sizes (an ensemble's runs may differ).
OTHER = EXACT.replace(num_layers=2, d_model=8, d_ff=24, num_heads=1)


def test_an_ensemble_of_one_model_is_that_model_bit_for_bit():
  src = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0], [EOS, 0, 0, 0, 0]], np.int32)
  params = model_params(SMALL, 2)
  for n_best in (None, 3):
    alone = decode.beam_search(params, src, config=SMALL, extra_length=6, n_best=n_best)
    ensemble = decode.beam_search((params,), src, config=(SMALL,), extra_length=6,
                                  n_best=n_best)
    for ours, reference in zip(ensemble, alone, strict=True):  # ids, then scores
      np.testing.assert_array_equal(ours, reference)


def _ensemble_exhaustive_n_best(models, src_row, extra_length, alpha, n_best, weights=None):
  """The n_best best (ids, score) of every output w_1 … w_{n-1} EOS with n ≤ the limit,
  scored by the mean over `models` ((params, config) pairs) of log P_m(Y|X), weighted by
  `weights` if given, over lp(Y)."""
  words = range(EOS + 1, EXACT.vocab_size)
  outputs = [list(w) + [EOS] for n in range(output_limit(src_row, extra_length))
             for w in itertools.product(words, repeat=n)]
  # Each model's log P / lp, averaged: the mean of log P over the same lp.
  scores = np.average([_score(params, config, src_row, outputs, alpha)
                       for params, config in models], axis=0, weights=weights)
  return [(outputs[i], scores[i]) for i in np.argsort(-scores, kind='stable')[:n_best]]


@pytest.mark.parametrize('alpha,weights', [(0.0, None), (0.6, None), (0.6, (0.8, 0.2))])
def test_a_wide_beam_over_two_models_equals_exhaustive_search_of_their_mean(alpha, weights):
  """Two models of different sizes: with 64 beams nothing is pruned (as in
  test_wide_beam_n_best_equals_exhaustive_top_n), so the 8 best are the top 8 of the mean
  log-prob (weighted by config.ensemble_weights' `weights`, if given) over all 85 and 21
  outputs, and the single best is the first."""
  src = np.array([[2, 3, 1], [4, 1, 0]], np.int32)  # limits 4 and 3 with extra_length 1
  models = [(model_params(EXACT, 0, embedding_scale=1.5), EXACT),
            (model_params(OTHER, 1, embedding_scale=1.5), OTHER)]
  params, configs = tuple(p for p, _ in models), tuple(c for _, c in models)
  ids, scores = decode.beam_search(params, src, config=configs, beam_size=64, alpha=alpha,
                                   extra_length=1, n_best=8, weights=weights)
  best_ids, best_scores = decode.beam_search(params, src, config=configs, beam_size=64,
                                             alpha=alpha, extra_length=1, weights=weights)
  for row in range(len(src)):
    expected = _ensemble_exhaustive_n_best(models, src[row], 1, alpha, 8, weights)
    _check_n_best(ids[row], scores[row], expected)
    assert trim(best_ids[row]) == expected[0][0]
    np.testing.assert_allclose(best_scores[row], expected[0][1], rtol=1e-5)
    # The models disagree: neither alone ranks the outputs as their mean does.
    for model in models if weights is None else ():
      alone = _ensemble_exhaustive_n_best([model], src[row], 1, alpha, 8)
      assert [ids for ids, _ in alone] != [ids for ids, _ in expected]


def test_an_ensemble_takes_the_shortest_learned_range_and_checks_its_params():
  learned = OTHER.replace(positional='learned', max_len=6)
  assert decode.max_decode_length(4, (EXACT, learned), 50) == 6
  assert decode.max_decode_length(4, (EXACT, EXACT), 50) == 54
  with pytest.raises(ValueError, match='one parameter set per model, got 1 for 2'):
    decode.beam_search((model_params(EXACT, 0),), np.ones((1, 3), np.int32),
                       config=(EXACT, EXACT))


# The forms (kernels.KERNELS): 'cpu' and the plain 'xla', each with its cache layout
# (cache.LAYOUTS), search alike; on this CPU only the order of their sums differs.

FORMS_SRC = np.array([[4, 9, 7, 2, 1], [3, 1, 0, 0, 0], [12, 5, 6, 1, 0], [EOS, 0, 0, 0, 0]],
                     np.int32)
# how: (seed, arguments). With extra_length 30 the cache grows twice (16, 32, 35); seed 8's
# outputs run 32 to 35 tokens, seed 6's beam search stops at step 23 of 35.
FORMS_SEARCHES = {'beam': (8, dict(beam_size=4)), 'n_best': (8, dict(beam_size=4, n_best=3)),
                  'early_stop': (6, dict(beam_size=4)), 'greedy': (6, dict(beam_size=1)),
                  'ensemble': (8, dict(beam_size=4)), 'sample': (8, dict(n_samples=3))}


def _searched(forms: str, how: str):
  """(ids, scores, steps) of one search of FORMS_SRC, FORMS_SEARCHES[how], with `forms`."""
  seed, kwargs = FORMS_SEARCHES[how]
  c = SMALL.replace(kernels=forms)
  params = model_params(c, seed, embedding_scale=2.0)
  if how == 'sample':
    ids, scores = sampling.sample(params, FORMS_SRC, np.arange(4, dtype=np.int32),
                                  jax.random.PRNGKey(0), config=c, extra_length=30, **kwargs)
    return ids, scores, None
  if how == 'ensemble':
    other = c.replace(num_layers=1, d_model=8, d_ff=24, num_heads=1)
    params, c = (params, model_params(other, 9, embedding_scale=2.0)), (c, other)
  beams = _jit_search(params, FORMS_SRC, config=c, alpha=0.6, extra_length=30, **kwargs)
  return beams.finished_seq, beams.finished_score, int(beams.step)


@pytest.mark.slow  # each case compiles two searches; the fast tier checks both layouts above
@pytest.mark.parametrize('how', list(FORMS_SEARCHES))
def test_the_cpu_and_xla_forms_give_the_same_outputs(how):
  """Beam search, its n best, a search that stops early, greedy search, an ensemble and
  sampling: the same ids with either forms, the search stopping at the same step, the scores
  the same up to the order of float32 sums."""
  (cpu_ids, cpu_scores, cpu_steps), (xla_ids, xla_scores, xla_steps) = (
      _searched(forms, how) for forms in ('cpu', 'xla'))
  np.testing.assert_array_equal(cpu_ids, xla_ids)
  np.testing.assert_allclose(cpu_scores, xla_scores, rtol=REORDERED_F32)
  assert cpu_steps == xla_steps
  if how == 'early_stop':
    assert 16 < cpu_steps < output_limit(FORMS_SRC[0], 30)
  else:  # outputs that reach the cache's third segment (positions from 32)
    ids = np.asarray(cpu_ids)
    assert max(len(trim(row)) for row in ids.reshape(-1, ids.shape[-1])) > 32
