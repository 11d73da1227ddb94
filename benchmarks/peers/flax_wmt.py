"""Peer benchmark: the training step of Flax's official WMT example, on this project's shapes.

  python benchmarks/peers/flax_wmt.py [--configs base,demo] [--steps 5]

What it reproduces. google/flax `examples/wmt` (Apache License 2.0, Copyright The Flax
Authors): the model of `models.py` and the training step, loss, optimizer and learning-rate
schedule of `trainer.py`, with the defaults of `configs/default.py`. This file re-implements
them standalone from reading them, with the same flax.linen building blocks, as a peer to
time benchmarks/train_step.py against on the same shapes (the configs' model sizes,
benchmarks/common.py), under the same XLA flags (`xla.configure_cpu()`), with
benchmarks/train_step.py's random batch and timing; nothing of t2t_jax's model, loss or
optimizer is used. Flax's example is not at hand to compare with: tests/test_benchmarks.py
runs this step at a tiny size and checks its parameter count against t2t_jax's (below),
its metrics against t2t_jax's losses on the same logits, its smoothed loss and learning-rate
schedule against their formulas, and its JSON line. What it re-implements:

  * model: shared `nn.Embed` (init N(0, 1)) for source, target and output; the output
    logits are `embed.attend(y) / sqrt(emb_dim)`; a fixed sinusoidal table of max_len
    positions (sines in the first half of the features, cosines in the second);
    pre-LayerNorm residual blocks (x + Dropout(Sublayer(LayerNorm(x)))) with a final
    LayerNorm on the encoder and on the decoder; `nn.MultiHeadDotProductAttention` with
    `use_bias=False, broadcast_dropout=False, dropout_rate=attention_dropout_rate`; the
    MlpBlock Dense-ReLU-Dropout-Dense-Dropout (xavier-uniform kernels, N(0, 1e-6) biases);
    dropout after the embeddings; padding masks (ids > 0) on both sides, causal on the
    decoder's self-attention;
  * step: weights = targets > 0; the dropout key `fold_in(dropout_rng, state.step)`;
    `jax.value_and_grad` of the label-smoothed cross entropy (one-hot soft targets, minus
    the normalizing constant) summed and divided by the weight sum; `apply_gradients` with
    `optax.adamw(b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0)` on their schedule (linear
    warm-up over 1000 steps to 0.002, then rsqrt); then their metrics (cross entropy without
    smoothing, accuracy, denominator, learning rate), which take a second log-softmax over
    the logits;
  * compilation: they `jax.pmap` the step over the local devices with `donate_argnums=(0,)`;
    on one device that is this `jax.jit` with the state donated, and their
    `lax.pmean`/`lax.psum` over the device axis are identities, so they are left out.
    Parameters are initialised as theirs: `jax.jit(model.init)` with the deterministic
    config on ones of shape [rows, max_len]; the dropout key is `split(key(seed))`'s first
    half, split once per device.

Left out, as no part of a float32 training step on unpacked data: packed examples
(segmentation/position fields), fast decoding and its cache, fp8, the float16 dynamic
loss scale (their TrainState carries `dynamic_scale=None` in float32), unshared embeddings,
learned positions.

How it differs from t2t_jax's model (t2t_jax/model/transformer.py), which follows the paper:
  * pre-LN blocks plus two final LayerNorms, where t2t_jax is post-LN (LayerNorm(x +
    Dropout(Sublayer(x))), §3.1) without final norms;
  * attention dropout (0.1, a mask per head and query: broadcast_dropout=False) on the
    attention weights; t2t_jax drops only residuals and embeddings (§5.4);
  * the embedding is N(0, 1) and unscaled going in, and the logits are divided by
    sqrt(d_model); t2t_jax initialises N(0, 1/d_model), multiplies by sqrt(d_model)
    going in (§3.4) and leaves the logits as they are;
  * the decoder's self-attention also masks padded targets (t2t_jax needs only the causal
    mask), and every mask is a float [b, 1, q, k] array turned into -inf by flax;
  * the sinusoids are concatenated (all sines, then all cosines) with frequencies
    10000^(-i / (d/2 - 1)), where t2t_jax interleaves them as in §3.5;
  * no attention biases in either; both have FFN biases (flax's drawn N(0, 1e-6));
  * the loss also computes flax's training metrics, an extra log-softmax and argmax over the
    [b, t, vocab] logits each step.
Parameter count: the same as t2t_jax's except the two final LayerNorms (4 · d_model).

Output: one JSON line per config, as benchmarks/train_step.py prints (same batch: random
ids in [3, vocab), no padding; same timing: compile once, one warm-up step, the median of
--steps), with "peer": "flax_examples_wmt". `prepare(config_name)` returns the compiled,
warmed-up step as a benchmarks/train_step.py Runner, for another script to time beside ours
(train_step.py --peer, accelerator.py).
"""
import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
import common  # benchmarks/common.py: the repository on sys.path

common.start(__name__)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import train_step as ours  # benchmarks/train_step.py: its batch and timing
from flax import struct
from flax.training import common_utils, train_state


def shape_of(config_name: str) -> dict:
  """This project's shape for config `config_name` in the example's names: the model of
  common.CONFIGS and benchmarks/train_step.py's batch, rows × length source tokens and as
  many target tokens."""
  dims = common.model_dims(config_name)
  rows, length = ours.SHAPES[config_name]
  return dict(vocab_size=dims['vocab_size'], emb_dim=dims['d_model'],
              num_heads=dims['num_heads'], mlp_dim=dims['d_ff'],
              num_layers=dims['num_layers'], rows=rows, length=length)


# Flax's configs/default.py, for what this project's shapes do not set.
LEARNING_RATE = 0.002
WARMUP_STEPS = 1000
LABEL_SMOOTHING = 0.1
WEIGHT_DECAY = 0.0
MAX_LEN = 256  # max(max_target_length, max_eval_target_length)
SEED = 0


@struct.dataclass
class TransformerConfig:
  """The hyper-parameters the example threads through every module."""
  vocab_size: int
  emb_dim: int = 512
  num_heads: int = 8
  num_layers: int = 6
  qkv_dim: int = 512
  mlp_dim: int = 2048
  max_len: int = 2048
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  deterministic: bool = False
  dtype: Any = jnp.float32
  kernel_init: Callable = nn.initializers.xavier_uniform()
  bias_init: Callable = nn.initializers.normal(stddev=1e-6)


def sinusoid_table(max_len: int, d_feature: int, min_scale: float = 1.0,
                   max_scale: float = 10000.0) -> np.ndarray:
  """[1, max_len, d]: sines in the first half of the features, cosines in the second,
  frequencies spaced geometrically from min_scale down to min_scale / max_scale."""
  half = d_feature // 2
  position = np.arange(max_len)[:, None]
  frequency = min_scale * np.exp(np.arange(half) * -np.log(max_scale / min_scale) / (half - 1))
  table = np.zeros((max_len, d_feature), np.float32)
  table[:, :half] = np.sin(position * frequency)
  table[:, half:2 * half] = np.cos(position * frequency)
  return table[None]


class AddPositionEmbs(nn.Module):
  """Adds the first `length` rows of the fixed sinusoid table (no parameters)."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x):
    table = sinusoid_table(self.config.max_len, x.shape[-1])
    return x + table[:, :x.shape[1], :]


class MlpBlock(nn.Module):
  """Dense(mlp_dim) → ReLU → Dropout → Dense(features) → Dropout."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    dense = functools.partial(nn.Dense, dtype=c.dtype, kernel_init=c.kernel_init,
                              bias_init=c.bias_init)
    features = x.shape[-1]
    h = nn.Dropout(rate=c.dropout_rate)(nn.relu(dense(c.mlp_dim)(x)),
                                        deterministic=c.deterministic)
    return nn.Dropout(rate=c.dropout_rate)(dense(features)(h), deterministic=c.deterministic)


def attention(c: TransformerConfig) -> nn.MultiHeadDotProductAttention:
  """The attention layer every block builds, with the example's arguments."""
  return nn.MultiHeadDotProductAttention(
      num_heads=c.num_heads, dtype=c.dtype, qkv_features=c.qkv_dim,
      kernel_init=c.kernel_init, bias_init=c.bias_init, use_bias=False,
      broadcast_dropout=False, dropout_rate=c.attention_dropout_rate,
      deterministic=c.deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LN: x + Dropout(SelfAttention(LN(x))), then x + Mlp(LN(x))."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, encoder_mask):
    c = self.config
    x = attention(c)(nn.LayerNorm(dtype=c.dtype)(inputs), mask=encoder_mask)
    x = nn.Dropout(rate=c.dropout_rate)(x, deterministic=c.deterministic) + inputs
    return x + MlpBlock(config=c)(nn.LayerNorm(dtype=c.dtype)(x))


class EncoderDecoder1DBlock(nn.Module):
  """Pre-LN: masked self-attention, encoder-decoder attention, Mlp; each residual."""
  config: TransformerConfig

  @nn.compact
  def __call__(self, targets, encoded, decoder_mask, encoder_decoder_mask):
    c = self.config
    x = attention(c)(nn.LayerNorm(dtype=c.dtype)(targets), mask=decoder_mask)
    x = nn.Dropout(rate=c.dropout_rate)(x, deterministic=c.deterministic) + targets
    y = attention(c)(nn.LayerNorm(dtype=c.dtype)(x), encoded, mask=encoder_decoder_mask)
    y = nn.Dropout(rate=c.dropout_rate)(y, deterministic=c.deterministic) + x
    return y + MlpBlock(config=c)(nn.LayerNorm(dtype=c.dtype)(y))


class Encoder(nn.Module):
  config: TransformerConfig
  shared_embedding: nn.Embed

  @nn.compact
  def __call__(self, inputs, encoder_mask):
    c = self.config
    x = self.shared_embedding(inputs.astype('int32'))
    x = AddPositionEmbs(config=c, name='posembed_input')(x)
    x = nn.Dropout(rate=c.dropout_rate)(x, deterministic=c.deterministic).astype(c.dtype)
    for layer in range(c.num_layers):
      x = Encoder1DBlock(config=c, name=f'encoderblock_{layer}')(x, encoder_mask)
    return nn.LayerNorm(dtype=c.dtype, name='encoder_norm')(x)


def shift_right(x):
  """Targets one position later, 0 first: the teacher-forced decoder inputs."""
  return jnp.pad(x, ((0, 0), (1, 0)), constant_values=x.dtype.type(0))[:, :-1]


class Decoder(nn.Module):
  config: TransformerConfig
  shared_embedding: nn.Embed

  @nn.compact
  def __call__(self, encoded, targets, decoder_mask, encoder_decoder_mask):
    c = self.config
    y = self.shared_embedding(shift_right(targets.astype('int32')))
    y = AddPositionEmbs(config=c, name='posembed_output')(y)
    y = nn.Dropout(rate=c.dropout_rate)(y, deterministic=c.deterministic).astype(c.dtype)
    for layer in range(c.num_layers):
      y = EncoderDecoder1DBlock(config=c, name=f'encoderdecoderblock_{layer}')(
          y, encoded, decoder_mask, encoder_decoder_mask)
    y = nn.LayerNorm(dtype=c.dtype, name='encoderdecoder_norm')(y)
    # logits_via_embedding: the embedding's transpose, scaled by 1/sqrt(d).
    return self.shared_embedding.attend(y.astype(jnp.float32)) / jnp.sqrt(y.shape[-1])


class Transformer(nn.Module):
  """share_embeddings=True, logits_via_embedding=True (configs/default.py)."""
  config: TransformerConfig

  def setup(self):
    c = self.config
    self.shared_embedding = nn.Embed(num_embeddings=c.vocab_size, features=c.emb_dim,
                                     embedding_init=nn.initializers.normal(stddev=1.0))
    self.encoder = Encoder(config=c, shared_embedding=self.shared_embedding)
    self.decoder = Decoder(config=c, shared_embedding=self.shared_embedding)

  def __call__(self, inputs, targets):
    dtype = self.config.dtype
    encoder_mask = nn.make_attention_mask(inputs > 0, inputs > 0, dtype=dtype)
    encoded = self.encoder(inputs, encoder_mask)
    decoder_mask = nn.combine_masks(
        nn.make_attention_mask(targets > 0, targets > 0, dtype=dtype),
        nn.make_causal_mask(targets, dtype=dtype))
    encoder_decoder_mask = nn.make_attention_mask(targets > 0, inputs > 0, dtype=dtype)
    logits = self.decoder(encoded, targets, decoder_mask, encoder_decoder_mask)
    return logits.astype(dtype)


def learning_rate_schedule(learning_rate: float, warmup_steps: int) -> optax.Schedule:
  """Linear warm-up from 0 to `learning_rate`, then learning_rate · sqrt(warmup / step)."""
  def rsqrt(count):
    return learning_rate * (count + warmup_steps) ** -0.5 * warmup_steps ** 0.5
  return optax.join_schedules(
      [optax.linear_schedule(0, learning_rate, warmup_steps), rsqrt], [warmup_steps])


def weighted_cross_entropy(logits, targets, weights, label_smoothing=0.0):
  """(sum of weighted label-smoothed cross entropy minus its minimum, sum of weights)."""
  vocab_size = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low_confidence = (1.0 - confidence) / (vocab_size - 1)
  # The entropy of the soft targets: the loss of a perfect prediction, subtracted.
  normalizing_constant = -(confidence * jnp.log(confidence) + (vocab_size - 1)
                           * low_confidence * jnp.log(low_confidence + 1e-20))
  soft_targets = common_utils.onehot(targets, vocab_size, on_value=confidence,
                                     off_value=low_confidence)
  loss = -jnp.sum(soft_targets * nn.log_softmax(logits), axis=-1) - normalizing_constant
  return (loss * weights).sum(), weights.sum()


def weighted_accuracy(logits, targets, weights):
  return (jnp.equal(jnp.argmax(logits, axis=-1), targets) * weights).sum()


class TrainState(train_state.TrainState):
  dynamic_scale: Any = None  # float16 loss scaling; None in float32, as here


def train_step(state: TrainState, batch: dict[str, jax.Array], dropout_rng: jax.Array, *,
               config: TransformerConfig, learning_rate_fn: optax.Schedule,
               label_smoothing: float) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update on unpacked examples (no segmentation/position fields)."""
  inputs, targets = batch['inputs'], batch['targets']
  weights = jnp.where(targets > 0, 1, 0).astype(jnp.float32)
  dropout_rng = jax.random.fold_in(dropout_rng, state.step)

  def loss_fn(params):
    logits = Transformer(config).apply({'params': params}, inputs, targets,
                                       rngs={'dropout': dropout_rng})
    loss, weight_sum = weighted_cross_entropy(logits, targets, weights, label_smoothing)
    return loss / weight_sum, logits

  (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  new_state = state.apply_gradients(grads=grads)
  # Their compute_metrics, called without label smoothing.
  loss, denominator = weighted_cross_entropy(logits, targets, weights)
  metrics = {'loss': loss, 'accuracy': weighted_accuracy(logits, targets, weights),
             'denominator': denominator, 'learning_rate': learning_rate_fn(state.step)}
  return new_state, metrics


def model_config(s: dict, dtype: Any = jnp.float32) -> TransformerConfig:
  """Their TransformerConfig for shape `s` (a `shape_of` dict); `dtype` their compute dtype."""
  return TransformerConfig(
      vocab_size=s['vocab_size'], emb_dim=s['emb_dim'], num_heads=s['num_heads'],
      num_layers=s['num_layers'], qkv_dim=s['emb_dim'], mlp_dim=s['mlp_dim'], max_len=MAX_LEN,
      dropout_rate=0.1, attention_dropout_rate=0.1, deterministic=False, dtype=dtype)


def create_state(config: TransformerConfig, rows: int) -> tuple[TrainState, jax.Array]:
  """Initial train state and the dropout key, drawn as their train_and_evaluate does."""
  rng, init_rng = jax.random.split(jax.random.key(SEED))
  model = Transformer(config.replace(deterministic=True))
  shape = (rows, MAX_LEN)  # (per_device_batch_size, max_target_length)
  variables = jax.jit(model.init)(init_rng, jnp.ones(shape, jnp.float32),
                                  jnp.ones(shape, jnp.float32))
  tx = optax.adamw(learning_rate=learning_rate_schedule(LEARNING_RATE, WARMUP_STEPS),
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=WEIGHT_DECAY)
  state = TrainState.create(apply_fn=model.apply, params=variables['params'], tx=tx,
                            dynamic_scale=None)
  dropout_rng = jax.random.split(rng, 1)[0]  # one device
  return state, dropout_rng


def compile_train_step(config: TransformerConfig) -> Callable:
  """The jitted step, the state donated (their pmap's donate_argnums=(0,))."""
  return jax.jit(
      functools.partial(train_step, config=config,
                        learning_rate_fn=learning_rate_schedule(LEARNING_RATE, WARMUP_STEPS),
                        label_smoothing=LABEL_SMOOTHING),
      donate_argnums=(0,))


def prepare(config_name: str, shape: dict | None = None, dtype: Any = jnp.float32,
            ) -> ours.Runner:
  """The step compiled and warmed up by one step, to be timed as benchmarks/train_step.py
  times ours (a Runner of it). `shape`: a dict like `shape_of(config_name)`, instead of it
  (benchmarks/accelerator.py's batches, the tests' tiny model); `dtype`: their compute
  dtype (bfloat16 on an accelerator, as their configs' use_bfloat16)."""
  shape = shape or shape_of(config_name)
  rows, length = shape['rows'], shape['length']
  config = model_config(shape, dtype)
  state, dropout_rng = create_state(config, rows)
  params = int(sum(x.size for x in jax.tree_util.tree_leaves(state.params)))
  batch = jax.device_put(ours.random_batch(rows, length, config.vocab_size))
  t0 = time.perf_counter()
  compiled = compile_train_step(config).lower(state, batch, dropout_rng).compile()
  compile_s = time.perf_counter() - t0
  fields = {'benchmark': 'train_step', 'peer': 'flax_examples_wmt', 'config': config_name,
            'params': params, 'dtype': jnp.dtype(dtype).name}
  runner = ours.Runner(fields, compiled, lambda state: compiled(state, batch, dropout_rng),
                       state, rows, length, compile_s)
  ours.timed_steps(runner, 1)  # warm-up
  return runner


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='base,demo')
  parser.add_argument('--steps', type=int, default=5)
  args = parser.parse_args()
  for name in args.configs.split(','):
    common.emit(ours.bench([prepare(name)], args.steps, rounds=1)[0])


if __name__ == '__main__':
  main()
