"""Tests of the shared SentencePiece vocabulary (§5.1)."""
import collections
import errno
import os
import random
import subprocess
import unicodedata

import ml_collections
import numpy as np
import pytest

from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from t2t_jax.platform import files

VOCAB_SIZE = 320  # 256 byte pieces + 3 specials + characters + a few merges


def sentences(n: int, seed: int) -> list[str]:
  """Pseudo-English and pseudo-German sentences from random syllables."""
  rng = random.Random(seed)
  syllables = ['the', 'ing', 'er', 'sch', 'ü', 'ö', 'ä', 'ß', 'an', 'ke', 'lo',
               'mi', 'st', 'ein', 'ch', 'qu', 'é', 'ta', 'ri', 'on']
  words = [''.join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(300)]
  out = []
  for _ in range(n):
    sentence = ' '.join(rng.choices(words, k=rng.randint(1, 12)))
    out.append(sentence.capitalize() + rng.choice(['.', '?', '!', ',', '']))
  return out


def make_config(vocab_size: int = VOCAB_SIZE, sample: int = 10_000):
  return ml_collections.ConfigDict(
      {'vocab_size': vocab_size, 'vocab_sample_sentences': sample})


def normalise(text: str) -> str:
  """What "normalised" means here: NFKC, whitespace runs collapsed, stripped.

  SentencePiece's default rule, nmt_nfkc, does this for all text used below
  (it differs from NFKC only on control characters, which the tests avoid).
  """
  return ' '.join(unicodedata.normalize('NFKC', text).split())


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('workdir'))
  tokenizer_lib.load_or_train(make_config(), path, lambda: sentences(400, seed=0))
  return path


@pytest.fixture(scope='module')
def tok(workdir):
  return tokenizer_lib.load_or_train(make_config(), workdir, lambda: [])


# Unseen characters (emoji, CJK, Greek) must survive through byte fallback.
ROUND_TRIP = sentences(50, seed=1) + [
    'Ein Satz mit Emoji 😀 und 北京 und Ωμέγα.',
    'x', '?!', 'Ärger über Öl — 3,5 % „Zitat“ «citation» 1/2',
]


@pytest.mark.parametrize('text', ROUND_TRIP)
def test_decode_encode_round_trips_normalised_text(tok, text):
  assert normalise(text) == text  # the inputs are normalised already
  assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize('raw', [
    '  two   spaces\tand a tab  ', 'ﬁne ligature', 'Ｆｕｌｌ width', 'e\u0301 combining',
])
def test_decode_encode_returns_the_normalisation(tok, raw):
  assert normalise(raw) != raw
  assert tok.decode(tok.encode(raw)) == normalise(raw)


def test_special_ids_and_eos(tok):
  assert (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2)
  assert tok.vocab_size == VOCAB_SIZE
  for text in ROUND_TRIP:
    ids = tok.encode(text)
    assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1] and PAD_ID not in ids
    assert all(0 < i < tok.vocab_size for i in ids)
  assert tok.encode('') == [EOS_ID]
  assert tok.encode_batch(ROUND_TRIP) == [tok.encode(t) for t in ROUND_TRIP]


def test_decode_stops_at_eos_and_ignores_pad(tok):
  first, second = 'Ein erster Satz.', 'The second one.'
  ids = tok.encode(first) + tok.encode(second) + [PAD_ID] * 3
  assert tok.decode(ids) == first
  assert tok.decode(np.array([PAD_ID] + tok.encode(first)[:-1] + [PAD_ID, PAD_ID])) == first
  assert tok.decode(np.array([[PAD_ID, PAD_ID]])) == ''
  # an id past the vocabulary (a padded embedding table) does not crash
  assert tok.decode([tok.vocab_size + 5]) == tok.decode([UNK_ID])


def test_reused_on_restart_and_never_retrained(workdir, tok):
  model = os.path.join(workdir, 'vocab', 'spm.model')
  before = open(model, 'rb').read()

  def must_not_sample():
    raise AssertionError('the vocabulary was retrained')

  again = tokenizer_lib.load_or_train(make_config(), workdir, must_not_sample)
  assert again.fingerprint == tok.fingerprint
  assert open(model, 'rb').read() == before
  assert sorted(os.listdir(os.path.dirname(model))) == ['spm.model', 'spm.vocab']
  with pytest.raises(ValueError, match=r'config\.vocab_size=500'):
    tokenizer_lib.load_or_train(make_config(vocab_size=500), workdir, must_not_sample)
  assert open(model, 'rb').read() == before


def test_same_sample_gives_the_same_ids(tmp_path, tok):
  # Hosts with separate workdirs must agree on ids.
  other = tokenizer_lib.load_or_train(make_config(), str(tmp_path),
                                      lambda: sentences(400, seed=0))
  assert other.fingerprint == tok.fingerprint
  assert [other.encode(t) for t in ROUND_TRIP] == [tok.encode(t) for t in ROUND_TRIP]


def test_trains_on_a_bounded_sample(tmp_path, monkeypatch):
  seen = {}

  def fake_train(sample, vocab_size, vocab_dir):
    seen['sample'] = sample
    raise RuntimeError('stop here')

  monkeypatch.setattr(tokenizer_lib, 'train_bpe', fake_train)
  corpus = [f'sentence {i}' for i in range(5000)]
  with pytest.raises(RuntimeError, match='stop here'):
    tokenizer_lib.load_or_train(make_config(sample=300), str(tmp_path), lambda: iter(corpus))
  assert len(seen['sample']) == 300 and len(set(seen['sample'])) == 300
  assert set(seen['sample']) <= set(corpus)
  # drawn from the whole stream, not its head
  assert max(int(s.split()[1]) for s in seen['sample']) > 4000


def test_reservoir_sample_is_uniform_and_seeded():
  assert tokenizer_lib.reservoir_sample(range(5), 10, seed=0) == list(range(5))
  def draw(seed):
    return tokenizer_lib.reservoir_sample(range(100), 10, seed=seed)
  assert draw(3) == draw(3)
  counts = collections.Counter(x for seed in range(3000) for x in draw(seed))
  # each item is kept with probability 0.1: 300 of 3000 draws, sd ~16
  assert len(counts) == 100
  assert 220 < min(counts.values()) and max(counts.values()) < 380


def test_impossible_vocab_size_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match=r'config\.vocab_size=50000'):
    tokenizer_lib.load_or_train(make_config(vocab_size=50000), str(tmp_path),
                                lambda: sentences(50, seed=0))
  # no half-written vocabulary left behind
  assert os.listdir(tmp_path / 'vocab') == []


def test_full_disk_is_one_line_and_leaves_no_half_vocabulary(tmp_path, monkeypatch):
  moved = []

  def replace(src, dst):
    if moved:  # spm.vocab is in place; the disk fills up before spm.model
      raise OSError(errno.ENOSPC, 'No space left on device')
    moved.append(dst)
    return original(src, dst)

  original = os.replace
  monkeypatch.setattr(os, 'replace', replace)
  with pytest.raises(OSError) as raised:
    tokenizer_lib.load_or_train(make_config(), str(tmp_path), lambda: sentences(400, seed=0))
  assert str(raised.value) == (f'{tmp_path / "vocab"}: cannot write the vocabulary: '
                               'No space left on device')
  assert os.listdir(tmp_path / 'vocab') == ['spm.vocab']  # no .model: never used
  monkeypatch.undo()
  # the next run trains it again
  tok = tokenizer_lib.load_or_train(make_config(), str(tmp_path), lambda: sentences(400, seed=0))
  assert tok.vocab_size == VOCAB_SIZE


def test_killed_runs_temporaries_are_swept(tmp_path):
  dead = subprocess.Popen(['true'])
  dead.wait()
  host = files._host()
  vocab = tmp_path / 'vocab'
  for name in (f'.tmp-{host}-{dead.pid}-abc', f'.tmp-{host}-{os.getpid()}-live'):
    (vocab / name).mkdir(parents=True)
    (vocab / name / 'spm.model').write_bytes(b'half')
  tokenizer_lib.load_or_train(make_config(), str(tmp_path), lambda: sentences(400, seed=0))
  assert sorted(os.listdir(vocab)) == [f'.tmp-{host}-{os.getpid()}-live', 'spm.model',
                                       'spm.vocab']


def test_unreadable_model_is_named(tmp_path):
  (tmp_path / 'vocab').mkdir()
  (tmp_path / 'vocab' / 'spm.model').write_bytes(b'\x0a\x05trunc')
  with pytest.raises(ValueError, match=r'vocab/spm\.model: not a readable SentencePiece model'):
    tokenizer_lib.load_or_train(make_config(), str(tmp_path), lambda: [])
