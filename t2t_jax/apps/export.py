"""`--mode=export`: a trained run as a Hugging Face MarianMT folder (docs/export.md).

`--mode=export --output=DIR2` writes DIR2 (FILES) with numpy, json and safetensors alone, so that
transformers' MarianMTModel and MarianTokenizer compute what this project computes: the same
sub-word ids, and logits equal to float32 rounding (tests/test_export.py: 1e-4), so the same
greedy outputs.

MarianMT is this paper's Transformer too: post-LN layers (LayerNorm(x + Sublayer(x)), Marian's
only layout), ReLU (`activation_function='relu'`), the ×√d_model of §3.4 (`scale_embedding`), one
matrix for both embeddings and the pre-softmax projection (`share_encoder_decoder_embeddings`,
`tie_word_embeddings`), dropout = our P_drop (residual and embedding dropout, training only; no
attention or ReLU dropout). The parameters map one to one (m = d_model, v = vocabulary, h heads
of d = d_k = d_v = m / h, P positions, π the permutation below; torch's Linear weights are
[out, in]):

  ours: params[...]                            Marian's state dict
  shared_embedding/embedding [v, m]            model.shared.weight [v, m] = embedding[:, π]
  model.sinusoidal_positions(0..P-1) [P, m]    model.{en,de}coder.embed_positions.weight [:, π]
  L/self_attention/{query,key,value}/kernel    L'.self_attn.{q,k,v}_proj.weight [h·d, m]
    [m, h, d]                                    = kernel.reshape(m, h·d)[π].T
  L/self_attention/out/kernel [h, d, m]        L'.self_attn.out_proj.weight [m, h·d]
                                                 = kernel.reshape(h·d, m)[:, π].T
  (no attention biases, as tensor2tensor)      L'.{self_attn,encoder_attn}.*_proj.bias [m] = 0
  D/cross_attention/... (as self_attention)    D'.encoder_attn.{q,k,v,out}_proj.weight
  L/ffn/w_1/kernel [m, d_ff], bias [d_ff]      L'.fc1.weight = kernel[π].T, L'.fc1.bias = bias
  L/ffn/w_2/kernel [d_ff, m], bias [m]         L'.fc2.weight = kernel[:, π].T, .bias = bias[π]
  L/*_sublayer/layer_norm (*_NORMS below)      L'.*_layer_norm
    scale [m], bias [m]                          .weight = scale[π], .bias = bias[π]
  (none: the logits are y Eᵀ)                  final_logits_bias [1, v] = 0
  (the shared embedding)                       lm_head.weight, tied to model.shared.weight
where L is encoder/layer_i (E) or decoder/layer_i (D) and L' is model.encoder.layers.i (E') or
model.decoder.layers.i (D'), i < N = num_layers. Heads: q_proj's output row n·d + j is our
kernel[:, n, j] (Marian cuts d_model into heads the same way, `view(..., -1, head_dim)`), and
Marian's scaling head_dim^-0.5 is our 1/√d_k.

What differs, and how it is made equal:
  * The sinusoid layout: ours interleaves (§3.5), PE[:, 2i] = sin(pos / 10000^(2i/m)) and
    PE[:, 2i+1] = cos(...); MarianSinusoidalPositionalEmbedding puts sines in [0, m/2), cosines
    in [m/2, m). Permuting every d_model axis by π = (0, 2, 4, ..., 1, 3, 5, ...) gives Marian's
    layout and exactly our logits: layer norms and dot products over d_model commute with it.
    embed_positions.weight (a parameter in transformers 5) loads our float32 table from the file;
    save_pretrained leaves it out (_keys_to_ignore_on_save) and from_pretrained rebuilds Marian's
    float64 one, ours to float32 rounding, so a re-saved copy translates the same.
  * Token ids: pad_token_id = decoder_start_token_id = 0 (our PAD, the start symbol of §3.1,
    model.shift_right), eos_token_id = 1, and no BOS.
  * LayerNorm epsilon, the one difference left: ours is 1e-6 (tensor2tensor's), Marian's the torch
    default 1e-5, which MarianConfig cannot set. A layer norm's output changes by a factor of about
    1 - 4.5e-6 / σ² (σ² its input's variance): within the test's 1e-4, more where σ² is small.
    Scaling the residual stream by √10 (W^Q and W^K by 1/√10) would move the epsilon exactly, but a
    copy re-saved by transformers would lose the scaled positions.
  * dtype: our parameters are float32 whatever config.model.dtype computes in, and so are the file
    and config.json's 'dtype'. Load with dtype=torch.bfloat16 to compute as a bfloat16 run roughly
    does (not bit for bit).

Decoding (generation_config.json), as far as transformers can express it: num_beams =
config.beam_size, length_penalty = config.beam_alpha, but transformers divides log P by |Y|^α,
ours by ((5 + |Y|) / 6)^α (GNMT, §6.1), so only greedy decoding (num_beams=1) is our search.
suppress_tokens=[0] bans PAD after the log-softmax, as ours (no renormalising).
forced_eos_token_id=1 leaves only EOS at the limit, as ours (log-prob 0 there, ours its own).
max_new_tokens, the longest output ours allows, is one limit per call where ours is per
sentence, |Y| ≤ (source ids with EOS) + decode_extra_length: a caller's max_new_tokens =
len(input_ids) + extra replaces it without a warning. early_stopping='never' bounds a live
hypothesis at the limit, as ours (False would guess from the current length), but still waits
for num_beams finished hypotheses where ours stops at the best one.

Not representable, refused by `check_exportable` naming the key and why: learned positions
(Table 3 row E) and d_k or d_v other than d_model / h (Table 3 row B).

The tokenizer: MarianTokenizer runs the same SentencePiece model (normalisation, byte
fallback), so a sentence encodes to our ids, EOS appended; `truncation=True` keeps the first
model_max_length - 1 (= max_decode_input_length - 1) and EOS, as translate does. It differs on
text that spells a special token ('</s>', '<pad>', '<unk>'): it reads that as the token, ours
as characters. decode(ids, skip_special_tokens=True) is our Tokenizer.decode.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import safetensors.numpy
import sentencepiece as spm
from absl import logging

from t2t_jax.config import rules
from t2t_jax.data import pipeline
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from t2t_jax.model.transformer import ModelConfig, sinusoidal_positions
from t2t_jax.platform import errors, files
from t2t_jax.run import params as params_lib

Params = dict[str, Any]
StateDict = dict[str, np.ndarray]

# Our flax names -> Marian's, per layer.
ENCODER_ATTENTION = {'self_attention': 'self_attn'}
DECODER_ATTENTION = {'self_attention': 'self_attn', 'cross_attention': 'encoder_attn'}
ENCODER_NORMS = {'attention_sublayer': 'self_attn_layer_norm', 'ffn_sublayer': 'final_layer_norm'}
DECODER_NORMS = {'self_attention_sublayer': 'self_attn_layer_norm',
                 'cross_attention_sublayer': 'encoder_attn_layer_norm',
                 'ffn_sublayer': 'final_layer_norm'}
# What an export writes; MarianTokenizer reads the last five.
FILES = ('config.json', 'generation_config.json', 'model.safetensors', 'source.spm', 'target.spm',
         'vocab.json', 'tokenizer_config.json', 'special_tokens_map.json', 'README.md')


def check_exportable(model_config: ModelConfig) -> None:
  """Raises errors.UserError naming the config.model key MarianMT cannot represent."""
  c = model_config
  if c.positional != 'sinusoidal':
    raise errors.UserError(
        f'config.model.positional={c.positional!r}: MarianMT has sinusoidal positions only '
        '(a frozen table that its save_pretrained leaves out); only sinusoidal runs export')
  for key, size in (('d_k', c.key_size), ('d_v', c.value_size)):
    if size * c.num_heads != c.d_model:
      raise errors.UserError(
          f'config.model.{key}={size}: MarianMT\'s heads are d_model / num_heads = '
          f'{c.d_model} / {c.num_heads} wide (its projections are d_model × d_model); only '
          f'{key} = d_model / num_heads exports')


def feature_permutation(d_model: int) -> np.ndarray:
  """π [m]: Marian's feature j is our feature π[j]; sines first, then cosines (see above)."""
  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def _layer(p: Params, prefix: str, attention: dict[str, str], norms: dict[str, str],
           pi: np.ndarray) -> StateDict:
  """One encoder or decoder layer's parameters under Marian's names (the table above)."""
  out = {}
  for ours, marian in attention.items():
    name, kernels = f'{prefix}.{marian}', p[ours]
    h, d, m = kernels['out']['kernel'].shape
    for proj, kernel in (('q', 'query'), ('k', 'key'), ('v', 'value')):
      out[f'{name}.{proj}_proj.weight'] = kernels[kernel]['kernel'].reshape(m, h * d)[pi].T
    out[f'{name}.out_proj.weight'] = kernels['out']['kernel'].reshape(h * d, m)[:, pi].T
    for proj in ('q', 'k', 'v', 'out'):  # ours have no biases
      out[f'{name}.{proj}_proj.bias'] = np.zeros(m, np.float32)
  for ours, marian in norms.items():
    out[f'{prefix}.{marian}.weight'] = p[ours]['layer_norm']['scale'][pi]
    out[f'{prefix}.{marian}.bias'] = p[ours]['layer_norm']['bias'][pi]
  w_1, w_2 = p['ffn']['w_1'], p['ffn']['w_2']
  out[f'{prefix}.fc1.weight'] = w_1['kernel'][pi].T  # [d_ff, m]
  out[f'{prefix}.fc1.bias'] = w_1['bias']
  out[f'{prefix}.fc2.weight'] = w_2['kernel'][:, pi].T  # [m, d_ff]
  out[f'{prefix}.fc2.bias'] = w_2['bias'][pi]
  return out


def marian_state_dict(params: Params, model_config: ModelConfig, *,
                      max_positions: int) -> StateDict:
  """Our parameters as MarianMTModel's state dict (float32, contiguous): the table above, with
  sinusoid tables of `max_positions` rows, the longest input or output they serve."""
  check_exportable(model_config)
  c = model_config
  params = jax.tree_util.tree_map(np.asarray, params)
  pi = feature_permutation(c.d_model)
  embedding = params['shared_embedding']['embedding']  # [v, m]
  pe = np.asarray(sinusoidal_positions(jnp.arange(max_positions), c.d_model))  # [P, m]
  state = {'model.shared.weight': embedding[:, pi],
           'final_logits_bias': np.zeros((1, embedding.shape[0]), np.float32)}
  for side, attention, norms in (('encoder', ENCODER_ATTENTION, ENCODER_NORMS),
                                 ('decoder', DECODER_ATTENTION, DECODER_NORMS)):
    state[f'model.{side}.embed_positions.weight'] = pe[:, pi]
    for i in range(c.num_layers):
      state.update(_layer(params[side][f'layer_{i}'], f'model.{side}.layers.{i}', attention,
                          norms, pi))
  return {name: np.ascontiguousarray(x, np.float32) for name, x in state.items()}


def marian_config(model_config: ModelConfig, *, max_positions: int) -> dict[str, Any]:
  """config.json: MarianConfig's keys for our architecture (see the module docstring)."""
  c = model_config
  return {
      'architectures': ['MarianMTModel'], 'model_type': 'marian',
      'vocab_size': c.vocab_size, 'decoder_vocab_size': c.vocab_size,
      'd_model': c.d_model, 'encoder_layers': c.num_layers, 'decoder_layers': c.num_layers,
      'encoder_attention_heads': c.num_heads, 'decoder_attention_heads': c.num_heads,
      'encoder_ffn_dim': c.d_ff, 'decoder_ffn_dim': c.d_ff,
      'activation_function': 'relu', 'scale_embedding': True,
      'max_position_embeddings': max_positions,
      'dropout': c.dropout_rate, 'attention_dropout': 0.0, 'activation_dropout': 0.0,
      'encoder_layerdrop': 0.0, 'decoder_layerdrop': 0.0,
      'share_encoder_decoder_embeddings': True, 'tie_word_embeddings': True,
      'pad_token_id': PAD_ID, 'decoder_start_token_id': PAD_ID, 'eos_token_id': EOS_ID,
      'forced_eos_token_id': EOS_ID, 'bos_token_id': None,
      'is_encoder_decoder': True, 'use_cache': True, 'dtype': 'float32',
  }


def generation_config(*, beam_size: int, alpha: float, max_new_tokens: int) -> dict[str, Any]:
  """generation_config.json: our §6.1 search as far as transformers can express it."""
  return {
      'decoder_start_token_id': PAD_ID, 'pad_token_id': PAD_ID, 'eos_token_id': EOS_ID,
      'bos_token_id': None, 'forced_eos_token_id': EOS_ID, 'suppress_tokens': [PAD_ID],
      'num_beams': beam_size, 'length_penalty': alpha, 'early_stopping': 'never',
      'max_new_tokens': max_new_tokens, 'do_sample': False, 'renormalize_logits': False,
  }


def tokenizer_files(sentencepiece_model: bytes, *, source_lang: str, target_lang: str,
                    max_input_length: int) -> dict[str, bytes]:
  """MarianTokenizer's files: the shared model as source.spm and target.spm, vocab.json in
  our ids' order, and the special tokens (pad 0, </s> 1, <unk> 2) by their pieces."""
  sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model)
  vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}  # [v] pieces, unique
  special = {'pad_token': sp.id_to_piece(PAD_ID), 'eos_token': sp.id_to_piece(EOS_ID),
             'unk_token': sp.id_to_piece(UNK_ID)}
  config = {'tokenizer_class': 'MarianTokenizer', 'source_lang': source_lang,
            'target_lang': target_lang, 'separate_vocabs': False, 'sp_model_kwargs': {},
            'model_max_length': max_input_length, **special}
  return {'source.spm': sentencepiece_model, 'target.spm': sentencepiece_model,
          'vocab.json': _json(vocab), 'tokenizer_config.json': _json(config),
          'special_tokens_map.json': _json(special)}


def model_card(model_config: ModelConfig, *, source_lang: str, target_lang: str,
               trained_from: str, max_new_tokens: int) -> bytes:
  """README.md: the Hugging Face model card, saying what the model is, how it was made, and
  where transformers decodes otherwise than t2t_jax."""
  m = model_config
  return f'''---
language: [{source_lang}, {target_lang}]
library_name: transformers
pipeline_tag: translation
license: apache-2.0
tags: [marian, t2t_jax, transformer]
---

# Transformer {source_lang}→{target_lang}, trained with t2t_jax

The Transformer of *Attention Is All You Need* (Vaswani et al., 2017), trained with t2t_jax
and exported as a MarianMT model: {m.num_layers} encoder and {m.num_layers} decoder layers,
d_model {m.d_model}, d_ff {m.d_ff}, {m.num_heads} heads, a shared SentencePiece vocabulary
of {m.vocab_size} pieces; the parameters of `{trained_from}` of its training run.

```python
from transformers import MarianMTModel, MarianTokenizer

tokenizer = MarianTokenizer.from_pretrained(PATH)
model = MarianMTModel.from_pretrained(PATH)
batch = tokenizer(['A sentence.'], return_tensors='pt')
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

Greedy decoding (`num_beams=1`) gives t2t_jax's outputs; beam search ranks hypotheses by
log P / |Y|^α where t2t_jax's (§6.1) uses ((5 + |Y|) / 6)^α. The output limit is one per
call ({max_new_tokens} new tokens here); t2t_jax's is the input's length + its extra length
per sentence: pass `max_new_tokens` for that.
'''.encode()


def _json(value: Any) -> bytes:
  return (json.dumps(value, indent=2, ensure_ascii=False) + '\n').encode('utf-8')


def export_marian(params: Params, model_config: ModelConfig, tokenizer_model_path: str,
                  output_dir: str, *, source_lang: str, target_lang: str, beam_size: int = 4,
                  alpha: float = 0.6, max_input_length: int = 1024,
                  extra_length: int = 50, trained_from: str = 'a checkpoint') -> None:
  """Writes the MarianMT folder `output_dir` (new or empty) for `params` of `model_config` and
  the SentencePiece model at `tokenizer_model_path`, whole or not at all. max_input_length and
  extra_length: config.max_decode_input_length and config.decode_extra_length."""
  check_exportable(model_config)
  check_output_dir(output_dir)
  with open(tokenizer_model_path, 'rb') as f:
    sentencepiece_model = f.read()
  pieces = spm.SentencePieceProcessor(model_proto=sentencepiece_model).get_piece_size()
  if pieces != model_config.vocab_size:
    raise errors.UserError(f'config.vocab_size={model_config.vocab_size}, but '
                           f'{tokenizer_model_path} has {pieces} pieces')
  max_positions = max_input_length + extra_length
  state = marian_state_dict(params, model_config, max_positions=max_positions)
  contents = {
      'config.json': _json(marian_config(model_config, max_positions=max_positions)),
      'generation_config.json': _json(generation_config(
          beam_size=beam_size, alpha=alpha, max_new_tokens=max_positions)),
      'model.safetensors': safetensors.numpy.save(state, metadata={'format': 'pt'}),
      **tokenizer_files(sentencepiece_model, source_lang=source_lang, target_lang=target_lang,
                        max_input_length=max_input_length),
      'README.md': model_card(model_config, source_lang=source_lang, target_lang=target_lang,
                              trained_from=trained_from, max_new_tokens=max_positions)}
  write_folder(contents, output_dir)


def check_output_dir(output_dir: str) -> None:
  """An export never mixes with other files: `output_dir` is new, or an empty folder; not a
  symbolic link, which the export, written beside it and renamed into place, would replace."""
  if os.path.islink(output_dir):
    raise errors.UserError(f'--output={output_dir}: a symbolic link; name the folder it points '
                           f'to ({os.path.realpath(output_dir)}) or a new one')
  if os.path.isdir(output_dir) and os.listdir(output_dir):
    raise errors.UserError(f'--output={output_dir}: exists and is not empty; name a new or '
                           'empty folder')
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise errors.UserError(f'--output={output_dir}: exists and is not a folder')


def write_folder(contents: dict[str, bytes], output_dir: str) -> None:
  """Writes {name: bytes} as the folder `output_dir`, whole or not at all (publish_folder)."""
  def fill(folder: str) -> None:
    for name, blob in contents.items():
      with open(os.path.join(folder, name), 'wb') as f:
        f.write(blob)
  publish_folder(fill, output_dir)


def publish_folder(fill: Callable[[str], None], output_dir: str) -> None:
  """Has `fill` write into a temporary folder beside `output_dir`, then renames it into place
  (files.publish): a crash or a full disk leaves no half-written export behind."""
  parent = os.path.dirname(os.path.abspath(output_dir))
  with files.disk_write_errors(output_dir, 'the export'):
    os.makedirs(parent, exist_ok=True)
    files.sweep_temp_dirs(parent, by_age=False)  # a killed export's leftovers
    tmp_dir = files.make_temp_dir(parent)
    try:
      fill(tmp_dir)
      if os.path.isdir(output_dir) and not os.listdir(output_dir):
        os.rmdir(output_dir)  # an empty folder given as --output is replaced
      published = files.publish(tmp_dir, output_dir)
    finally:
      shutil.rmtree(tmp_dir, ignore_errors=True)  # nothing there once published
  if not published:
    raise errors.UserError(f'--output={output_dir}: another process wrote it meanwhile')


def load_for_export(config: ml_collections.ConfigDict, workdir: str, model_config: ModelConfig,
                    ) -> tuple[pipeline.Vocabulary, params_lib.Loaded]:
  """The run's vocabulary, and the parameters translate would use (config.decode_params at
  config.restore_step), checked against `model_config`: what every export format writes."""
  tokenizer = pipeline.load_tokenizer(config, workdir)
  loaded = params_lib.load_params(workdir, which=config.decode_params, step=config.restore_step)
  params_lib.check_params_match(loaded.params, config, model_config, loaded.source, workdir)
  return tokenizer, loaded


def export_run(config: ml_collections.ConfigDict, workdir: str, output_dir: str) -> None:
  """--mode=export: the parameters translate would use (config.decode_params at
  config.restore_step) and the run's vocabulary, as a MarianMT folder at `output_dir`."""
  check_output_dir(output_dir)
  rules.validate(config, 'export')
  model_config = ModelConfig.from_config(config)
  check_exportable(model_config)
  if config.dataset == 'synthetic':
    raise errors.UserError("config.dataset='synthetic': its ids have no SentencePiece model, "
                           'which MarianTokenizer needs; only runs trained on text export')
  tokenizer, loaded = load_for_export(config, workdir, model_config)
  if jax.process_index() != 0:  # one writer, however many processes loaded the parameters
    return
  export_marian(loaded.params, model_config, tokenizer.model_path, output_dir,
                source_lang=config.source_lang, target_lang=config.target_lang,
                beam_size=config.beam_size, alpha=config.beam_alpha,
                max_input_length=config.max_decode_input_length,
                extra_length=config.decode_extra_length, trained_from=loaded.source)
  logging.info('Exported the parameters of %s as a MarianMT model to %s', loaded.source, output_dir)

