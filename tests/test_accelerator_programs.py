"""The programs a GPU and a TPU are given, checked on this CPU.

`jax.export` lowers a jitted function for another platform without its hardware, and
config 'auto' values resolve for that platform (ModelConfig.from_config(config, platform)),
so the StableHLO below is what `--config=experiments/wmt_ende_base.py` hands XLA on a GPU or
TPU: bfloat16, the plain 'xla' forms (kernels.py). Checked, for the base train step
(grad_accum_steps 1 and 2), the eval step and the beam search at small shapes:
  * no CPU form: nothing traced under kernels.CPU_SCOPE, no optimization_barrier;
  * every matmul bf16 × bf16, its result bf16, except the two numerically sensitive ones,
    float32: the pre-softmax logits and attention's Q·Kᵀ, forward;
  * the matmuls' FLOPs, summed from the program, equal to model.train_step_flops;
  * the train state donated (aliased to the new state).
The oracle for each is independent of the code under test: the program text itself, and
the architecture's closed-form count.
"""
from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest

from experiments import wmt_ende_base
from t2t_jax.decoding import batch_plan, decode
from t2t_jax.model import kernels
from t2t_jax.model.transformer import ModelConfig, Transformer, train_step_flops
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.training import optim, train_step

PLATFORMS = ('cuda', 'tpu')
ROWS, LENGTH = 8, 16  # a small batch: 8 × 16 source and target tokens
# The forward products whose results stay float32 (einsum subscripts' outputs, see transformer.py):
# attention logits (training: bhqk; decoding over the cache: bhqn and the own key's bhq) and
# the tied pre-softmax logits (btv).
F32_OUTPUTS = ('->bhqk', '->bhqn', '->bhq', '->btv')

DOT = re.compile(r'stablehlo\.dot_general %\S+, %\S+, (?:batching_dims = \[[\d, ]*\] x '
                 r'\[[\d, ]*\], )?contracting_dims = \[([\d, ]*)\] x \[[\d, ]*\][^:]*: '
                 r'\(tensor<([^>]*)>, tensor<([^>]*)>\) -> tensor<([^>]*)> loc\((#loc\d+)\)')
LOC = re.compile(r'^(#loc\d+) = loc\("([^"]*)"', re.M)


class Dot(NamedTuple):
  name: str  # the op's name in the program: module path, einsum subscripts, jvp/transpose
  dtypes: tuple[str, str, str]  # lhs, rhs, result
  flops: int


def _shape(tensor: str) -> tuple[list[int], str]:
  *dims, dtype = tensor.split('x')
  return [int(d) for d in dims], dtype


def dots(text: str) -> list[Dot]:
  """Every dot_general of a StableHLO module, with its name and 2·result·contraction FLOPs."""
  names = dict(LOC.findall(text))
  found = []
  for contract, lhs, rhs, result, loc in DOT.findall(text):
    (lhs_dims, lhs_dtype), (_, rhs_dtype), (out_dims, out_dtype) = (
        _shape(lhs), _shape(rhs), _shape(result))
    k = math.prod(lhs_dims[int(i)] for i in contract.split(',') if i.strip())
    found.append(Dot(names.get(loc, ''), (lhs_dtype, rhs_dtype, out_dtype),
                     2 * math.prod(out_dims) * k))
  return found


def base_config(platform: str) -> tuple[ModelConfig, object]:
  config = wmt_ende_base.get_config()
  return ModelConfig.from_config(config, platform), config


def abstract_state(c: ModelConfig, tx) -> train_step.TrainState:
  """The train state's shapes and dtypes, nothing allocated."""
  def init():
    ids = jnp.ones((1, 1), jnp.int32)
    params = Transformer(c).init(jax.random.PRNGKey(0), ids, ids)['params']
    return train_step.TrainState(step=jnp.array(0, jnp.int32), params=params,
                                 opt_state=tx.init(params), rng=jax.random.PRNGKey(0))
  return jax.eval_shape(init)


def batch_shapes(rows: int = ROWS, length: int = LENGTH, packed: bool = False) -> dict:
  """A batch's arrays; packed rows (data/packing.py) with each side's segments and positions."""
  keys = ('inputs', 'targets') + (tuple(train_step.PACKED_ARGUMENTS) if packed else ())
  return {k: jax.ShapeDtypeStruct((rows, length), jnp.int32) for k in keys}


@functools.cache
def train_program(platform: str, grad_accum_steps: int, packed: bool = False) -> str:
  c, config = base_config(platform)
  tx = optim.make_optimizer(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  train, _ = train_step.compile_steps(c, tx, config.label_smoothing, mesh,
                                      grad_accum_steps=grad_accum_steps)
  return jax.export.export(train, platforms=[platform])(abstract_state(c, tx),
                                                        batch_shapes(packed=packed)).mlir_module()


def assert_accelerator_forms(text: str) -> list[Dot]:
  """No CPU form; bf16 products with float32 results only where F32_OUTPUTS says."""
  assert kernels.CPU_SCOPE not in text
  assert 'optimization_barrier' not in text
  found = dots(text)
  assert found
  for dot in found:
    forward_f32 = 'transpose(' not in dot.name and dot.name.split('/')[-2].endswith(F32_OUTPUTS)
    assert dot.dtypes == ('bf16', 'bf16', 'f32' if forward_f32 else 'bf16'), dot
  return found


@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('grad_accum_steps,packed', [(1, False), (2, False), (1, True)])
def test_the_train_step_for_accelerators(platform, grad_accum_steps, packed):
  """Packed rows' masks change no product: the same FLOPs, every row attended whole."""
  text = train_program(platform, grad_accum_steps, packed)
  found = assert_accelerator_forms(text)
  outputs = {dot.name.split('/')[-2] for dot in found if dot.dtypes[2] == 'f32'}
  assert outputs == {'bqhd,bkhd->bhqk', 'btm,vm->btv'}  # both float32, forward
  c, _ = base_config(platform)
  # With micro-batches the products run in a loop whose body is one micro-batch's.
  assert sum(d.flops for d in found) * grad_accum_steps == train_step_flops(
      c, ROWS, LENGTH, LENGTH)
  # The state's every array aliased to the new state's: donated, no second copy.
  leaves = len(jax.tree_util.tree_leaves(abstract_state(c, optim.make_optimizer(
      wmt_ende_base.get_config()))))
  main = text[text.index('func.func public @main'):]
  main = main[:main.index('{\n')]
  assert len(re.findall(r'tf\.aliasing_output|jax\.buffer_donor', main)) == leaves


@pytest.mark.parametrize('platform', PLATFORMS)
def test_the_eval_step_for_accelerators(platform):
  c, config = base_config(platform)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  evaluate = train_step.compile_eval_step(c, config.label_smoothing, mesh)
  params = abstract_state(c, optim.make_optimizer(config)).params
  text = jax.export.export(evaluate, platforms=[platform])(params, batch_shapes()).mlir_module()
  found = assert_accelerator_forms(text)
  assert 3 * sum(d.flops for d in found) == train_step_flops(c, ROWS, LENGTH, LENGTH)


SEARCH_ROWS, SEARCH_LENGTH, SEARCH_EXTRA = 4, 12, 10  # the search's sources, T = 22


def search_program(platform: str, dtype: str | None = None) -> str:
  """The beam search as batch_plan runs it, on one device, for `platform`."""
  c, config = base_config(platform)
  c = c.replace(deterministic=True, dtype=dtype or c.dtype)
  config.decode_extra_length = SEARCH_EXTRA
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  decoder = batch_plan.make_sharded_decoder(c, config, mesh)
  params = abstract_state(c, optim.make_optimizer(config)).params
  src = jax.ShapeDtypeStruct((SEARCH_ROWS, SEARCH_LENGTH), jnp.int32)
  return jax.export.export(decoder, platforms=[platform])(
      params, src, jax.ShapeDtypeStruct((), jnp.float32)).mlir_module()


def cache_layouts(text: str, platform: str) -> dict[str, bool]:
  """Which layouts of the self-attention cache (model/cache.py) the search program's arrays
  have, at its cache lengths (16, 22): 'plain' [b, k, T, h, d]; the CPU's keys [b, h, d, k, T]
  and values [b, h, k, T, d]. (The encoder's keys and values as the CPU stores them, [b, h,
  d, s], are the shape of the encoder's own attention output before its transpose: the
  products' names tell those apart.)"""
  c, config = base_config(platform)
  b, k, h, d = SEARCH_ROWS, config.beam_size, c.num_heads, c.key_size
  lengths = decode.segment_lengths(SEARCH_LENGTH + SEARCH_EXTRA)
  has = lambda *dims: f'tensor<{"x".join(map(str, dims))}x' in text  # noqa: E731
  return {'plain': all(has(b, k, t, h, d) for t in lengths),
          'cpu': any(has(b, h, d, k, t) or has(b, h, k, t, d) for t in lengths)}


@pytest.mark.parametrize('platform', PLATFORMS)
def test_the_beam_search_for_accelerators(platform):
  """Also its cache: the plain layout (flax's), none of the CPU's."""
  text = search_program(platform)
  found = assert_accelerator_forms(text)
  # No host round trip in the loop: a step's cost on a GPU is its kernels alone.
  assert not re.search(r'callback|infeed|outfeed|stablehlo\.(send|recv)', text)
  # Every attention, the decoder's over its cache and the encoder's keys too, is §3.2.1's
  # [b, k, h, d] product (the CPU's read [b, h, d, k]: 'bhdk', 'bhdn', and its own key apart).
  assert {d.name.split('/')[-2] for d in found if d.dtypes[2] == 'f32'} == {
      'bqhd,bkhd->bhqk', 'btm,vm->btv'}
  assert cache_layouts(text, platform) == {'plain': True, 'cpu': False}


def test_the_cpu_program_has_the_cpu_forms_these_tests_look_for():
  """The same checks see the CPU forms where they are: in the program 'auto' gives a CPU
  (so an accelerator program that had them would fail above)."""
  c, config = base_config('cpu')
  assert c.kernels == 'cpu'
  tx = optim.make_optimizer(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  train, _ = train_step.compile_steps(c.replace(dtype='bfloat16'), tx, config.label_smoothing,
                                      mesh)
  text = jax.export.export(train, platforms=['cpu'])(abstract_state(c, tx),
                                                     batch_shapes()).mlir_module()
  assert kernels.CPU_SCOPE in text and 'optimization_barrier' in text
  with pytest.raises(AssertionError):
    assert_accelerator_forms(text)
  search = search_program('cpu', 'bfloat16')
  assert kernels.CPU_SCOPE in search
  assert cache_layouts(search, 'cpu') == {'plain': False, 'cpu': True}


# ---------------------------------------------------------------- levers (kernels.LEVERS)

@functools.cache
def lever_train_program(platform: str, forms: str, dtype: str = 'bfloat16') -> str:
  c, config = base_config(platform)
  c = c.replace(kernels=forms, dtype=dtype)
  tx = optim.make_optimizer(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  train, _ = train_step.compile_steps(c, tx, config.label_smoothing, mesh)
  return jax.export.export(train, platforms=[platform])(abstract_state(c, tx),
                                                        batch_shapes()).mlir_module()


def token_vocabulary_indexing(text: str, vocab_size: int) -> list[str]:
  """The gathers and scatters of a program over a [rows, length, vocabulary] array."""
  return [line.strip() for line in text.splitlines()
          if re.search(r'stablehlo\.(gather|scatter)', line)
          and f'{ROWS}x{LENGTH}x{vocab_size}x' in line]


@pytest.mark.slow
def test_the_one_pass_loss_for_accelerators():
  """Lever 'one_pass_loss': the GPU program reads and differentiates z_y without a gather or
  a scatter over [tokens, vocabulary] ('xla''s loss has both), with the same products."""
  c, _ = base_config('cuda')
  ours = lever_train_program('cuda', 'xla+one_pass_loss')
  found = assert_accelerator_forms(ours)
  assert token_vocabulary_indexing(ours, c.vocab_size) == []
  assert token_vocabulary_indexing(train_program('cuda', 1), c.vocab_size) != []
  assert sum(d.flops for d in found) == train_step_flops(c, ROWS, LENGTH, LENGTH)


def test_the_one_pass_loss_keeps_one_logits_sized_buffer_fewer():
  """Compiled here (XLA:CPU, bfloat16, a vocabulary whose [tokens, vocabulary] buffers
  outweigh everything else): its temporaries hold at least one float32 [tokens, vocabulary]
  buffer fewer than 'xla''s (the scatter's; its gradient is written once, in bfloat16)."""
  config = wmt_ende_base.get_config()
  config.vocab_size = 8192
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2, dtype='bfloat16')
  tx = optim.make_optimizer(config)
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  temp = {}
  for forms in ('xla', 'xla+one_pass_loss'):
    c = ModelConfig.from_config(config, 'cpu').replace(kernels=forms)
    train, _ = train_step.compile_steps(c, tx, config.label_smoothing, mesh)
    compiled = train.lower(abstract_state(c, tx), batch_shapes()).compile()
    temp[forms] = compiled.memory_analysis().temp_size_in_bytes
  logits_bytes = ROWS * LENGTH * config.vocab_size * 4
  assert temp['xla+one_pass_loss'] <= temp['xla'] - logits_bytes, temp


def test_rbg_dropout_for_accelerators():
  """Lever 'rbg_dropout': the GPU program draws its masks with XLA's RngBitGenerator, one
  instruction, where 'xla' computes threefry (none of it in the other)."""
  ours = lever_train_program('cuda', 'xla+rbg_dropout')
  assert_accelerator_forms(ours)
  assert 'stablehlo.rng_bit_generator' in ours
  assert 'stablehlo.rng_bit_generator' not in train_program('cuda', 1)


@pytest.mark.slow
def test_fused_attention_leaves_what_it_cannot_serve_as_it_was():
  """Lever 'fused_attention' in float32 (which cuDNN's kernel does not serve): the same
  products as 'xla', attention computed by the model. Where it serves (bfloat16 on a GPU)
  JAX lowers it only with cuDNN present, so that program is checked by the device script,
  not here."""
  ours = lever_train_program('cuda', 'xla+fused_attention', 'float32')
  assert dots(ours) == dots(lever_train_program('cuda', 'xla', 'float32'))
