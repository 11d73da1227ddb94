"""config.init_from: a new run from another run's parameters and vocabulary, with a fresh
optimizer and schedule. Checked against Adam's first step (§5.3's formula) and the files."""
import filecmp
import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from helpers import TINY_CLI, make_config, tiny_config
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.modes import train as trainer
from t2t_jax.platform import errors
from t2t_jax.platform.mesh import make_mesh
from t2t_jax.run import init_from
from t2t_jax.run import params as params_lib
from t2t_jax.training import optim
from t2t_jax.training.train_step import create_train_state


def source_run(tiny_workdir, tmp_path) -> str:
  """A copy of the tiny trained run without any mean other tests made: its checkpoint 6."""
  return str(shutil.copytree(tiny_workdir, tmp_path / 'source', ignore=lambda folder, names: [
      n for n in names if folder == tiny_workdir and n in ('averaged', 'eval')]))


def test_the_start_holds_the_source_parameters_and_a_fresh_optimizer(tiny_workdir, tmp_path):
  source = source_run(tiny_workdir, tmp_path)
  config = tiny_config()
  tx = optim.make_optimizer(config)
  fresh = create_train_state(Transformer(ModelConfig.from_config(config)), tx, 1, make_mesh())
  state = init_from.initial_params(fresh, source)
  want = params_lib.load_params(source, which='checkpoint', step=6).params
  for got, expected in zip(jax.tree.leaves(state.params), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
  assert int(state.step) == 0
  moments = [leaf for leaf in jax.tree.leaves(state.opt_state) if np.ndim(leaf) > 0]
  assert moments and all(not np.any(np.asarray(m)) for m in moments)  # Adam's m and v: zero
  at_step_3 = init_from.initial_params(fresh, f'{source}:3').params
  assert not np.array_equal(jax.tree.leaves(at_step_3)[0], jax.tree.leaves(want)[0])


@pytest.mark.parametrize('schedule,learning_rate', [
    ('warmup_rsqrt', 0.0), pytest.param('rsqrt', 0.0, marks=pytest.mark.slow),
    pytest.param('constant', 3e-3, marks=pytest.mark.slow)])
def test_the_first_update_is_adams_first_step_at_the_schedules_first_rate(
    tiny_workdir, tmp_path, caplog, schedule, learning_rate):
  """Adam's first update from zero moments is lr(1) · g / (|g| + ε) (bias-corrected), so
  every parameter moves by at most lr(1) and those with a gradient well above ε by about
  that much: the run starts at step 1 of the schedule, not at the source run's step. lr(1)
  is d_model^-0.5 · warmup^-1.5 for §5.3's schedule; without warm-up, §5.3's peak
  d_model^-0.5 · warmup^-0.5 ('rsqrt'), or config.learning_rate ('constant')."""
  source = source_run(tiny_workdir, tmp_path)
  config = tiny_config()
  config.update(init_from=source, num_train_steps=1, checkpoint_every_steps=1,
                log_every_steps=1, eval_every_steps=1, lr_schedule=schedule,
                learning_rate=learning_rate)
  config.model.dropout_rate = 0.0
  trainer.train_and_evaluate(config, str(tmp_path / 'tuned'))
  before = params_lib.load_params(source, which='checkpoint').params
  after = params_lib.load_params(str(tmp_path / 'tuned'), which='checkpoint', step=1).params
  lr_1 = learning_rate or config.model.d_model ** -0.5 * config.warmup_steps ** {
      'warmup_rsqrt': -1.5, 'rsqrt': -0.5}[schedule]
  moved = np.concatenate([np.abs(np.asarray(a) - np.asarray(b)).ravel()
                          for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before),
                                          strict=True)])
  assert moved.max() <= lr_1 * (1 + 1e-3)
  assert np.median(moved) > 0.5 * lr_1
  record = json.loads(open(tmp_path / 'tuned' / 'metrics.jsonl').readline())
  assert record['step'] == 1 and record['learning_rate'] == pytest.approx(lr_1, rel=1e-5)
  # The same command again resumes the tuned run, and says that init_from is not read.
  config.num_train_steps = 2
  with caplog.at_level(logging.WARNING):
    trainer.train_and_evaluate(config, str(tmp_path / 'tuned'))
  assert 'is read only at a run\'s start' in caplog.text
  resumed = params_lib.load_params(str(tmp_path / 'tuned'), which='checkpoint', step=2).params
  steps_apart = np.abs(np.asarray(jax.tree.leaves(resumed)[0])
                       - np.asarray(jax.tree.leaves(after)[0])).max()
  assert 0 < steps_apart <= 3 * lr_1  # one more small step from step 1, not a restart


@pytest.mark.slow
def test_the_vocabulary_comes_from_the_source_and_must_match(tmp_path):
  config = make_config(tmp_path, num_train_steps=1, checkpoint_every_steps=1,
                       eval_every_steps=1, log_every_steps=1, compilation_cache_dir='')
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4)
  source = str(tmp_path / 'source')
  trainer.train_and_evaluate(config, source)
  config.init_from = source
  tuned = tmp_path / 'tuned'
  trainer.train_and_evaluate(config, str(tuned))
  for name in ('spm.model', 'spm.vocab'):
    assert filecmp.cmp(os.path.join(source, 'vocab', name), tuned / 'vocab' / name,
                       shallow=False)
  other = tmp_path / 'other'
  (other / 'vocab').mkdir(parents=True)
  (other / 'vocab' / 'spm.model').write_bytes(b'another vocabulary')
  with pytest.raises(errors.UserError, match=r'vocab/spm.model is another vocabulary than'):
    trainer.train_and_evaluate(config, str(other))


@pytest.mark.parametrize('override,named', [
    ('--config.model.d_ff=128', 'config.model.d_ff=128 contradicts the trained run'),
    ('--config.vocab_size=41', 'config.vocab_size=41 contradicts the trained run'),
])
def test_a_source_of_another_model_is_one_line_naming_the_key(cli, tiny_workdir, tmp_path,
                                                              override, named):
  result = cli(*TINY_CLI, f'--config.init_from={tiny_workdir}', override,
               f'--workdir={tmp_path / "tuned"}')
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"t2t_jax: error: config.init_from='{tiny_workdir}': {named}"), last
  assert not (tmp_path / 'tuned' / 'checkpoints').exists()
