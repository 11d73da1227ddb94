"""`--mode=export --config.export_format=ctranslate2`: a trained run as CTranslate2 models
for fast CPU inference (docs/export.md).

`--output=DIR2` gets two models of the same parameters, `float32/` and `int8/` (QUANTIZATIONS),
each written by CTranslate2's own converter (`ctranslate2.converters.Converter.convert`) from a
`ctranslate2.specs.TransformerSpec` filled here, each with the run's SentencePiece model
(`spm.model`) beside its `model.bin`, and a README.md saying how to translate with them. Only
the spec's public attributes are set; nothing of CTranslate2's is patched.

The spec is this paper's Transformer: post-LN layers (`pre_norm=False`: LayerNorm(x +
Sublayer(x)), §3.1), ReLU (§3.3), embeddings ×√d_model (§3.4, the spec's default
`scale_embeddings`), one matrix for both embeddings and the pre-softmax projection (§3.4),
positions added to the embeddings (§3.5), and our layer-norm ε (`layer_norm_epsilon`). The
parameters map one to one (m = d_model, v = vocabulary, h heads of d = d_k = d_v = m / h,
P positions; CTranslate2's linear weights are [out, in]):

  ours: params[...]                          the spec's attribute
  shared_embedding/embedding [v, m]          {encoder.embeddings[0], decoder.embeddings}.weight
                                               and decoder.projection.weight (no bias): the
                                               converter stores the one matrix once
  sinusoidal_positions(0..P-1) [P, m], or    {encoder,decoder}.position_encodings.encodings
    learned_positions/embedding (row E)        [P, m], our table as it is (no permutation)
  L/self_attention/{query,key,value}/kernel  L'.self_attention.linear[0].weight [3m, m] =
    [m, h, d]                                  the three kernels.reshape(m, h·d).T stacked
                                               (q, k, v)
  L/self_attention/out/kernel [h, d, m]      L'.self_attention.linear[1].weight [m, h·d]
  D/cross_attention/query/kernel             D'.attention.linear[0].weight [m, m]
  D/cross_attention/{key,value}/kernel       D'.attention.linear[1].weight [2m, m] (k, v)
  D/cross_attention/out/kernel               D'.attention.linear[2].weight
  (no attention biases, as tensor2tensor)    (none: the spec's biases are optional)
  L/ffn/w_1/kernel [m, d_ff], bias [d_ff]    L'.ffn.linear_0.weight = kernel.T, .bias = bias
  L/ffn/w_2/kernel [d_ff, m], bias [m]       L'.ffn.linear_1.weight = kernel.T, .bias = bias
  L/{attention,self_attention}_sublayer/     L'.self_attention.layer_norm.{gamma, beta}
    layer_norm/{scale, bias}
  D/cross_attention_sublayer/layer_norm      D'.attention.layer_norm
  L/ffn_sublayer/layer_norm                  L'.ffn.layer_norm
where L is encoder/layer_i (E) or decoder/layer_i (D), L' the spec's encoder.layer[i] (E') or
decoder.layer[i] (D'). Heads: CTranslate2 cuts a projection's m outputs into h heads of d
in order, as our kernel's [h, d] axes read, and scales queries by 1/√d, our 1/√d_k.

Tokens: the vocabulary is the run's pieces in id order (the synthetic task's: its ids
written out, EOS '</s>'). `decoder_start_token` is our PAD piece, the start symbol of §3.1
(model.shift_right): the decoder's first input is that token's trained embedding row, not
the zero vector of CTranslate2's Marian route (`start_from_zero_embedding` stays False).
`add_source_eos`: a caller gives a sentence's pieces and the model appends EOS, as our
encoder sees it. What CTranslate2 decodes otherwise than we do, and the options that come
closest (`decoding_options`): the README.md this writes, and docs/export.md.

Not representable, refused naming the key: d_k or d_v other than d_model / h (Table 3 row B):
the spec's heads split d_model.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from t2t_jax.apps import export
from t2t_jax.config import rules
from t2t_jax.data import tokenizer as tokenizer_lib
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from t2t_jax.model.transformer import ModelConfig, sinusoidal_positions
from t2t_jax.platform import errors

Params = dict[str, Any]
# One model folder each, by CTranslate2's weight quantization of the same parameters.
QUANTIZATIONS = ('float32', 'int8')
SENTENCEPIECE = 'spm.model'  # the run's vocabulary, in each model folder
LAYER_NORM_EPSILON = 1e-6  # transformer.SubLayer's (tensor2tensor's)
# A layer's attentions: (our attention, our sub-layer holding its layer norm, the spec's).
ENCODER_ATTENTION = (('self_attention', 'attention_sublayer', 'self_attention'),)
DECODER_ATTENTION = (('self_attention', 'self_attention_sublayer', 'self_attention'),
                     ('cross_attention', 'cross_attention_sublayer', 'attention'))


def ctranslate2_modules() -> Any:
  """The ctranslate2 package with its specs and converters, or the one-line error naming the
  extra that installs it."""
  try:
    # The extra `ctranslate2`; its converters import torch where installed (seconds).
    import ctranslate2  # noqa: PLC0415
    import ctranslate2.converters  # noqa: PLC0415
    import ctranslate2.specs  # noqa: PLC0415
  except ImportError as e:
    raise errors.UserError(f"--config.export_format=ctranslate2 needs the extra 'ctranslate2' "
                           f"({e.name} is missing): pip install -e '.[ctranslate2]'") from None
  return ctranslate2


def check_convertible(model_config: ModelConfig) -> None:
  """Raises errors.UserError naming the config.model key a TransformerSpec cannot represent."""
  c = model_config
  for key, size in (('d_k', c.key_size), ('d_v', c.value_size)):
    if size * c.num_heads != c.d_model:
      raise errors.UserError(
          f'config.model.{key}={size}: CTranslate2\'s Transformer heads are d_model / '
          f'num_heads = {c.d_model} / {c.num_heads} wide; only {key} = d_model / num_heads '
          'exports')


def position_table(params: Params, model_config: ModelConfig, side: str, *,
                   max_positions: int) -> np.ndarray:
  """[P, m] what §3.5 adds at positions 0..P-1 on `side`: our sinusoids (max_positions rows),
  or the side's learned table (Table 3 row E, max_len rows)."""
  if model_config.positional == 'sinusoidal':
    return np.asarray(sinusoidal_positions(jnp.arange(max_positions), model_config.d_model))
  return params[side]['input_embedding']['learned_positions']['embedding']


def _array(x: Any) -> np.ndarray:
  """A float32 copy of its own: the converter quantizes weights in place."""
  return np.array(x, np.float32, order='C', copy=True)


def _linear(spec: Any, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
  spec.weight = _array(weight)  # [out, in]
  if bias is not None:
    spec.bias = _array(bias)


def _layer_norm(spec: Any, p: Params) -> None:
  spec.gamma = _array(p['layer_norm']['scale'])
  spec.beta = _array(p['layer_norm']['bias'])


def _attention(spec: Any, kernels: Params, *, fused_qkv: bool) -> None:
  """Self-attention: Q, K, V as one [3m, m] projection; cross-attention: Q [m, m] from the
  decoder, K and V as one [2m, m] from the encoder's output (the spec's layouts)."""
  h, d, m = kernels['out']['kernel'].shape
  q, k, v = (kernels[name]['kernel'].reshape(m, h * d).T for name in ('query', 'key', 'value'))
  out = kernels['out']['kernel'].reshape(h * d, m).T  # [m, h·d]
  if fused_qkv:
    _linear(spec.linear[0], np.concatenate([q, k, v]))
  else:
    _linear(spec.linear[0], q)
    _linear(spec.linear[1], np.concatenate([k, v]))
  _linear(spec.linear[-1], out)


def _layer(spec: Any, p: Params, attentions: tuple[tuple[str, str, str], ...]) -> None:
  """One encoder or decoder layer's parameters into its spec (the table above)."""
  for ours, sublayer, theirs in attentions:
    _attention(getattr(spec, theirs), p[ours], fused_qkv=ours == 'self_attention')
    _layer_norm(getattr(spec, theirs).layer_norm, p[sublayer])
  _linear(spec.ffn.linear_0, p['ffn']['w_1']['kernel'].T, p['ffn']['w_1']['bias'])
  _linear(spec.ffn.linear_1, p['ffn']['w_2']['kernel'].T, p['ffn']['w_2']['bias'])
  _layer_norm(spec.ffn.layer_norm, p['ffn_sublayer'])


def transformer_spec(params: Params, model_config: ModelConfig, tokens: Sequence[str], *,
                     max_positions: int) -> Any:
  """A ctranslate2.specs.TransformerSpec holding `params` (the table above), its vocabulary
  `tokens` (our ids' pieces, in order), sinusoid tables of `max_positions` rows."""
  check_convertible(model_config)
  specs = ctranslate2_modules().specs
  c = model_config
  params = jax.tree_util.tree_map(np.asarray, params)
  spec = specs.TransformerSpec.from_config(
      c.num_layers, c.num_heads, pre_norm=False, activation=specs.Activation.RELU)
  embedding = params['shared_embedding']['embedding']  # [v, m]
  spec.encoder.embeddings[0].weight = _array(embedding)
  spec.decoder.embeddings.weight = _array(embedding)
  spec.decoder.projection.weight = _array(embedding)  # the logits are y Eᵀ, §3.4
  spec.decoder.start_from_zero_embedding = False  # our start symbol's trained row
  for side, attention in (('encoder', ENCODER_ATTENTION), ('decoder', DECODER_ATTENTION)):
    side_spec = getattr(spec, side)
    side_spec.position_encodings.encodings = _array(
        position_table(params, c, side, max_positions=max_positions))
    for i, layer_spec in enumerate(side_spec.layer):
      _layer(layer_spec, params[side][f'layer_{i}'], attention)
  tokens = list(tokens)
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens)
  spec.config.unk_token, spec.config.eos_token = tokens[UNK_ID], tokens[EOS_ID]
  spec.config.bos_token = spec.config.decoder_start_token = tokens[PAD_ID]  # §3.1's start
  spec.config.add_source_eos = True  # our encoder's input ends with EOS
  spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
  return spec


# Beam search: ours stops a sentence when no live hypothesis can beat its best finished one,
# CTranslate2's at beam_size × patience finished ones; 2 lets the longer ones finish too.
PATIENCE = 2


def length_penalty_exponent(alpha: float, length: float) -> float:
  """x such that |Y|^x changes as our ((5 + |Y|) / 6)^α (GNMT, §6.1) near |Y| = length:
  equal logarithmic slopes, x / L = α / (5 + L), so hypotheses of about that length rank
  alike; CTranslate2 divides log P by |Y|^x (EOS included, as ours)."""
  return alpha * length / (5.0 + length)


def decoding_options(lengths: Sequence[int], banned: Sequence[str], *, beam_size: int,
                     alpha: float, max_input_length: int, extra_length: int) -> dict[str, Any]:
  """`Translator.translate_batch`'s options closest to our search (§6.1) for a batch of
  sources of `lengths` pieces (EOS not counted): output limits are per call where ours are per
  sentence, so the longest's (pieces + extra_length before EOS); the length penalty as
  length_penalty_exponent at the batch's mean output length, taken as its mean source length
  + EOS; `banned` pieces (those of ids that decode to no text, PAD and UNK) suppressed before
  its softmax where ours are after ours."""
  typical = sum(lengths) / max(len(lengths), 1) + 1
  return {'beam_size': beam_size, 'patience': PATIENCE,
          'length_penalty': length_penalty_exponent(alpha, typical),
          'max_input_length': max_input_length,
          'max_decoding_length': max(lengths, default=0) + extra_length,
          'min_decoding_length': 0,  # EOS may come first, as ours (its default bans it there)
          'suppress_sequences': [[piece] for piece in banned]}


def model_card(model_config: ModelConfig, banned: Sequence[str], *, sentencepiece: bool,
               source_lang: str, target_lang: str, trained_from: str, beam_size: int,
               alpha: float, max_input_length: int, extra_length: int) -> bytes:
  """DIR2/README.md: what the models are, and how to translate with them as t2t_jax does
  (decoding_options, spelt out)."""
  m = model_config
  if sentencepiece:
    setup = ('import sentencepiece as spm\n\n'
             "PATH = 'float32'  # or 'int8', with compute_type='int8'\n"
             f"sp = spm.SentencePieceProcessor(model_file=f'{{PATH}}/{SENTENCEPIECE}')")
    encode, decode = 'sp.encode(s, out_type=str)', 'sp.decode(r.hypotheses[0])'
    example = 'A sentence.'
  else:  # the synthetic task: its text is its ids
    setup = "\nPATH = 'float32'  # or 'int8', with compute_type='int8'"
    encode, decode, example = 's.split()', "' '.join(r.hypotheses[0])", '5 6 7'
  suppressed = [[piece] for piece in banned]
  return f'''# Transformer {source_lang}→{target_lang}, trained with t2t_jax, as CTranslate2 models

The Transformer of *Attention Is All You Need* (Vaswani et al., 2017), trained with t2t_jax:
{m.num_layers} encoder and {m.num_layers} decoder layers, d_model {m.d_model}, d_ff {m.d_ff},
{m.num_heads} heads, a vocabulary of {m.vocab_size} pieces; the parameters of `{trained_from}`
of its training run, in `float32/` and `int8/` (weights quantized by CTranslate2).

```python
import ctranslate2
{setup}
translator = ctranslate2.Translator(PATH, compute_type='float32', intra_threads=2)
batch = [{encode} for s in [{example!r}]]
length = sum(map(len, batch)) / len(batch) + 1  # a typical output's, EOS included
results = translator.translate_batch(
    batch, beam_size={beam_size}, patience={PATIENCE},
    length_penalty={alpha} * length / (5 + length),
    max_input_length={max_input_length},
    max_decoding_length=max(map(len, batch)) + {extra_length}, min_decoding_length=0,
    suppress_sequences={suppressed!r})
print([{decode} for r in results])
```

Greedy decoding (`beam_size=1`) gives t2t_jax's outputs. Beam search: CTranslate2 ranks
hypotheses by log P / |Y|^x, t2t_jax (§6.1) by log P / ((5 + |Y|) / 6)^{alpha}; x above makes
both change alike near the batch's typical length. The output limit is one per call, where
t2t_jax's is each sentence's own (its pieces + {extra_length} before EOS), and
`suppress_sequences` bans tokens before the softmax where t2t_jax bans them after.
'''.encode()


def convert(make_spec: Callable[[], Any], model_dir: str, quantization: str) -> None:
  """CTranslate2's converter (validate, quantize, save) of a fresh `make_spec()` into the new
  folder `model_dir`: quantizing changes a spec in place, so each model gets its own."""
  converters = ctranslate2_modules().converters

  class SpecConverter(converters.Converter):
    def _load(self) -> Any:  # the converter's one hook: the spec to save
      return make_spec()

  SpecConverter().convert(model_dir, quantization=quantization)


def export_ctranslate2(params: Params, model_config: ModelConfig, tokens: Sequence[str],
                       banned_ids: Sequence[int], output_dir: str, *,
                       sentencepiece_path: str | None = None, source_lang: str = 'en',
                       target_lang: str = 'de', beam_size: int = 4, alpha: float = 0.6,
                       max_input_length: int = 1024, extra_length: int = 50,
                       trained_from: str = 'a checkpoint') -> None:
  """Writes `output_dir` (new or empty) whole or not at all: a CTranslate2 model of `params`
  per QUANTIZATIONS, each with the SentencePiece model at `sentencepiece_path` (None: the
  synthetic task's ids), and README.md. tokens: our ids' pieces; banned_ids: ids our search
  never emits; max_input_length and extra_length: config.max_decode_input_length and
  config.decode_extra_length."""
  check_convertible(model_config)
  export.check_output_dir(output_dir)
  if len(tokens) != model_config.vocab_size or len(set(tokens)) != len(tokens):
    raise errors.UserError(f'config.vocab_size={model_config.vocab_size}, but the vocabulary '
                           f'has {len(set(tokens))} distinct pieces of {len(tokens)}')
  max_positions = max_input_length + extra_length

  def make_spec() -> Any:
    spec = transformer_spec(params, model_config, tokens, max_positions=max_positions)
    if sentencepiece_path is not None:
      spec.register_file(sentencepiece_path, SENTENCEPIECE)
    return spec

  card = model_card(model_config, [tokens[i] for i in banned_ids],
                    sentencepiece=sentencepiece_path is not None, source_lang=source_lang,
                    target_lang=target_lang, trained_from=trained_from, beam_size=beam_size,
                    alpha=alpha, max_input_length=max_input_length, extra_length=extra_length)

  def fill(folder: str) -> None:
    for quantization in QUANTIZATIONS:
      convert(make_spec, os.path.join(folder, quantization), quantization)
    with open(os.path.join(folder, 'README.md'), 'wb') as f:
      f.write(card)
  export.publish_folder(fill, output_dir)


def export_run(config: ml_collections.ConfigDict, workdir: str, output_dir: str) -> None:
  """--mode=export with config.export_format='ctranslate2': the parameters translate would use
  (config.decode_params at config.restore_step) and the run's vocabulary, as CTranslate2
  models at `output_dir`."""
  export.check_output_dir(output_dir)
  rules.validate(config, 'export')
  model_config = ModelConfig.from_config(config)
  check_convertible(model_config)
  ctranslate2_modules()  # a missing extra before seconds of loading
  tokenizer, loaded = export.load_for_export(config, workdir, model_config)
  if jax.process_index() != 0:  # one writer, however many processes loaded the parameters
    return
  sentencepiece_path = (tokenizer.model_path if isinstance(tokenizer, tokenizer_lib.Tokenizer)
                        else None)
  export_ctranslate2(loaded.params, model_config, tokenizer.pieces(range(model_config.vocab_size)),
                     tokenizer.banned_ids(sampling=False), output_dir,
                     sentencepiece_path=sentencepiece_path, source_lang=config.source_lang,
                     target_lang=config.target_lang, beam_size=config.beam_size,
                     alpha=config.beam_alpha, max_input_length=config.max_decode_input_length,
                     extra_length=config.decode_extra_length, trained_from=loaded.source)
  logging.info('Exported the parameters of %s as CTranslate2 models to %s', loaded.source,
               output_dir)
