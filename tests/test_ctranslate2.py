"""--mode=export --config.export_format=ctranslate2: CTranslate2 computes what we compute.

The tiny trained run (`tiny_workdir`, conftest.py; a synthetic task whose text is its ids,
'5 6 7') is exported through export_ct2.export_run, as the command does. CTranslate2's own
Translator then decodes it greedily (float32) and scores our outputs; both are compared with
our Translator: the same tokens, the same log-probabilities. test_export.py's random model
with a SentencePiece vocabulary is checked text for text, and a random model with learned
positions (Table 3 row E, which MarianMT cannot hold) token by token.
"""
import ast
import dataclasses
import json
import os
import sys

import ctranslate2
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
import sentencepiece as spm

import test_export
from helpers import tiny_config
from t2t_jax import Translator
from t2t_jax.apps import export_ct2
from t2t_jax.data import synthetic
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.tokenizer import EOS_ID
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import errors

SENTENCES = ['5 6 7', '9 9 9 9 9 9 9 9', '3', '11 12', '4 8 15 16 23 39', '10 20 30', '7 7',
             '38 2 5']
SUPPRESS = [['0']]  # PAD, which our search never emits (the README's suppress_sequences)


@dataclasses.dataclass
class Exported:
  path: str
  ours: Translator
  float32: ctranslate2.Translator


@pytest.fixture(scope='module')
def exported(tiny_workdir, tmp_path_factory) -> Exported:
  path = str(tmp_path_factory.mktemp('ct2') / 'export')
  config = tiny_config()
  config.export_format = 'ctranslate2'
  export_ct2.export_run(config, tiny_workdir, path)
  return Exported(path, Translator(tiny_config(), tiny_workdir),
                  ctranslate2.Translator(os.path.join(path, 'float32'), compute_type='float32',
                                         intra_threads=1))


def greedy(translator: ctranslate2.Translator, sentence: str) -> list[str]:
  """CTranslate2's greedy tokens for one sentence, with our per-sentence limit: its ids (EOS
  included) + decode_extra_length tokens, EOS the last, so at most this many before it."""
  tokens = sentence.split()
  result = translator.translate_batch(
      [tokens], beam_size=1, suppress_sequences=SUPPRESS, min_decoding_length=0,
      max_decoding_length=len(tokens) + tiny_config().decode_extra_length)
  return result[0].hypotheses[0]


@pytest.mark.slow  # an export: seconds
def test_the_folder_holds_both_models_with_our_start_symbol(exported):
  assert sorted(os.listdir(exported.path)) == ['README.md', 'float32', 'int8']
  vocabulary = synthetic.IdTokenizer(tiny_config().vocab_size).pieces(range(40))
  sizes = {}
  for model in export_ct2.QUANTIZATIONS:
    folder = os.path.join(exported.path, model)
    assert sorted(os.listdir(folder)) == ['config.json', 'model.bin', 'shared_vocabulary.json']
    with open(os.path.join(folder, 'config.json')) as f:
      config = json.load(f)
    assert (config['decoder_start_token'], config['eos_token'], config['add_source_eos'],
            config['layer_norm_epsilon']) == ('0', '</s>', True, 1e-6)
    with open(os.path.join(folder, 'shared_vocabulary.json')) as f:
      assert json.load(f) == vocabulary
    sizes[model] = os.path.getsize(os.path.join(folder, 'model.bin'))
  assert sizes['int8'] < sizes['float32']  # (the position table, float32 in both, is most)


@pytest.mark.slow  # an export: seconds
def test_greedy_outputs_are_ours_token_for_token(exported):
  ours = exported.ours.translate(SENTENCES + [''], method='greedy')
  theirs = [greedy(exported.float32, s) for s in SENTENCES]
  assert ours == [' '.join(tokens) for tokens in theirs] + ['']
  limits = [len(s.split()) + tiny_config().decode_extra_length for s in SENTENCES]
  stopped = [len(tokens) < limit for tokens, limit in zip(theirs, limits, strict=True)]
  assert any(stopped) and not all(stopped)  # an EOS chosen, and the limit reached


@pytest.mark.slow  # an export: seconds
def test_log_probabilities_are_ours(exported):
  """CTranslate2's score of our greedy outputs (EOS included) is our log P(Y|X). Its own
  greedy scores differ: they are normalised with PAD suppressed, ours are not."""
  ours = exported.ours.translate(SENTENCES, method='greedy', n_best=1)
  scored = exported.float32.score_batch([s.split() for s in SENTENCES],
                                        [h[0].text.split() for h in ours])
  for hypotheses, result in zip(ours, scored, strict=True):
    assert result.tokens[-1] == '</s>'
    np.testing.assert_allclose(sum(result.log_probs), hypotheses[0].logprob, rtol=0, atol=1e-4)


@pytest.mark.slow  # an export: seconds
def test_int8_loads_and_translates(exported):
  int8 = ctranslate2.Translator(os.path.join(exported.path, 'int8'), compute_type='int8',
                                intra_threads=1)
  vocabulary = set(synthetic.IdTokenizer(tiny_config().vocab_size).pieces(range(40)))
  outputs = [greedy(int8, s) for s in SENTENCES]
  assert all(tokens and set(tokens) <= vocabulary - {'0', '</s>'} for tokens in outputs)
  ours = exported.ours.translate(SENTENCES, method='greedy', n_best=1)
  scored = int8.score_batch([s.split() for s in SENTENCES], [h[0].text.split() for h in ours])
  np.testing.assert_allclose([sum(r.log_probs) for r in scored],
                             [h[0].logprob for h in ours], rtol=0.05)  # quantized weights


@pytest.mark.slow  # an export: seconds
def test_the_readme_example_runs(exported, capsys):
  with open(os.path.join(exported.path, 'README.md'), encoding='utf-8') as f:
    code = f.read().split('```python\n')[1].split('```')[0]
  code = code.replace("PATH = 'float32'", f"PATH = {os.path.join(exported.path, 'float32')!r}")
  exec(compile(code, 'README.md', 'exec'), {})
  printed = ast.literal_eval(capsys.readouterr().out.strip())
  assert len(printed) == 1 and all(token.isdigit() for token in printed[0].split())


@pytest.mark.slow
def test_a_run_on_text_translates_as_ours(tmp_path):
  """A run with a SentencePiece vocabulary (test_export's random model, whose greedy search
  stops at EOS in some sentences and at the limit in others): each model folder holds the
  SentencePiece model, and its pieces in, CTranslate2's greedy text is our Translator's."""
  workdir = str(tmp_path / 'run')
  config = test_export.small_config()
  tokenizer_lib.load_or_train(config, workdir, lambda: test_export.made_up_sentences(400, 0))
  params = test_export.random_params(ModelConfig.from_config(config))
  with ocp.StandardCheckpointer() as checkpointer:  # averaged/1/params, as --mode=average
    checkpointer.save(os.path.join(os.path.abspath(workdir), 'averaged', '1', 'params'), params)
  config.export_format = 'ctranslate2'
  export_ct2.export_run(config, workdir, str(tmp_path / 'out'))
  folder = str(tmp_path / 'out' / 'float32')
  assert 'spm.model' in os.listdir(folder)
  sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, 'spm.model'))
  translator = ctranslate2.Translator(folder, compute_type='float32', intra_threads=1)
  theirs = []
  for sentence in test_export.SENTENCES:
    pieces = sp.encode(sentence, out_type=str)
    result = translator.translate_batch(
        [pieces], beam_size=1, suppress_sequences=[['<pad>'], ['<unk>']], min_decoding_length=0,
        max_decoding_length=len(pieces) + test_export.EXTRA_LENGTH)
    theirs.append(sp.decode(result[0].hypotheses[0]))
  assert theirs == Translator(config, workdir).translate(test_export.SENTENCES, method='greedy')
  assert '' in theirs  # EOS first: CTranslate2's default min_decoding_length=1 forbids it


@pytest.mark.slow  # an export: seconds
def test_learned_positions_give_our_log_probabilities(tmp_path):
  """Table 3 row E: the position tables are given as weights, so a random model with learned
  positions scores as ours, token by token."""
  config = tiny_config()
  config.model.positional = 'learned'
  model_config = ModelConfig.from_config(config).replace(deterministic=True)
  src, tgt = np.array([[5, 6, 7, 8, EOS_ID]]), np.array([[9, 3, 11, EOS_ID]])
  params = Transformer(model_config).init(jax.random.PRNGKey(1), src, tgt)['params']
  vocabulary = synthetic.IdTokenizer(config.vocab_size)
  export_ct2.export_ctranslate2(params, model_config, vocabulary.pieces(range(40)), [0],
                                str(tmp_path / 'out'), max_input_length=7, extra_length=5)
  logits = Transformer(model_config).apply({'params': params}, src, tgt)  # [1, t, v]
  ours = jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], axis=-1)[0, :, 0]
  translator = ctranslate2.Translator(str(tmp_path / 'out' / 'float32'), compute_type='float32')
  theirs = translator.score_batch([['5', '6', '7', '8']], [['9', '3', '11']])[0].log_probs
  np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)


@pytest.mark.slow  # an export: seconds
def test_the_command_fills_an_empty_folder_and_refuses_a_non_empty_one(tiny_workdir, tmp_path,
                                                                       cli):
  """As the Marian export (export.check_output_dir): a new or empty folder, never mixed."""
  empty = tmp_path / 'empty'
  empty.mkdir()
  args = (f'--workdir={tiny_workdir}', '--mode=export', '--config.export_format=ctranslate2')
  result = cli(*args, f'--output={empty}')
  assert result.returncode == 0, result.stderr
  assert 'ctranslate2.Translator: float32/, int8/' in result.stdout + result.stderr
  assert sorted(os.listdir(empty)) == ['README.md', 'float32', 'int8']
  mine = tmp_path / 'mine'
  mine.mkdir()
  (mine / 'notes.txt').write_text('mine')
  result = cli(*args, f'--output={mine}')
  assert result.returncode == 1
  assert f'--output={mine}: exists and is not empty' in result.stderr
  assert os.listdir(mine) == ['notes.txt']


def test_heads_other_than_d_model_over_h_are_refused(tmp_path):
  config = tiny_config()
  config.export_format, config.model.d_k = 'ctranslate2', 4
  with pytest.raises(errors.UserError, match=r'^config\.model\.d_k=4: '):
    export_ct2.export_run(config, str(tmp_path), str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out')


def test_a_missing_ctranslate2_is_one_line_naming_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, 'ctranslate2', None)  # `import ctranslate2` fails
  with pytest.raises(errors.UserError, match=r"pip install -e '\.\[ctranslate2\]'$"):
    export_ct2.ctranslate2_modules()
