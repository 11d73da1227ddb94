"""--mode=export: the MarianMT folder loads in transformers and computes what we compute.

One random model (non-zero biases, layer-norm gains and biases) and a SentencePiece
vocabulary trained here are exported through export.export_run, as --mode=export does. The
checks compare what transformers' own MarianMTModel and MarianTokenizer compute from the folder
with what our model and Tokenizer compute: logits, greedy outputs, ids.
"""
import dataclasses
import logging
import os
import random
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import safetensors.numpy
import torch
import transformers

from experiments import demo
from t2t_jax.apps import export
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.decoding import decode
from t2t_jax.model.transformer import ModelConfig, Transformer, shift_right, sinusoidal_positions
from t2t_jax.platform import errors, files

VOCAB_SIZE = 320  # 256 byte pieces + 3 specials + characters + a few merges
EXTRA_LENGTH = 6  # config.decode_extra_length
ATOL = 1e-4


def made_up_sentences(n: int, seed: int) -> list[str]:
  rng = random.Random(seed)
  syllables = ['the', 'ing', 'er', 'sch', 'ü', 'ö', 'ä', 'ß', 'an', 'ke', 'lo', 'mi', 'st',
               'ein', 'ch', 'qu', 'é', 'ta', 'ri', 'on']
  words = [''.join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(200)]
  return [' '.join(rng.choices(words, k=rng.randint(1, 10))).capitalize() +
          rng.choice(['.', '?', '!', ',', '']) for _ in range(n)]


# Seen and unseen text: byte fallback (☃, emoji), NFKC (ﬁ, full-width), whitespace runs.
SENTENCES = made_up_sentences(4, seed=1) + [
    'Schön ☃ 🙂 quiet', '  ﬁne   ｗｉｄｅ  text ', 'x', 'Über Straße, öl; 3.14 ‰ «ja»']


def small_config():
  config = demo.get_config()
  config.dataset = 'files'
  config.vocab_size = VOCAB_SIZE
  config.model.update(num_layers=2, d_model=32, d_ff=64, num_heads=4)
  config.max_decode_input_length, config.decode_extra_length = 40, EXTRA_LENGTH
  return config


def random_params(model_config: ModelConfig, seed: int = 0):
  """Every parameter random, none 0 or 1: kernels N(0, 9/fan_in) (3× the usual scale, so
  that outputs depend on the input more than a random model's usually do; 4× is chaotic
  enough to amplify float32 rounding to ~1e-4), layer-norm gains 1 + N(0, 0.3²) and biases
  N(0, 0.2²), FFN biases N(0, 0.3²): the attention biases we lack and the layer norms would
  all show. EOS's embedding row is made 2.5× longer, so that greedy search picks EOS in some
  sentences (seed 0: after 0, 4 and 7 tokens) and reaches the length limit in others."""
  rng = np.random.default_rng(seed)
  dummy = jnp.ones((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: Transformer(model_config).init(
      jax.random.PRNGKey(0), dummy, dummy))['params']

  def fill(path, leaf):
    names = [key.key for key in path]
    noise = rng.standard_normal(leaf.shape).astype(np.float32)
    if names[-1] == 'embedding':
      return noise * model_config.d_model ** -0.5
    if names[-1] == 'kernel':  # fan_in: d_model, d_ff, or h·d_v for W^O [h, d_v, m]
      return 3 * noise * np.prod(leaf.shape[:2] if names[-2] == 'out' else leaf.shape[:1]) ** -0.5
    if names[-2] == 'layer_norm':
      return 1 + 0.3 * noise if names[-1] == 'scale' else 0.2 * noise
    return 0.3 * noise
  params = jax.tree_util.tree_map_with_path(fill, shapes)
  params['shared_embedding']['embedding'][EOS_ID] *= 2.5
  return params


@dataclasses.dataclass
class Exported:
  path: str
  params: dict
  model_config: ModelConfig
  tokenizer: tokenizer_lib.Tokenizer
  hf_model: transformers.MarianMTModel
  hf_tokenizer: transformers.MarianTokenizer


@pytest.fixture(scope='module')
def exported(tmp_path_factory) -> Exported:
  """A trained-looking workdir (vocab/spm.model, averaged/1/params) exported by export_run."""
  workdir = str(tmp_path_factory.mktemp('run'))
  config = small_config()
  tokenizer = tokenizer_lib.load_or_train(config, workdir, lambda: made_up_sentences(400, 0))
  model_config = ModelConfig.from_config(config).replace(deterministic=True)
  params = random_params(model_config)
  # averaged/1/params, as --mode=average writes it
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(os.path.join(os.path.abspath(workdir), 'averaged', '1', 'params'), params)
  checkpointer.wait_until_finished()
  checkpointer.close()
  path = os.path.join(workdir, 'marian')
  export.export_run(config, workdir, path)
  hf_model = transformers.MarianMTModel.from_pretrained(path).eval()
  return Exported(path, params, model_config, tokenizer, hf_model,
                  transformers.MarianTokenizer.from_pretrained(path))


def padded(rows: list[list[int]]) -> np.ndarray:
  out = np.full((len(rows), max(map(len, rows))), PAD_ID, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def hf_logits(model: transformers.MarianMTModel, src: np.ndarray, targets: np.ndarray):
  with torch.no_grad():
    return model(input_ids=torch.tensor(src, dtype=torch.long),
                 attention_mask=torch.tensor(src != PAD_ID, dtype=torch.long),
                 decoder_input_ids=torch.tensor(np.asarray(shift_right(targets)),
                                                dtype=torch.long)).logits.numpy()


def test_the_folder_holds_marian_files_and_nothing_else(exported):
  assert sorted(os.listdir(exported.path)) == sorted(export.FILES)
  tied = {'lm_head.weight', 'model.encoder.embed_tokens.weight',
          'model.decoder.embed_tokens.weight'}  # transformers ties them to model.shared
  written = safetensors.numpy.load_file(os.path.join(exported.path, 'model.safetensors'))
  assert set(written) == set(exported.hf_model.state_dict()) - tied
  config = transformers.AutoConfig.from_pretrained(exported.path)
  assert (config.model_type, config.d_model, config.encoder_layers, config.decoder_layers,
          config.encoder_attention_heads, config.encoder_ffn_dim, config.vocab_size) == (
              'marian', 32, 2, 2, 4, 64, VOCAB_SIZE)
  assert (config.pad_token_id, config.decoder_start_token_id, config.eos_token_id) == (0, 0, 1)
  assert config.scale_embedding and config.activation_function == 'relu'
  generation = transformers.GenerationConfig.from_pretrained(exported.path)
  assert (generation.num_beams, generation.length_penalty, generation.suppress_tokens,
          generation.forced_eos_token_id, generation.max_new_tokens) == (4, 0.6, [0], 1, 46)


def test_marian_tokenizer_gives_our_ids(exported):
  texts = SENTENCES + made_up_sentences(50, seed=2)
  for text in texts:
    ids = exported.tokenizer.encode(text)
    assert exported.hf_tokenizer(text).input_ids == ids, text
    assert exported.hf_tokenizer.decode(ids, skip_special_tokens=True) == (
        exported.tokenizer.decode(ids)), text
  batch = exported.hf_tokenizer(texts, padding=True, return_tensors='np')
  np.testing.assert_array_equal(batch['input_ids'],
                                padded([exported.tokenizer.encode(t) for t in texts]))
  long = ' '.join(texts)  # truncation keeps EOS, as translate does
  assert exported.hf_tokenizer(long, truncation=True, max_length=9).input_ids == (
      exported.tokenizer.encode(long)[:8] + [EOS_ID])
  # The documented difference: text that spells a special token is that token there.
  assert exported.hf_tokenizer('a </s> b').input_ids.count(EOS_ID) == 2
  assert exported.tokenizer.encode('a </s> b').count(EOS_ID) == 1


def test_logits_equal_ours(exported):
  src = padded([exported.tokenizer.encode(s) for s in SENTENCES])  # [b, s]
  rng = np.random.default_rng(0)
  targets = padded([list(rng.integers(3, VOCAB_SIZE, size=n)) + [EOS_ID]
                    for n in rng.integers(1, 12, size=len(SENTENCES))])  # [b, t], unpadded too
  ours = np.asarray(jax.jit(Transformer(exported.model_config).apply)(
      {'params': exported.params}, src, targets))  # [b, t, v]
  theirs = hf_logits(exported.hf_model, src, targets)
  assert ours.std() > 0.5  # logits that differ by far more than the tolerance
  np.testing.assert_allclose(theirs, ours, rtol=0, atol=ATOL)


def test_greedy_outputs_equal_our_beam_search_of_one(exported):
  """transformers' greedy search with the exported generation config (PAD suppressed, EOS
  forced at the limit) against decode.beam_search(beam_size=1), each sentence with our
  per-sentence limit |Y| ≤ len(source ids) + extra as max_new_tokens, as docs/export.md
  advises: transformers warns of nothing (it warned of max_length beside max_new_tokens)."""
  rows = [exported.tokenizer.encode(s) for s in SENTENCES]
  ours, _ = decode.beam_search(exported.params, padded(rows), config=exported.model_config,
                               beam_size=1, extra_length=EXTRA_LENGTH)
  ours = np.asarray(ours)
  warned = []  # transformers warns through its own logger (no propagation) and warnings
  handler = logging.Handler(logging.WARNING)
  handler.emit = warned.append
  logging.getLogger('transformers').addHandler(handler)
  stops = []
  for row, our_ids in zip(rows, ours, strict=True):
    with torch.no_grad(), warnings.catch_warnings():
      warnings.simplefilter('error')
      theirs = exported.hf_model.generate(
          input_ids=torch.tensor([row]), num_beams=1, do_sample=False,
          max_new_tokens=len(row) + EXTRA_LENGTH)[0].numpy()
    assert theirs[0] == PAD_ID  # the start symbol
    length = list(our_ids).index(EOS_ID) + 1
    np.testing.assert_array_equal(theirs[1:], our_ids[:length])
    stops.append(length < len(row) + EXTRA_LENGTH)
  logging.getLogger('transformers').removeHandler(handler)
  assert not warned, [record.getMessage() for record in warned]
  assert any(stops) and not all(stops)  # an EOS chosen and one forced at the limit, both


def test_a_copy_saved_by_transformers_computes_the_same(exported, tmp_path):
  """save_pretrained leaves the position tables out; Marian's own sinusoids, rebuilt on
  load, are our table in the exported feature order, so nothing changes."""
  exported.hf_model.save_pretrained(tmp_path)
  again = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
  for side in (again.model.encoder, again.model.decoder):
    rebuilt = side.embed_positions.weight.detach().numpy()
    np.testing.assert_allclose(rebuilt, exported.hf_model.model.encoder.embed_positions.weight
                               .detach().numpy(), rtol=0, atol=1e-5)
  src = padded([exported.tokenizer.encode(s) for s in SENTENCES[:3]])
  targets = padded([[5, 9, EOS_ID], [7, EOS_ID], [11, 12, 13, EOS_ID]])
  np.testing.assert_allclose(hf_logits(again, src, targets),
                             hf_logits(exported.hf_model, src, targets), rtol=0, atol=ATOL)


@pytest.mark.parametrize('change, key', [
    ({'model.positional': 'learned'}, 'config.model.positional'),
    ({'model.d_k': 4}, 'config.model.d_k'),
    ({'model.d_v': 16}, 'config.model.d_v'),
    ({'dataset': 'synthetic'}, 'config.dataset'),
])
def test_what_marian_cannot_represent_is_refused(tmp_path, change, key):
  config = small_config()
  for name, value in change.items():
    *parents, leaf = name.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  with pytest.raises(errors.UserError, match=f'^{key}[=:]'):
    export.export_run(config, str(tmp_path), str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


def test_a_non_empty_output_is_refused_and_kept(exported, tmp_path):
  (tmp_path / 'notes.txt').write_text('mine')
  with pytest.raises(errors.UserError, match='^--output=.*not empty'):
    export.export_run(small_config(), str(tmp_path / 'no_run'), str(tmp_path))
  with pytest.raises(errors.UserError, match='^--output=.*not empty'):
    export.export_marian(exported.params, exported.model_config,
                         exported.tokenizer.model_path, str(tmp_path),
                         source_lang='en', target_lang='de')
  assert os.listdir(tmp_path) == ['notes.txt']


def test_an_empty_folder_is_filled_and_a_failed_write_leaves_nothing(exported, tmp_path,
                                                                     monkeypatch):
  empty = tmp_path / 'empty'
  empty.mkdir()
  write = lambda path: export.export_marian(  # noqa: E731
      exported.params, exported.model_config, exported.tokenizer.model_path, str(path),
      source_lang='en', target_lang='de')
  write(empty)
  assert sorted(os.listdir(empty)) == sorted(export.FILES)

  def full_disk(tmp, path):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(files, 'publish', full_disk)
  with pytest.raises(files.DiskWriteError, match='No space left'):
    write(tmp_path / 'new')
  assert sorted(os.listdir(tmp_path)) == ['empty']  # no export, no temporary folder


def test_the_permutation_puts_our_sinusoids_in_marians_layout():
  """Independent of transformers: Marian's formula (sines in the first half) against ours."""
  d_model, positions = 10, np.arange(7)
  pi = export.feature_permutation(d_model)
  assert sorted(pi) == list(range(d_model))
  angles = positions[:, None] / 10000 ** (2 * np.arange(d_model // 2) / d_model)
  marian = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
  ours = np.asarray(sinusoidal_positions(jnp.asarray(positions), d_model))
  np.testing.assert_allclose(ours[:, pi], marian, atol=1e-6)


def test_the_model_card_names_the_model_and_its_example_runs(exported, capsys):
  card = open(os.path.join(exported.path, 'README.md'), encoding='utf-8').read()
  assert card.startswith('---\nlanguage: [en, de]\n')
  config = exported.model_config
  for fact in (f'{config.num_layers} encoder and {config.num_layers} decoder layers',
               f'd_model {config.d_model}', f'{config.vocab_size} pieces', '`averaged/1`'):
    assert fact in card, fact
  code = card.split('```python\n')[1].split('```')[0]
  exec(compile(code.replace('PATH', repr(exported.path)), 'README.md', 'exec'), {})
  printed = capsys.readouterr().out.strip()
  assert printed.startswith('[') and printed.endswith(']')  # one translation, a list
