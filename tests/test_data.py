"""Tests of the §5.1 input pipeline: sources, filtering, buckets, resume, sharding."""
import collections
import copy
import errno
import hashlib
import io
import json
import os
import re
import sys
import time
import types

import numpy as np
import pytest

from experiments import wmt_ende_base
from helpers import MAX_LENGTH, TOKENS_PER_BATCH, dead_pid, make_config
from t2t_jax.config import rules
from t2t_jax.data import batching, id_cache, pipeline, sources
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.platform import errors, files


def rows_of(array):
  """Each row's ids without the padding, as a hashable tuple."""
  return [tuple(int(i) for i in row[row != PAD_ID]) for row in array]


def one_epoch(train):
  state = train.get_state()
  assert state['batch'] == 0
  batches = [next(train) for _ in range(train.plan(state['epoch']).num_batches)]
  assert train.get_state()['epoch'] == state['epoch'] + 1  # exactly one epoch
  return batches


def expected_pairs(ds, config):
  """Independently: encode the raw training text, keep what §5.1's filter keeps."""
  sources, targets = (open(f'{config.train_files}.{lang}', encoding='utf-8').read()
                      .split('\n')[:-1] for lang in ('en', 'de'))
  pairs = [(tuple(ds.tokenizer.encode(s)), tuple(ds.tokenizer.encode(t)))
           for s, t in zip(sources, targets, strict=True)]
  return collections.Counter(
      p for p in pairs if 1 < len(p[0]) <= MAX_LENGTH and 1 < len(p[1]) <= MAX_LENGTH)


@pytest.fixture(scope='module')
def files_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('files')
  config = make_config(tmp)
  ds = pipeline.get_datasets(config, str(tmp / 'workdir'), num_devices=1)
  return config, ds, str(tmp / 'workdir')


@pytest.mark.parametrize('num_devices', [1, 4])
@pytest.mark.parametrize('band', [0, 2])
def test_an_epoch_holds_every_kept_pair_exactly_once(tmp_path, files_run, num_devices, band):
  config, ds, workdir = files_run
  config = config.copy_and_resolve_references()
  config.bucket_band = band
  train = pipeline.get_datasets(config, workdir, num_devices=num_devices).train
  expected = expected_pairs(ds, config)
  assert 450 < sum(expected.values()) < 590  # the corpus does exercise the filter
  for _ in range(2):  # and again in the second, reshuffled epoch
    got = collections.Counter()
    for batch in one_epoch(train):
      rows = zip(rows_of(batch['inputs']), rows_of(batch['targets']), strict=True)
      got.update(p for p in rows if p[0])
    assert got == expected


@pytest.mark.parametrize('num_devices', [1, 4])
@pytest.mark.parametrize('band', [0, 1, 3])
def test_batches_respect_the_token_budget_and_bucket_shapes(files_run, num_devices, band):
  config, _, workdir = files_run
  config = config.copy_and_resolve_references()
  config.bucket_band = band
  train = pipeline.get_datasets(config, workdir, num_devices=num_devices).train
  grid = list(batching.bucket_lengths(MAX_LENGTH, config.bucket_growth))
  shapes, real, slots = set(), 0, 0
  for _ in range(3 * train.plan(0).num_batches):
    batch = next(train)
    inputs, targets = batch['inputs'], batch['targets']
    assert inputs.dtype == targets.dtype == np.int32
    assert len(inputs) == len(targets) and len(inputs) % num_devices == 0
    # The pairs fill the budget; padding rows (fewer than one a device) divide the rows.
    pairs = int((inputs != PAD_ID).any(1).sum())
    assert len(inputs) - pairs < num_devices and not inputs[pairs:].any()
    assert pairs * inputs.shape[1] <= TOKENS_PER_BATCH
    assert pairs * targets.shape[1] <= TOKENS_PER_BATCH
    s, t = grid.index(inputs.shape[1]), grid.index(targets.shape[1])
    assert abs(s - t) <= band
    for array in (inputs, targets):  # ids, EOS, then only padding
      lengths = (array != PAD_ID).sum(1)
      full = lengths > 0
      assert (array[full, lengths[full] - 1] == EOS_ID).all()
      assert ((array != PAD_ID) == (np.arange(array.shape[1]) < lengths[:, None])).all()
    shapes.add((len(inputs), s, t))
    real += (inputs != PAD_ID).sum() + (targets != PAD_ID).sum()
    slots += inputs.size + targets.size
  # a bounded set of shapes, at most two (full and left-over) per cell
  assert len(shapes) <= 2 * len({(s, t) for _, s, t in shapes})
  assert real / slots > {0: 0.6, 1: 0.7, 3: 0.7}[band]


def test_batches_are_full_but_for_one_left_over_per_cell(files_run):
  # "as close to the budget as the buckets allow": a batch has the most rows
  # that fit, except at most one left-over batch per cell.
  _, ds, _ = files_run
  plan = ds.train.plan(0)
  short = collections.Counter(
      (s, t) for rows, s, t in plan.shapes if (rows + 1) * max(s, t) <= TOKENS_PER_BATCH)
  assert max(short.values()) == 1
  assert sum(short.values()) < plan.num_batches  # some batches are full


def test_filtering_is_counted_in_the_log(files_run, tmp_path, caplog):
  config, ds, _ = files_run
  sources, targets = (open(f'{config.train_files}.{lang}', encoding='utf-8').read()
                      .split('\n')[:-1] for lang in ('en', 'de'))
  lengths = [(len(ds.tokenizer.encode(s)), len(ds.tokenizer.encode(t)))
             for s, t in zip(sources, targets, strict=True)]
  empty = sum(min(p) <= 1 for p in lengths)
  too_long = sum(min(p) > 1 and max(p) > MAX_LENGTH for p in lengths)
  assert empty > 0 and too_long > 0
  with caplog.at_level('INFO'):
    pipeline.get_datasets(config, str(tmp_path), num_devices=1)
  assert (f'train: 600 pairs; dropped {empty} with an empty side and {too_long} with '
          f'a side longer than max_length={MAX_LENGTH}') in caplog.text


@pytest.mark.parametrize('saved_on,resumed_on', [((2, 1), (2, 1)), ((8, 2), (1, 1))])
def test_a_restored_state_gives_the_next_10_batches(files_run, saved_on, resumed_on):
  """On the same topology, or on another one ((devices, grad_accum_steps): a state saved
  on 8 devices with k=2 resumes on 1): the same pairs, in the same order."""
  config, _, workdir = files_run

  def iterator(num_devices, grad_accum_steps):
    return pipeline.get_datasets(config, workdir, num_devices=num_devices,
                                 grad_accum_steps=grad_accum_steps).train
  train = iterator(*saved_on)
  for _ in range(train.plan(0).num_batches - 4):  # the next 10 cross an epoch
    next(train)
  state = json.loads(json.dumps(train.get_state()))
  expected = [next(train) for _ in range(10)]
  restored = iterator(*resumed_on)
  restored.set_state(state)
  real = lambda rows: rows[rows.any(axis=1)]  # noqa: E731 — padding rows are all PAD
  for want, got in zip(expected, (next(restored) for _ in range(10)), strict=True):
    for key in ('inputs', 'targets'):
      np.testing.assert_array_equal(real(got[key]), real(want[key]))
      if saved_on == resumed_on:
        assert got[key].shape == want[key].shape
  assert restored.get_state() == train.get_state()


def test_batches_are_those_of_earlier_versions():
  # A run resumed by a newer t2t_jax must see the batches the older one would have.
  # The digest changed ONCE, deliberately, with plan version 2 (rows per batch no longer
  # rounded down to the device count, so the batches are the same on any topology; the
  # fingerprint drops num_devices). Version 1's digest was '1a2c93ac7cfaef92' (int64 index
  # arrays throughout); version 2's code with `_rows` rounded to the 4 devices and the old
  # fingerprint still gives exactly that, so nothing else changed. Old data states fail
  # set_state, naming the plan change.
  rng = np.random.default_rng(7)
  lengths = rng.integers(1, 56, size=(2, 3000))  # some empty (EOS only), some too long
  offsets = tuple(np.concatenate([[0], np.cumsum(side)]) for side in lengths)
  ids = tuple((np.arange(o[-1]) % 250 + 3).astype(np.uint16) for o in offsets)
  encoded = id_cache.Encoded(ids=ids, offsets=offsets)
  config = wmt_ende_base.get_config()
  config.update(max_length=MAX_LENGTH, tokens_per_batch=TOKENS_PER_BATCH, bucket_band=1)
  kept = batching.length_filter(encoded, MAX_LENGTH, 'train')
  train = batching.TrainIterator(encoded, kept, config, num_devices=4, process_index=1,
                                 process_count=2, data_key='golden')
  digest = hashlib.sha256(train.get_state()['fingerprint'].encode())
  for _ in range(train.plan(0).num_batches + train.plan(1).num_batches):
    batch = next(train)
    digest.update(np.array(batch['inputs'].shape + batch['targets'].shape).tobytes())
    digest.update(batch['inputs'].tobytes() + batch['targets'].tobytes())
  assert digest.hexdigest()[:16] == '504e985bcca261a7'


def test_restore_into_different_settings_fails_clearly(files_run):
  config, _, workdir = files_run
  state = pipeline.get_datasets(config, workdir, num_devices=1).train.get_state()
  other = config.copy_and_resolve_references()
  other.tokens_per_batch = 960
  train = pipeline.get_datasets(other, workdir, num_devices=1).train
  with pytest.raises(ValueError, match='different data or settings'):
    train.set_state(state)


def test_state_of_the_old_plan_fails_naming_the_change(files_run):
  """Checkpoints from before plan version 2 (rows rounded to the devices) cannot continue
  exactly: an error that says why, never a silently different data order."""
  config, _, workdir = files_run
  train = pipeline.get_datasets(config, workdir, num_devices=8).train
  old = {'epoch': 0, 'batch': 3, 'fingerprint': '1a2c93ac7cfaef92'}  # version 1: no 'plan'
  with pytest.raises(ValueError, match=r'older t2t_jax, whose batch plan \(version 1\) '
                     r'rounded the rows .*--config\.restart=True'):
    train.set_state(old)


# (devices, processes, grad_accum_steps): rows padded to multiples of 1 to 16.
TOPOLOGIES = [(1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 1, 1), (2, 2, 1), (4, 2, 1), (8, 2, 1),
              (1, 1, 4), (8, 2, 2)]


def topology_iterators(config, workdir, num_devices, process_count, grad_accum_steps=1):
  return [pipeline.get_datasets(config, workdir, num_devices=num_devices, process_index=p,
                                process_count=process_count,
                                grad_accum_steps=grad_accum_steps).train
          for p in range(process_count)]


@pytest.mark.parametrize('num_devices,process_count,grad_accum_steps', TOPOLOGIES)
def test_the_same_global_batches_on_any_topology(files_run, num_devices, process_count,
                                                 grad_accum_steps):
  """An epoch's global batches (pairs, in order) are those of 1 device in 1 process. Each
  process reads its own contiguous block; the equal blocks, disjoint, make up the batch,
  whose rows all-PAD padding rows make a multiple of devices × grad_accum_steps."""
  config, _, workdir = files_run
  reference = pipeline.get_datasets(config, workdir, num_devices=1).train
  parts = topology_iterators(config, workdir, num_devices, process_count, grad_accum_steps)
  multiple, padded = num_devices * grad_accum_steps, 0
  for want in one_epoch(reference):
    local = [next(part) for part in parts]
    for key in ('inputs', 'targets'):
      assert len({block[key].shape for block in local}) == 1
      got = np.concatenate([block[key] for block in local])
      pairs = len(want[key])  # 1 device: no padding rows
      assert len(got) == -(-pairs // multiple) * multiple
      np.testing.assert_array_equal(got[:pairs], want[key])
      assert not got[pairs:].any()  # padding rows: all PAD, weight 0 in the loss
    padded += len(got) > pairs
  assert all(part.get_state() == reference.get_state() for part in parts)  # no topology in it
  assert padded or multiple == 1  # the padding was exercised


def test_shuffling_is_seeded(files_run):
  config, _, workdir = files_run

  def first_epoch_inputs(seed):
    other = config.copy_and_resolve_references()
    other.seed = seed
    train = pipeline.get_datasets(other, workdir, num_devices=1).train
    return [rows_of(b['inputs']) for b in one_epoch(train)], train

  a, train = first_epoch_inputs(0)
  b, _ = first_epoch_inputs(0)
  c, _ = first_epoch_inputs(1)
  assert a == b and a != c
  # Batches, not only pairs, are shuffled: the same shapes come in a new order.
  shapes = [[tuple(shape) for shape in train.plan(epoch).shapes] for epoch in (0, 1)]
  assert shapes[0] != shapes[1] and sorted(shapes[0]) == sorted(shapes[1])
  assert a != [rows_of(batch['inputs']) for batch in one_epoch(train)]  # epoch 1


def test_each_process_gets_its_block_of_rows(files_run):
  config, _, workdir = files_run
  whole = pipeline.get_datasets(config, workdir, num_devices=4).train
  parts = [pipeline.get_datasets(config, workdir, num_devices=4, process_index=p,
                                 process_count=2).train for p in range(2)]
  for _ in range(2 * whole.plan(0).num_batches):
    batch = next(whole)
    local = [next(part) for part in parts]
    for key in ('inputs', 'targets'):
      assert all(len(part[key]) * 2 == len(batch[key]) for part in local)
      np.testing.assert_array_equal(np.concatenate([part[key] for part in local]), batch[key])


@pytest.mark.parametrize('num_devices,process_count', [(1, 1), (4, 1), (4, 2)])
def test_eval_sets_keep_every_pair_in_few_shapes(files_run, num_devices, process_count):
  config, ds, workdir = files_run
  parts = [pipeline.get_datasets(config, workdir, num_devices=num_devices, process_index=p,
                                 process_count=process_count) for p in range(process_count)]
  for name, n in (('dev', 60), ('test', 50)):
    evals = [getattr(part, name) for part in parts]
    sources, references = (open(f'{config[name + "_files"]}.{lang}', encoding='utf-8')
                           .read().split('\n')[:-1] for lang in ('en', 'de'))
    assert evals[0].sources == sources and evals[0].references == references
    seen, shapes, previous_length = [], set(), 0
    for local in zip(*(e.batches() for e in evals), strict=True):
      index = np.concatenate([b['index'] for b in local])
      inputs = np.concatenate([b['inputs'] for b in local])
      targets = np.concatenate([b['targets'] for b in local])
      assert len(index) % num_devices == 0
      assert inputs.size <= 256 and targets.size <= 256
      real = index >= 0
      assert not inputs[~real].any() and not targets[~real].any()
      assert rows_of(inputs[real]) == [tuple(ds.tokenizer.encode(sources[i])) for i in index[real]]
      assert rows_of(targets[real]) == [tuple(ds.tokenizer.encode(references[i]))
                                        for i in index[real]]
      length = inputs.shape[1]  # L: both sides padded to their longer side's bucket
      assert targets.shape[1] == length >= previous_length  # shortest first
      previous_length = length
      rows_per_device, full = len(index) // num_devices, max(1, 256 // length // num_devices)
      assert rows_per_device == full or (  # a bucket's last batch: a power of two below
          rows_per_device < full and rows_per_device & (rows_per_device - 1) == 0)
      shapes.add(inputs.shape)
      seen += list(index[real])
    assert sorted(seen) == list(range(n))  # nothing filtered, nothing repeated
    lengths = {length for _, length in shapes}
    assert len(shapes) <= len(lengths) * (1 + (256 // num_devices).bit_length())


def test_a_vocabulary_we_may_not_read_is_named_not_missing(files_run, monkeypatch):
  """A vocabulary behind a missing permission was called missing (and, for training, would
  have been trained anew). Root reads anything: os.stat refuses as the system would."""
  config, _, workdir = files_run
  model = os.path.join(workdir, 'vocab', 'spm.model')
  stat = os.stat

  def refusing_stat(path, *args, **kwargs):
    if os.fspath(path) == model:
      raise PermissionError(13, 'Permission denied', path)
    return stat(path, *args, **kwargs)
  monkeypatch.setattr(os, 'stat', refusing_stat)
  for load in (lambda: pipeline.load_tokenizer(config, workdir),
               lambda: pipeline.get_datasets(config, workdir, num_devices=1)):
    with pytest.raises(errors.UserError, match=rf'{model}: the vocabulary that cannot be read '
                                               r'\(permission denied'):
      load()


def test_restart_reuses_vocabulary_and_ids(files_run, monkeypatch):
  config, ds, workdir = files_run

  def fail(*args, **kwargs):
    raise AssertionError('retrained or re-encoded on restart')

  monkeypatch.setattr(pipeline.tokenizer_lib, 'train_bpe', fail)
  monkeypatch.setattr(id_cache, 'save_atomically', fail)
  again = pipeline.get_datasets(config, workdir, num_devices=1)
  assert again.tokenizer.fingerprint == ds.tokenizer.fingerprint
  assert len(os.listdir(os.path.join(workdir, 'data_cache'))) == 1


# ------------------------------------------------------------------ bad data


def test_missing_file_is_named(tmp_path):
  config = make_config(tmp_path)
  os.remove(f'{config.dev_files}.de')
  with pytest.raises(FileNotFoundError, match=rf'{config.dev_files}\.de.*--config\.dev_files'):
    pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=1)
  assert not (tmp_path / 'workdir' / 'vocab').exists()  # failed before any work


def test_different_line_counts_name_both_files(tmp_path):
  config = make_config(tmp_path)
  with open(f'{config.train_files}.de', 'a', encoding='utf-8') as f:
    f.write('one more line\n')
  with pytest.raises(ValueError, match=r'train\.en has 600 lines but .*train\.de has 601'):
    pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=1)
  assert not (tmp_path / 'workdir' / 'vocab').exists()


@pytest.mark.parametrize('split', ['train', 'test'])
def test_invalid_utf8_names_file_and_line(tmp_path, split):
  config = make_config(tmp_path)
  path = f'{config[split + "_files"]}.en'
  lines = open(path, 'rb').read().split(b'\n')
  lines[17] = b'caf\xe9 latin-1'
  open(path, 'wb').write(b'\n'.join(lines))
  with pytest.raises(ValueError, match=rf'{path}, line 18: invalid UTF-8'):
    pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=1)
  assert not (tmp_path / 'workdir' / 'data_cache').exists()


def test_crlf_and_missing_final_newline(tmp_path):
  prefix = tmp_path / 'small'
  open(f'{prefix}.en', 'wb').write(b'\xef\xbb\xbfHello there\r\nSecond line')
  open(f'{prefix}.de', 'wb').write(b'Hallo da\r\nZweite Zeile\n')
  source = sources._files_source('train', str(prefix), wmt_ende_base.get_config())
  assert sources._read_all(source) == (['Hello there', 'Second line'],
                                       ['Hallo da', 'Zweite Zeile'])


# Separators str.splitlines() splits at but files do not: U+2028, NEL, form feed, lone CR.
TRICKY_LINES = (b'\xef\xbb\xbfone\xe2\x80\xa8still one\r\n'
                b'two \xc2\x85 still two\x0c and more\n'
                b'three\rstill three\n'
                b'\xef\xbb\xbfa BOM that is text\n'
                b'last, no newline')


def fake_stdin(monkeypatch, raw: bytes):
  monkeypatch.setattr(sys, 'stdin', types.SimpleNamespace(buffer=io.BytesIO(raw)))


def test_stdin_lines_are_split_like_a_file(tmp_path, monkeypatch):
  (tmp_path / 'input.txt').write_bytes(TRICKY_LINES)
  from_file = sources.read_lines(str(tmp_path / 'input.txt'))
  fake_stdin(monkeypatch, TRICKY_LINES)
  from_stdin = sources.read_lines('-')
  assert from_stdin == from_file
  assert len(from_stdin) == 5
  assert from_stdin[0] == 'one\u2028still one' and from_stdin[3] == '\ufeffa BOM that is text'


def test_stdin_invalid_utf8_names_the_line(monkeypatch):
  fake_stdin(monkeypatch, b'fine\nalso fine\ncaf\xe9\nfine\n')
  with pytest.raises(ValueError, match=r'<stdin>, line 3: invalid UTF-8'):
    sources.read_lines('-')


def test_empty_dev_file_fails_before_the_vocabulary(tmp_path):
  config = make_config(tmp_path)
  for lang in ('en', 'de'):
    open(f'{config.dev_files}.{lang}', 'w').close()
  with pytest.raises(ValueError, match=rf'{config.dev_files}\.en and .*: the dev set has no '
                     'sentence pair'):
    pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=1)
  assert not (tmp_path / 'workdir' / 'vocab').exists()


def test_learned_positions_leave_longer_dev_pairs_out_of_the_loss_only(files_run, caplog):
  """Table 3 row E: a dev pair with a side past config.model.max_len has no positions; it
  leaves the loss batches (with a warning counting it) but stays in the text for BLEU."""
  config, ds, workdir = files_run
  lengths = np.maximum(*ds.dev.encoded.lengths)
  limit = int(np.median(lengths))  # about half the pairs are longer
  config = copy.deepcopy(config)
  config.model.update(positional='learned', max_len=limit)
  dev = pipeline.get_datasets(config, workdir, num_devices=1).dev
  assert dev.sources == ds.dev.sources and dev.references == ds.dev.references
  seen = np.concatenate([b['index'][b['index'] >= 0] for b in dev.batches()])
  assert sorted(seen) == [i for i in range(len(lengths)) if lengths[i] <= limit]
  assert 0 < (lengths > limit).sum() < len(lengths)
  assert (f'dev: {(lengths > limit).sum()} pairs have a side longer than '
          f'config.model.max_len={limit}') in caplog.text
  # Sinusoids extend to any length: nothing left out (test_eval_sets_keep_every_pair...).
  assert sorted(np.concatenate([b['index'][b['index'] >= 0] for b in ds.dev.batches()])) == list(
      range(len(lengths)))


@pytest.mark.parametrize('train_files', ['', 'nowhere/train'])
def test_eval_set_needs_only_its_own_files(files_run, tmp_path, train_files):
  config, ds, workdir = files_run
  config = config.copy_and_resolve_references()
  config.train_files = train_files and str(tmp_path / train_files)
  config.dev_files = str(tmp_path / 'nowhere' / 'dev')
  evalset = pipeline.load_eval_set(config, workdir, 'test', tokenizer=ds.tokenizer)
  assert evalset.sources == ds.test.sources and evalset.references == ds.test.references


# ------------------------------------------------------------------ the id cache


def train_cache(workdir) -> str:
  [name] = [n for n in os.listdir(os.path.join(workdir, 'data_cache')) if n.startswith('train-')]
  return os.path.join(workdir, 'data_cache', name)


@pytest.mark.parametrize('failure', [
    (os, 'fsync', 2, OSError(errno.ENOSPC, 'No space left on device')),  # a full disk
    (os, 'replace', 1, PermissionError(errno.EACCES, 'Permission denied')),
    (tokenizer_lib.Tokenizer, 'encode_arrays', 5, KeyboardInterrupt()),  # the third chunk
])
def test_failed_cache_write_leaves_no_temporary(tmp_path, monkeypatch, failure):
  config, workdir = make_config(tmp_path), str(tmp_path / 'workdir')
  tokenizer_lib.load_or_train(config, workdir, lambda: ['some text', 'etwas Text'] * 50)
  cache_dir = os.path.join(workdir, 'data_cache')
  module, name, fail_at, error = failure
  original, calls, during = getattr(module, name), [], []

  def fail(*args, **kwargs):
    calls.append(args)
    if len(calls) == fail_at:
      during.extend(n for n in os.listdir(cache_dir) if n.startswith('.tmp-'))
      raise error
    return original(*args, **kwargs)

  monkeypatch.setattr(sources, 'CHUNK_PAIRS', 100)  # 600 pairs: six chunks
  monkeypatch.setattr(module, name, fail)
  with pytest.raises(OSError if isinstance(error, OSError) else type(error)) as raised:
    pipeline.get_datasets(config, workdir, num_devices=1)
  assert during  # it failed while writing the temporary folder
  assert not [n for n in os.listdir(cache_dir) if n.startswith('.tmp-')]
  if isinstance(error, OSError):
    assert isinstance(raised.value, files.DiskWriteError)
    assert re.fullmatch(rf'{re.escape(cache_dir)}/train-[0-9a-f]{{16}}: cannot write the '
                        rf'data cache: {error.strerror}', str(raised.value))


def test_cache_written_chunk_by_chunk_equals_one_pass(files_run, tmp_path, monkeypatch):
  config, ds, _ = files_run
  monkeypatch.setattr(sources, 'CHUNK_PAIRS', 7)  # 600 pairs: 86 chunks, the last one short
  source = sources._files_source('train', config.train_files, config)
  cached = id_cache.load_or_encode(source.name, source.key, source.read, ds.tokenizer,
                                   str(tmp_path))
  whole = id_cache.encode(iter([sources._read_all(source)]), ds.tokenizer)
  for got, want in zip(cached.ids + cached.offsets, whole.ids + whole.offsets, strict=True):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
  # plain .npy files, which numpy reads without this module
  ids = np.load(os.path.join(train_cache(str(tmp_path)), 'target_ids.npy'))
  np.testing.assert_array_equal(ids, whole.ids[1])


def test_stale_temporaries_are_swept_but_live_ones_kept(tmp_path):
  config, workdir = make_config(tmp_path), str(tmp_path / 'workdir')
  cache_dir = tmp_path / 'workdir' / 'data_cache'
  host = files._host()
  names = {'dead': f'.tmp-{host}-{dead_pid()}-abc_12', 'live': f'.tmp-{host}-{os.getpid()}-x1',
           'other_host': f'.tmp-elsewhere-{dead_pid()}-y2', 'old': '.tmp-elsewhere-1-z3'}
  for name in names.values():
    (cache_dir / name).mkdir(parents=True)
    (cache_dir / name / 'source_ids.npy').write_bytes(b'half written')
  two_days_ago = time.time() - 2 * 86400
  os.utime(cache_dir / names['old'], (two_days_ago, two_days_ago))
  pipeline.get_datasets(config, workdir, num_devices=1)
  left = {n for n in os.listdir(cache_dir) if n.startswith('.tmp-')}
  assert left == {names['live'], names['other_host']}


@pytest.mark.parametrize('damage', ['truncate', 'old_format_inconsistent'])
def test_damaged_cache_is_named_and_rebuilt(tmp_path, caplog, damage):
  config, workdir = make_config(tmp_path), str(tmp_path / 'workdir')
  before = pipeline.get_datasets(config, workdir, num_devices=1).train._encoded
  ids = [np.array(side) for side in before.ids]
  path = train_cache(workdir)
  if damage == 'truncate':
    damaged = os.path.join(path, 'source_ids.npy')
    blob = open(damaged, 'rb').read()
    open(damaged, 'wb').write(blob[:len(blob) - 10])
  else:  # as the old code wrote key.json (no sizes), and one pair short on one side
    damaged = path
    record = json.load(open(os.path.join(path, 'key.json')))
    json.dump(record['key'], open(os.path.join(path, 'key.json'), 'w'))
    offsets = np.load(os.path.join(path, 'target_offsets.npy'))
    np.save(os.path.join(path, 'target_offsets.npy'), offsets[:-1])
  with caplog.at_level('WARNING'):
    after = pipeline.get_datasets(config, workdir, num_devices=1).train._encoded
  assert f'{damaged}: damaged' in caplog.text
  for want, got in zip(ids, after.ids, strict=True):
    np.testing.assert_array_equal(got, want)
  assert train_cache(workdir) == path


def test_old_format_cache_is_still_used(tmp_path, monkeypatch):
  config, workdir = make_config(tmp_path), str(tmp_path / 'workdir')
  pipeline.get_datasets(config, workdir, num_devices=1)
  path = train_cache(workdir)
  record = json.load(open(os.path.join(path, 'key.json')))
  json.dump(record['key'], open(os.path.join(path, 'key.json'), 'w'), sort_keys=True)
  monkeypatch.setattr(id_cache, 'save_atomically', lambda *args: pytest.fail('re-encoded'))
  pipeline.get_datasets(config, workdir, num_devices=1)


def test_unknown_dataset_names_the_key(tmp_path):
  config = make_config(tmp_path, dataset='wmt99')
  with pytest.raises(ValueError, match=r"config\.dataset='wmt99'"):
    pipeline.get_datasets(config, str(tmp_path), num_devices=1)


def test_every_dataset_kind_is_dispatched_and_honours_the_protocols(tmp_path):
  """One table: the kinds config/rules.py accepts are exactly the kinds pipeline.py dispatches, and
  the synthetic kind gives a Datasets whose parts have the Protocols' members."""
  assert set(pipeline.KINDS) == set(rules.DATASETS)
  config = wmt_ende_base.get_config()
  config.dataset, config.vocab_size, config.max_length, config.tokens_per_batch = (
      'synthetic', 20, 8, 64)
  ds = pipeline.get_datasets(config, str(tmp_path), num_devices=8, process_index=1,
                             process_count=2, grad_accum_steps=3)
  for part, protocol in ((ds.tokenizer, pipeline.Vocabulary), (ds.train, pipeline.TrainBatches),
                         (ds.dev, pipeline.EvalSplit), (ds.test, pipeline.EvalSplit)):
    missing = [name for name in dir(protocol) if not name.startswith('_')
               and not hasattr(part, name)]
    assert not missing, (type(part).__name__, missing)
  # 64 // 8 = 8 pairs, padded to 8 × 3 = 24 rows; process 1 of 2 holds rows 12..23.
  assert next(ds.train)['inputs'].shape == (12, 8)
  assert ds.train.fingerprint and ds.tokenizer.fingerprint
  assert not (tmp_path / 'vocab').exists()  # no vocabulary trained for ids


# ---------------------------------------------------------------------- tfds


def tfds_config(tmp_path):
  config = wmt_ende_base.get_config()
  config.tfds_data_dir = str(tmp_path / 'tensorflow_datasets')
  config.vocab_size = 280
  config.max_length = 24
  config.tokens_per_batch = 256
  return config


@pytest.mark.slow
def test_tfds_wmt14_under_mock_data(tmp_path, monkeypatch):
  tfds = pytest.importorskip('tensorflow_datasets')
  monkeypatch.setattr(sources, 'reachable', lambda host: True)  # mock: no download
  config = tfds_config(tmp_path)
  with tfds.testing.mock_data(num_examples=120):
    ds = pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=2)
    examples = list(tfds.as_numpy(tfds.builder(
        config.tfds_name, data_dir=config.tfds_data_dir).as_dataset(split='validation')))
  english = [e['en'].decode() for e in examples]
  german = [e['de'].decode() for e in examples]
  assert english != german
  # EN->DE although tfds stores the pair German first
  assert ds.dev.sources == english and ds.dev.references == german
  assert ds.test.sources == english
  pairs = [(tuple(ds.tokenizer.encode(s)), tuple(ds.tokenizer.encode(t)))
           for s, t in zip(english, german, strict=True)]  # mock splits hold the same examples
  expected = collections.Counter(p for p in pairs if 1 < len(p[0]) <= 24 and 1 < len(p[1]) <= 24)
  got = collections.Counter()
  for batch in one_epoch(ds.train):
    rows = zip(rows_of(batch['inputs']), rows_of(batch['targets']), strict=True)
    got.update(p for p in rows if p[0])
  assert got == expected and sum(got.values()) > 100


@pytest.mark.slow
def test_tfds_offline_fails_fast_with_instructions(tmp_path, monkeypatch):
  pytest.importorskip('tensorflow_datasets')
  monkeypatch.setattr(sources, 'reachable', lambda host: False)
  start = time.time()
  with pytest.raises(sources.DataUnavailableError) as error:
    pipeline.get_datasets(tfds_config(tmp_path), str(tmp_path / 'workdir'), num_devices=1)
  assert time.time() - start < 60  # no minutes-long retry loop
  message = str(error.value)
  for needle in ('www.statmt.org', '--config.tfds_data_dir', '--config.tfds_manual_dir',
                 'training-parallel-europarl-v7.tgz', '--config.dataset=files'):
    assert needle in message


@pytest.mark.slow
def test_tfds_uses_archives_in_the_manual_dir(tmp_path, monkeypatch):
  pytest.importorskip('tensorflow_datasets')
  builder = sources.tfds_builder(tfds_config(tmp_path))
  needed = sources._urls_to_download(builder, None)
  assert any('europarl' in url for url in needed)
  manual = tmp_path / 'manual'
  manual.mkdir()
  for url in needed:
    (manual / builder.url_infos[url].filename).touch()
  assert sources._urls_to_download(builder, str(manual)) == []


class FakeBuilder:
  """Just enough of a tfds WMT14 builder for the checks before any reading."""
  info = types.SimpleNamespace(features=types.SimpleNamespace(languages=['de', 'en']))
  version, data_dir, url_infos = '1.0.0', '/nowhere/wmt14_translate/de-en/1.0.0', {}

  def __init__(self, prepared: bool):
    self.prepared, self.data_dir_root = prepared, '/nowhere'

  def is_prepared(self) -> bool:
    return self.prepared

  def download_and_prepare(self, **kwargs):
    raise AssertionError('download_and_prepare called')


def test_tfds_eval_reads_prepared_data_only(tmp_path, monkeypatch):
  monkeypatch.setattr(sources, 'tfds_builder', lambda config: FakeBuilder(prepared=False))
  monkeypatch.setattr(sources, 'prepare_tfds', lambda *args: pytest.fail('prepared for eval'))
  with pytest.raises(sources.DataUnavailableError, match=r'not prepared in /nowhere: evaluation '
                     r'reads prepared data only.*--config\.tfds_data_dir'):
    pipeline.load_eval_set(tfds_config(tmp_path), str(tmp_path), 'test', tokenizer=None)


def test_tfds_empty_dev_split_is_named(tmp_path, monkeypatch):
  monkeypatch.setattr(sources, 'tfds_builder', lambda config: FakeBuilder(prepared=True))
  splits = {'train': (['a b'], ['c d']), 'validation': ([], []), 'test': (['e'], ['f'])}
  monkeypatch.setattr(sources, 'read_tfds_pairs',
                      lambda builder, split, *langs: iter([splits[split]]))
  with pytest.raises(ValueError, match=r"wmt14_translate/de-en split 'validation' "
                     r'\(config\.dev_split\): the dev set has no sentence pair'):
    pipeline.get_datasets(tfds_config(tmp_path), str(tmp_path / 'workdir'), num_devices=1)
  assert not (tmp_path / 'workdir' / 'vocab').exists()


def test_unreachable_host_is_detected_quickly():
  start = time.time()
  assert not sources.reachable('no-such-host.invalid')
  assert time.time() - start < 10


def test_tfds_unknown_language_is_named(tmp_path):
  pytest.importorskip('tensorflow_datasets')
  config = tfds_config(tmp_path)
  config.target_lang = 'fr'
  with pytest.raises(ValueError, match=r"config\.target_lang='fr'"):
    pipeline.get_datasets(config, str(tmp_path), num_devices=1)


@pytest.mark.parametrize('key,value', [('bucket_band', -1), ('bucket_growth', 0.9),
                                       ('tokens_per_batch', 0)])
def test_bad_settings_name_the_key(tmp_path, key, value):
  """The one validator every mode calls first names the key (the pipeline trusts it)."""
  config = make_config(tmp_path, **{key: value})
  with pytest.raises(errors.UserError, match=rf'config\.{key}'):
    rules.validate(config)


def test_budget_too_small_for_one_row(tmp_path):
  # The devices don't matter (padding rows fill them): one row of the longest cell must fit.
  config = make_config(tmp_path, tokens_per_batch=30)
  with pytest.raises(ValueError, match=r'config\.tokens_per_batch=30 cannot hold one '
                     r'40-token row'):
    pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=8)


def test_tfds_without_the_wmt_extra_names_it(tmp_path, monkeypatch):
  """A base install (`make demo`) has no TensorFlow: dataset='tfds' says, in one line, which
  extra installs it, both in training (get_datasets) and in --mode=eval (load_eval_set)."""
  for module in ('tensorflow', 'tensorflow_datasets'):  # None: `import` raises ImportError
    monkeypatch.setitem(sys.modules, module, None)
  config, workdir = tfds_config(tmp_path), str(tmp_path / 'workdir')
  for load in (lambda: pipeline.get_datasets(config, workdir, num_devices=1),
               lambda: pipeline.load_eval_set(config, workdir, 'test', tokenizer=None)):
    with pytest.raises(errors.UserError) as raised:
      load()
    message = str(raised.value)
    assert message.startswith("config.dataset='tfds' needs TensorFlow Datasets")
    assert '\n' not in message
    for needle in ("pip install 't2t_jax[wmt]'", "-m pip install -e '.[wmt]'",
                   '--config.dataset=files'):
      assert needle in message
  assert not (tmp_path / 'workdir' / 'vocab').exists()
