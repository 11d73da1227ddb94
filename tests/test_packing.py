"""Packed batches (data/packing.py): every pair once an epoch in rows it fits, its tokens,
segments and positions right, few shapes, the same batches on any topology and after a
resume; and each pair's loss and gradient in a packed row what they are alone."""
import collections
import json

import jax
import numpy as np
import pytest

from experiments import wmt_ende_base
from helpers import BF16_EPS, F32_EPS, MAX_LENGTH, make_config
from t2t_jax.data import batching, packing, pipeline
from t2t_jax.data.tokenizer import PAD_ID
from t2t_jax.model import transformer
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.run import params as params_lib
from t2t_jax.training import losses

# Rows of 24 tokens: several of the generated corpus's pairs a row, and some pairs too long.
PACK_LENGTH = 24


def packed_config(tmp_path, **overrides):
  config = make_config(tmp_path, batching='packed', pack_length=PACK_LENGTH, **overrides)
  config.tokens_per_batch = 8 * PACK_LENGTH  # 8 rows a batch
  return config


@pytest.fixture(scope='module')
def packed_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('packed')
  config = packed_config(tmp)
  datasets = pipeline.get_datasets(config, str(tmp / 'workdir'), num_devices=1)
  return config, datasets, str(tmp / 'workdir')


def pairs_in(batch) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """Every (source ids, target ids) of a packed batch, read back through its segments, with
  positions checked to count 0, 1, ... within each pair and segments 1, 2, ... in a row."""
  found = []
  for r in range(len(batch['inputs'])):
    sides = []
    for ids, segments, positions in (packing.SOURCE_KEYS, packing.TARGET_KEYS):
      row, segment, position = batch[ids][r], batch[segments][r], batch[positions][r]
      assert ((segment == 0) == (row == PAD_ID)).all()
      numbers = sorted(set(segment[segment > 0].tolist()))
      assert numbers == list(range(1, len(numbers) + 1))
      pieces = []
      for number in numbers:
        where = np.flatnonzero(segment == number)
        assert (np.diff(where) == 1).all()  # contiguous
        assert position[where].tolist() == list(range(len(where)))
        pieces.append(tuple(row[where].tolist()))
      sides.append(pieces)
    assert len(sides[0]) == len(sides[1])
    found += list(zip(*sides, strict=True))
  return found


def expected_pairs(datasets) -> collections.Counter:
  """Independently: the kept pairs that fit a row, from the encoded ids."""
  train = datasets.train
  encoded = train._encoded
  return collections.Counter(
      (tuple(encoded.ids[0][encoded.offsets[0][i]:encoded.offsets[0][i + 1]].tolist()),
       tuple(encoded.ids[1][encoded.offsets[1][i]:encoded.offsets[1][i + 1]].tolist()))
      for i in train._kept)


def test_an_epoch_packs_every_pair_once_into_rows_it_fits(packed_run):
  config, datasets, _ = packed_run
  train = datasets.train
  assert train.packed and datasets.dev.packed
  S, T = train.row
  assert PACK_LENGTH in (S, T) and min(S, T) % 8 == 0
  epoch = [next(train) for _ in range(train.plan(0).num_batches)]
  assert train.get_state()['epoch'] == 1
  seen = collections.Counter(p for batch in epoch for p in pairs_in(batch))
  assert seen == expected_pairs(datasets)
  shapes = {(b['inputs'].shape, b['targets'].shape) for b in epoch}
  assert shapes <= {((rows, S), (rows, T)) for rows in (8, *train.batch_shapes()[-1][:1])}
  assert train.batch_shapes()[0] == (8, S, T) and len(train.batch_shapes()) <= 2


def test_pairs_too_long_for_a_row_are_left_out_and_counted(tmp_path, caplog):
  caplog.set_level('INFO')
  config = packed_config(tmp_path, max_length=MAX_LENGTH)
  datasets = pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=1)
  train = datasets.train
  S, T = train.row
  encoded = train._encoded
  all_kept = batching.length_filter(encoded, config.max_length, 'train')
  lengths = [(encoded.offsets[0][i + 1] - encoded.offsets[0][i],
              encoded.offsets[1][i + 1] - encoded.offsets[1][i]) for i in all_kept]
  too_long = sum(s > S or t > T for s, t in lengths)
  assert too_long and len(train._kept) == len(all_kept) - too_long
  assert (f'left out {too_long} pairs too long for a row (a longer config.pack_length keeps '
          f'them); kept {len(train._kept)}') in caplog.text
  assert any(r.levelname == 'WARNING' and 'left out' in r.getMessage() for r in caplog.records)


def global_batch(config, workdir, *, num_devices=1, process_count=1, grad_accum_steps=1,
                 skip=0):
  """The global batch after `skip` batches: the processes' blocks joined, padding rows
  (all PAD) dropped."""
  blocks = []
  for process in range(process_count):
    train = pipeline.get_datasets(config, workdir, num_devices=num_devices,
                                  process_index=process, process_count=process_count,
                                  grad_accum_steps=grad_accum_steps).train
    for _ in range(skip):
      next(train)
    blocks.append(next(train))
  joined = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
  assert len(joined['inputs']) % (num_devices * grad_accum_steps) == 0
  real = (joined['inputs'] != PAD_ID).any(axis=1)
  return {k: v[real] for k, v in joined.items()}


@pytest.mark.parametrize('num_devices,process_count,grad_accum_steps',
                         [(8, 1, 1), (8, 2, 1), (2, 1, 4), (4, 2, 3)])
def test_the_same_global_batches_on_any_topology(packed_run, num_devices, process_count,
                                                 grad_accum_steps):
  config, _, workdir = packed_run
  for skip in (0, 3):
    one = global_batch(config, workdir, skip=skip)
    other = global_batch(config, workdir, num_devices=num_devices, process_count=process_count,
                         grad_accum_steps=grad_accum_steps, skip=skip)
    assert one.keys() == other.keys()
    for key in one:
      np.testing.assert_array_equal(one[key], other[key], err_msg=key)


def test_a_restored_state_continues_exactly_even_on_another_topology(packed_run):
  config, datasets, workdir = packed_run
  train = datasets.train
  for _ in range(train.plan(train.get_state()['epoch']).num_batches + 2):
    next(train)  # into the second epoch
  state = train.get_state()
  expected = [next(train) for _ in range(4)]
  resumed = pipeline.get_datasets(config, workdir, num_devices=2).train
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_epochs_are_shuffled_by_the_seed(packed_run, tmp_path):
  config, datasets, workdir = packed_run
  train = datasets.train
  first, second = train.plan(0), train.plan(1)
  assert not np.array_equal(first.pair_of_slot, second.pair_of_slot)
  again = pipeline.get_datasets(config, workdir, num_devices=1).train
  np.testing.assert_array_equal(again.plan(0).pair_of_slot, first.pair_of_slot)
  assert train.fingerprint != pipeline.get_datasets(
      packed_config(tmp_path, seed=1), workdir, num_devices=1).train.fingerprint


def test_the_bucketed_and_packed_plans_do_not_resume_each_other(packed_run):
  config, datasets, workdir = packed_run
  bucketed = config.copy_and_resolve_references()
  bucketed.batching = 'buckets'
  other = pipeline.get_datasets(bucketed, workdir, num_devices=1).train
  assert not other.packed
  with pytest.raises(Exception, match='different data or settings'):
    other.set_state(datasets.train.get_state())


@pytest.mark.parametrize('num_devices,process_count', [(1, 1), (8, 2)])
def test_the_dev_set_is_packed_into_one_shape_and_keeps_every_pair(packed_run, num_devices,
                                                                   process_count):
  config, datasets, workdir = packed_run
  sets = [pipeline.load_eval_set(config, workdir, 'dev', tokenizer=datasets.tokenizer,
                                 num_devices=num_devices, process_index=p,
                                 process_count=process_count) for p in range(process_count)]
  encoded = sets[0].encoded
  expected = collections.Counter(
      (tuple(encoded.ids[0][encoded.offsets[0][i]:encoded.offsets[0][i + 1]].tolist()),
       tuple(encoded.ids[1][encoded.offsets[1][i]:encoded.offsets[1][i + 1]].tolist()))
      for i in range(len(encoded.offsets[0]) - 1))
  seen = collections.Counter()
  for batches in zip(*(s.batches() for s in sets), strict=True):
    joined = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    seen.update(pairs_in(joined))
  assert seen == expected  # eval sets are never length-filtered: long pairs a row alone
  shapes = sets[0].batch_shapes()
  S, T = packing.row_lengths(encoded.lengths, PACK_LENGTH)
  # One packed shape; the pairs too long for a row in their length buckets' (as EvalSet).
  assert shapes[0] == (8, S, T) and all(length > min(S, T) for _, length, _ in shapes[1:])


# ------------------------------------------------------------ the model on packed rows


def unpacked(batch):
  """The pairs of a packed batch, one a row, right-padded to the batch's lengths."""
  pairs = pairs_in(batch)
  out = {}
  for side, key in enumerate(('inputs', 'targets')):
    width = batch[key].shape[1]
    rows = np.full((len(pairs), width), PAD_ID, np.int32)
    for r, pair in enumerate(pairs):
      rows[r, :len(pair[side])] = pair[side]
    out[key] = rows
  return out


def loss_and_grads(model, params, batch):
  packed = {'src_segments': batch.get('inputs_segmentation'),
            'src_positions': batch.get('inputs_position'),
            'tgt_segments': batch.get('targets_segmentation'),
            'tgt_positions': batch.get('targets_position')}

  def loss(p):
    logits = model.apply({'params': p}, batch['inputs'], batch['targets'], **packed)
    sums = losses.cross_entropy_sums(logits, batch['targets'], label_smoothing=0.1)
    return sums.loss, sums
  (_, sums), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return jax.device_get(sums), jax.device_get(grads)


# Sums and gradients of the same pairs in other rows, as float32 rounds them (1e-6 relative:
# the issue's bound, 8 units of float32's rounding); a gradient near 0 is compared against
# its leaf's largest element.
EXACT_RTOL = 8 * F32_EPS
# In bfloat16, 8 significant bits: the packed and the unpacked programs have other shapes, so
# one may round to bfloat16 where the other keeps float32; they agree to one such rounding,
# 2**-8 of the value (half of bfloat16's epsilon).
BF16_RTOL = BF16_EPS / 2


# The forms (xla: the accelerators', cpu) in float32, Table 3 row (E)'s learned positions, and
# bfloat16, the accelerators' default dtype.
@pytest.mark.parametrize('kernels,positional,dtype', [
    ('xla', 'sinusoidal', 'float32'), ('cpu', 'sinusoidal', 'float32'),
    pytest.param('xla', 'learned', 'float32', marks=pytest.mark.slow),
    pytest.param('xla', 'learned', 'bfloat16', marks=pytest.mark.slow)])
def test_a_packed_batch_has_the_loss_and_gradients_of_its_pairs_alone(packed_run, kernels,
                                                                       positional, dtype):
  config, datasets, _ = packed_run
  batch = next(iter(datasets.dev.batches()))
  model_config = ModelConfig(vocab_size=config.vocab_size, num_layers=2, d_model=32, d_ff=64,
                             num_heads=4, dropout_rate=0.0, deterministic=True,
                             kernels=kernels, positional=positional, dtype=dtype)
  model = Transformer(model_config)
  params = model.init(jax.random.PRNGKey(0), batch['inputs'][:1], batch['targets'][:1])['params']
  packed_sums, packed_grads = loss_and_grads(model, params, batch)
  alone_sums, alone_grads = loss_and_grads(model, params, unpacked(batch))
  assert packed_sums.num_tokens == alone_sums.num_tokens == (batch['targets'] != PAD_ID).sum()
  rtol = EXACT_RTOL if dtype == 'float32' else BF16_RTOL
  for name in ('loss', 'nll', 'correct'):
    np.testing.assert_allclose(getattr(packed_sums, name), getattr(alone_sums, name),
                               rtol=rtol, err_msg=name)
  jax.tree_util.tree_map(lambda p, a: np.testing.assert_allclose(
      p, a, rtol=rtol, atol=rtol * np.abs(a).max()), packed_grads, alone_grads)


def test_without_the_segment_mask_the_pairs_would_see_each_other(packed_run, monkeypatch):
  """The equality above depends on the mask: with every real key visible to every query of
  the row (padding alone masked), the loss of a packed batch is another."""
  config, datasets, _ = packed_run
  batch = next(iter(datasets.dev.batches()))
  model = Transformer(ModelConfig(vocab_size=config.vocab_size, num_layers=1, d_model=32,
                                  d_ff=64, num_heads=4, dropout_rate=0.0, deterministic=True))
  params = model.init(jax.random.PRNGKey(0), batch['inputs'][:1], batch['targets'][:1])['params']
  alone, _ = loss_and_grads(model, params, unpacked(batch))
  monkeypatch.setattr(transformer, 'segment_mask',
                      lambda q, k: np.broadcast_to((k != 0)[:, None, None, :],
                                                   (len(k), 1, q.shape[1], k.shape[1])))
  unmasked, _ = loss_and_grads(model, params, batch)
  assert abs(float(unmasked.loss) - float(alone.loss)) > 1e-3 * abs(float(alone.loss))


# ------------------------------------------------------------------- a packed run


def run_flags(config) -> list[str]:
  """`config` on the command line: experiments/wmt_ende_base.py and what differs from it."""
  base = wmt_ende_base.get_config()
  flags = [f'--config.{k}={v}' for k, v in config.items() if k != 'model' and v != base[k]]
  flags += [f'--config.model.{k}={v}' for k, v in config.model.items() if v != base.model[k]]
  return ['--config=experiments/wmt_ende_base.py', *flags]


@pytest.mark.slow
def test_a_packed_run_resumes_exactly_and_meets_one_train_shape(cli, tmp_path):
  """Through the command line: 4 steps straight, and 2 then 2 more (resumed), give the same
  parameters and losses bitwise (the same process configuration); the run's batches have
  one or two shapes, and its dev loss one."""
  config = packed_config(tmp_path, num_train_steps=4, log_every_steps=1, eval_every_steps=2,
                         checkpoint_every_steps=2, checkpoint_every_minutes=0.0,
                         warmup_steps=10, max_length=PACK_LENGTH)
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4)
  straight = cli(*run_flags(config), f'--workdir={tmp_path / "straight"}')
  assert straight.returncode == 0, straight.stderr[-3000:]
  assert 'packed rows of' in straight.stderr
  half = cli(*run_flags(config), f'--workdir={tmp_path / "resumed"}',
             '--config.num_train_steps=2')
  assert half.returncode == 0, half.stderr[-3000:]
  resumed = cli(*run_flags(config), f'--workdir={tmp_path / "resumed"}')
  assert resumed.returncode == 0 and 'Resuming at step 2' in resumed.stderr, resumed.stderr
  records = {name: [json.loads(line) for line in open(tmp_path / name / 'metrics.jsonl')]
             for name in ('straight', 'resumed')}
  for key in ('loss', 'dev_loss'):
    assert ([(r['step'], r[key]) for r in records['straight'] if key in r]
            == [(r['step'], r[key]) for r in records['resumed'] if key in r])
  trees = [params_lib.restore_params(str(tmp_path / name / 'checkpoints'), 4)
           for name in ('straight', 'resumed')]
  jax.tree_util.tree_map(np.testing.assert_array_equal, *trees)
  datasets = pipeline.get_datasets(config, str(tmp_path / 'straight'), num_devices=8)
  assert len(datasets.train.batch_shapes()) <= 2
  assert len([s for s in datasets.dev.batch_shapes() if s[1] <= PACK_LENGTH]) == 1
