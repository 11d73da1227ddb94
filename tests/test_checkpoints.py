"""Checkpoints: exact resume after a stop or a kill, fallback past a corrupt checkpoint,
averaging, and the divergence guard."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments import demo
from helpers import COMMAND, ROOT, cpu_env
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.modes import average as average_mode
from t2t_jax.modes import train as trainer
from t2t_jax.platform import mesh as mesh_lib
from t2t_jax.platform import metrics as metrics_lib
from t2t_jax.run import averaging, vocabulary
from t2t_jax.run import dev_loss as dev_loss_lib
from t2t_jax.run import params as params_lib
from t2t_jax.training import checkpoints, optim, train_step

STEPS = 12


def tiny_config(**overrides):
  config = demo.get_config()
  config.dataset = 'synthetic'
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4)
  config.vocab_size, config.max_length, config.tokens_per_batch = 40, 12, 16 * 12
  config.warmup_steps = 10
  config.num_train_steps = STEPS
  config.log_every_steps = 4
  config.eval_every_steps = STEPS
  config.checkpoint_every_steps = 4
  config.checkpoint_every_minutes = 0.0
  config.update(overrides)
  return config


def latest_state_arrays(workdir):
  """Params and Adam state of the latest checkpoint, as host numpy trees, and the input
  pipeline's position; not the seconds trained, which a clock decides, nor the vocabulary's
  fingerprint (checked here: the synthetic data's ids)."""
  checkpointer = checkpoints.Checkpointer(workdir, keep=50)
  state, data_state = checkpointer.restore(_template(tiny_config()))
  checkpointer.close()
  data_state.pop(trainer.TRAIN_SECONDS, None)
  assert data_state.pop(vocabulary.VOCABULARY) == f'ids-{tiny_config().vocab_size}'
  return jax.device_get((state.params, state.opt_state, state.step)), data_state


def assert_trees_equal(a, b):
  """Bitwise: resuming must not change a single bit on CPU."""
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


@pytest.fixture(scope='module')
def straight_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('straight'))
  trainer.train_and_evaluate(tiny_config(), workdir)
  return latest_state_arrays(workdir)


@pytest.mark.slow
def test_stop_and_resume_is_bitwise_identical(tmp_path, straight_run):
  trainer.train_and_evaluate(tiny_config(num_train_steps=STEPS // 2), str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 6]
  trainer.train_and_evaluate(tiny_config(), str(tmp_path))
  resumed = latest_state_arrays(str(tmp_path))
  assert_trees_equal(resumed, straight_run)
  assert resumed[1] == {'batch_number': STEPS}


def cli_args(workdir, *overrides) -> list[str]:
  """tiny_config() on the command line, training in `workdir`."""
  c = tiny_config()
  return ['--config=experiments/demo.py', f'--workdir={workdir}', '--config.dataset=synthetic',
          '--config.model.num_layers=1', '--config.model.d_model=32', '--config.model.d_ff=64',
          f'--config.vocab_size={c.vocab_size}', f'--config.max_length={c.max_length}',
          f'--config.tokens_per_batch={c.tokens_per_batch}', '--config.warmup_steps=10',
          f'--config.num_train_steps={STEPS}', '--config.log_every_steps=4',
          f'--config.eval_every_steps={STEPS}', '--config.checkpoint_every_steps=4',
          '--config.checkpoint_every_minutes=0', *overrides]


def start(workdir, *overrides, prelude=''):
  """`python -m t2t_jax.main` on the tiny config as a process of its own, to be killed;
  `prelude` runs first, in its interpreter (to patch things). On the same 8 devices and XLA
  flags as this process (conftest.py), so that runs there and here match bitwise."""
  args = cli_args(workdir, *overrides)
  command = [*COMMAND, *args]
  if prelude:  # the patches go in before t2t_jax.main is imported
    command = [sys.executable, '-c', f'import sys; sys.argv = ["t2t_jax"] + {args!r}\n'
               f'{prelude}\nfrom t2t_jax import main\nmain.run()\n']
  return subprocess.Popen(command, cwd=ROOT, env=cpu_env(8), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


# Kills the process from inside orbax's background writer, while checkpoint 8 is on disk
# only as a temporary directory: the hardest moment for a crash.
KILL_DURING_SAVE = '''
import os, signal
import orbax.checkpoint as ocp
_save_fn = ocp.JsonCheckpointHandler._save_fn
def _dying_save_fn(self, item, directory):
  if item.get('batch_number') == 8:
    os.kill(os.getpid(), signal.SIGKILL)
  return _save_fn(self, item, directory)
ocp.JsonCheckpointHandler._save_fn = _dying_save_fn
'''


@pytest.mark.e2e
def test_killed_while_writing_a_checkpoint_resumes_identically(cli, tmp_path, straight_run):
  killed = start(tmp_path, prelude=KILL_DURING_SAVE)
  killed.communicate(timeout=600)
  assert killed.returncode == -signal.SIGKILL
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4]  # 8 never completed
  # Whatever orbax had written of step 8 (a temporary directory, if it got that far) is
  # not a checkpoint.
  assert '8' not in os.listdir(tmp_path / 'checkpoints')
  done = cli(*cli_args(tmp_path))  # the same command again
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'Resuming at step 4' in done.stderr
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 8, 12]
  assert_trees_equal(latest_state_arrays(str(tmp_path)), straight_run)


@pytest.mark.e2e
def test_sigkill_at_any_moment_then_rerun(cli, tmp_path, straight_run):
  proc = start(tmp_path)
  deadline = time.time() + 300
  while not checkpoints.checkpoint_steps(str(tmp_path)) and time.time() < deadline:
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  done = cli(*cli_args(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  assert_trees_equal(latest_state_arrays(str(tmp_path)), straight_run)


@pytest.mark.e2e
def test_sigterm_saves_a_checkpoint_before_exiting(tmp_path):
  proc = start(tmp_path, '--config.num_train_steps=100000', '--config.log_every_steps=1',
               '--config.checkpoint_every_steps=0')
  metrics = tmp_path / 'metrics.jsonl'
  deadline = time.time() + 300
  while not (metrics.exists() and metrics.read_text().count('\n') >= 3) and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  # Saved but not finished: 128 + SIGTERM, as a shell reports a process the signal ended,
  # so that schedulers, `until` loops and make run it again.
  assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
  steps = checkpoints.checkpoint_steps(str(tmp_path))
  assert len(steps) == 1 and steps[0] >= 3
  (_, _, step), data_state = latest_state_arrays(str(tmp_path))
  assert int(step) == steps[0] and data_state == {'batch_number': steps[0]}
  assert err.strip().splitlines()[-1] == (
      f't2t_jax: stopped by SIGTERM at step {steps[0]}, after saving checkpoint {steps[0]}; '
      'run the same command to resume')


def tear(workdir, step):
  """Truncates every file of checkpoint `step`'s params: a torn or corrupt write."""
  for root, _, files in os.walk(os.path.join(workdir, 'checkpoints', str(step), 'params')):
    for name in files:
      with open(os.path.join(root, name), 'r+b') as f:
        f.truncate(3)


@pytest.fixture
def no_retry_wait(monkeypatch):
  monkeypatch.setattr(checkpoints, 'RETRY_SECONDS', 0.0)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_is_moved_aside_and_its_step_saved_again(
    tmp_path, caplog, no_retry_wait):
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 8]
  tear(str(tmp_path), 8)
  (_, _, step), data_state = latest_state_arrays(str(tmp_path))
  assert int(step) == 4 and data_state == {'batch_number': 4}
  assert 'Checkpoint 8' in caplog.text and 'unreadable' in caplog.text
  assert caplog.text.count('retrying') == checkpoints.READ_ATTEMPTS - 1
  # Moved aside, not deleted, so that training can write step 8 again.
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4', 'corrupt-8']
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 8]
  assert (tmp_path / 'checkpoints' / 'corrupt-8').is_dir()


def test_transient_read_error_is_retried_not_taken_for_corruption(
    tmp_path, monkeypatch, no_retry_wait):
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  failures = []
  original = checkpoints.ocp.CheckpointManager.restore

  def flaky(self, step, *args, **kwargs):
    if not failures:
      failures.append(step)
      raise OSError('Stale file handle')  # an NFS hiccup
    return original(self, step, *args, **kwargs)
  monkeypatch.setattr(checkpoints.ocp.CheckpointManager, 'restore', flaky)
  (_, _, step), _ = latest_state_arrays(str(tmp_path))
  assert failures == [8] and int(step) == 8
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4', '8']


@pytest.mark.parametrize('refusal', [
    PermissionError(13, 'Permission denied', 'checkpoints/4/params'),
    ValueError('PERMISSION_DENIED: Error opening "checkpoints/4/params/manifest.ocdbt"'),
])
def test_a_checkpoint_we_may_not_read_is_an_error_not_corruption(tmp_path, monkeypatch,
                                                                 no_retry_wait, refusal):
  """A folder of mode 000 was taken for a corrupt checkpoint: moved to corrupt-4, and
  training went on from the one before. (Root reads anything: the refusal is raised here
  as the system, or TensorStore through orbax, would raise it.)"""
  trainer.train_and_evaluate(tiny_config(num_train_steps=4), str(tmp_path))
  reads = []

  def refused(self, step, *args, **kwargs):
    reads.append(step)
    raise refusal
  monkeypatch.setattr(checkpoints.ocp.CheckpointManager, 'restore', refused)
  with pytest.raises(checkpoints.errors.UserError,
                     match=rf'{tmp_path}/checkpoints/4: cannot be read \(permission denied'):
    trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  assert reads == [4]  # not retried: no second try gets a permission
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4']  # nothing set aside


@pytest.mark.slow
def test_no_readable_checkpoint_is_an_error_until_restart(tmp_path, no_retry_wait):
  """Every checkpoint unreadable: not a silent start from step 0, which orbax would then
  not even save (it declines steps at or below its latest)."""
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  tear(str(tmp_path), 4)
  tear(str(tmp_path), 8)
  for _ in range(2):  # and again after they were moved aside
    with pytest.raises(ValueError, match='No readable checkpoint.*config.restart=True'):
      trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['corrupt-4', 'corrupt-8']
  trainer.train_and_evaluate(tiny_config(num_train_steps=8, restart=True), str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 8]
  previous = [n for n in os.listdir(tmp_path) if n.startswith('previous-')]
  assert len(previous) == 1
  moved = set(os.listdir(tmp_path / previous[0]))
  assert {'checkpoints', 'metrics.jsonl', 'config.json'} <= moved
  assert sorted(os.listdir(tmp_path / previous[0] / 'checkpoints')) == ['corrupt-4', 'corrupt-8']


@pytest.mark.parametrize('name,value,parameter', [
    ('num_layers', 2, 'layer_1/'),  # e.g. table3.py:C_N8 run in a base workdir
    ('d_ff', 128, 'ffn/w_1/kernel'),
])
@pytest.mark.parametrize('recorded', [True, False])
def test_another_model_shape_is_an_error_naming_parameter_and_key(
    tmp_path, name, value, parameter, recorded):
  trainer.train_and_evaluate(tiny_config(num_train_steps=4), str(tmp_path))
  if not recorded:  # a workdir from before config.json: the key is inferred from shapes
    os.remove(tmp_path / 'config.json')
  config = tiny_config(num_train_steps=8)
  config.model[name] = value
  key = f'config.model.{name}'
  with pytest.raises(ValueError) as info:
    trainer.train_and_evaluate(config, str(tmp_path))
  message = str(info.value)
  assert 'checkpoints/4 holds another model' in message and parameter in message
  assert key in message and 'config.restart=True' in message
  if recorded:
    assert f'the run was started with {key}=' in message
  assert os.listdir(tmp_path / 'checkpoints') == ['4']  # nothing moved, nothing lost


@pytest.mark.slow
def test_a_preemption_sync_point_saves_that_step_and_stops(tmp_path, monkeypatch):
  """orbax's preemption check (JAX's sync point, which only a jax.distributed run reaches):
  the step it names is saved, off the every-4-steps schedule, and the run stops as at
  SIGTERM, never going on unsaved."""
  monkeypatch.setattr(checkpoints.Checkpointer, 'reached_preemption',
                      lambda self, step: step == 6)
  with pytest.raises(trainer.StoppedBySignal) as stopped:
    trainer.train_and_evaluate(tiny_config(num_train_steps=12), str(tmp_path))
  assert (stopped.value.step, stopped.value.signum) == (6, signal.SIGTERM)
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 6]


def test_declined_save_is_an_error(tmp_path):
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), str(tmp_path))
  checkpointer = checkpoints.Checkpointer(str(tmp_path), keep=5)
  state, data_state = checkpointer.restore(
      _template(tiny_config()), step=4)  # step 4 while 8 exists
  with pytest.raises(checkpoints.CheckpointNotSaved,
                     match='declined to save checkpoint 5 .* holds step 8'):
    checkpointer.save(state.replace(step=state.step + 1), data_state)
  checkpointer.close()


def test_an_error_lets_the_save_in_flight_finish_and_is_the_one_raised(tmp_path):
  state = _template(tiny_config())
  with pytest.raises(KeyError, match='the run\'s own error'):
    with checkpoints.Checkpointer(str(tmp_path), keep=5) as checkpointer:
      checkpointer.save(state.replace(step=state.step + 3), {'position': 7})
      raise KeyError("the run's own error")
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [3]
  assert os.listdir(tmp_path / 'checkpoints') == ['3']  # finished: no temporary folder
  assert checkpoints.read_data_state(str(tmp_path), 3) == {'position': 7}


def test_a_refused_write_waits_for_no_other(tmp_path, monkeypatch):
  """After a full disk, main ends the process at once: the checkpointer waits for nothing
  (the writes still in flight would fail again, each with its traceback)."""
  waited = []
  with pytest.raises(checkpoints.CheckpointWriteError):
    with checkpoints.Checkpointer(str(tmp_path), keep=5) as checkpointer:
      monkeypatch.setattr(checkpoints.ocp.CheckpointManager, 'wait_until_finished',
                          lambda self: waited.append(True))
      raise checkpoints.CheckpointWriteError(checkpointer.directory, 'checkpoints',
                                             OSError(28, 'No space left on device'))
  assert waited == []


@pytest.mark.slow
def test_resume_from_an_older_checkpoint_moves_newer_ones_aside(tmp_path, straight_run):
  trainer.train_and_evaluate(tiny_config(), str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 8, 12]
  trainer.train_and_evaluate(tiny_config(restore_step=4), str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [4, 8, 12]
  previous = [n for n in os.listdir(tmp_path) if n.startswith('previous-')]
  assert sorted(os.listdir(tmp_path / previous[0] / 'checkpoints')) == ['12', '8']
  assert_trees_equal(latest_state_arrays(str(tmp_path)), straight_run)  # exact from step 4
  with pytest.raises(ValueError, match='restore_step=5: .* has no checkpoint 5'):
    trainer.train_and_evaluate(tiny_config(restore_step=5), str(tmp_path))


def test_resume_logs_how_the_config_changed(tmp_path, caplog):
  trainer.train_and_evaluate(tiny_config(num_train_steps=4), str(tmp_path))
  recorded = json.load(open(tmp_path / 'config.json'))
  assert recorded['num_train_steps'] == 4 and recorded['model']['d_model'] == 32
  trainer.train_and_evaluate(tiny_config(num_train_steps=8, log_every_steps=2), str(tmp_path))
  assert 'config.log_every_steps: 4 -> 2; config.num_train_steps: 4 -> 8' in caplog.text
  assert json.load(open(tmp_path / 'config.json')) == recorded  # the run's first config


def _template(config):
  mesh = mesh_lib.make_mesh(jax.devices()[:1])
  return train_step.create_train_state(Transformer(ModelConfig.from_config(config)),
                                       optim.make_optimizer(config), 0, mesh)


def test_unreadable_checkpoints_are_named_and_skipped_by_average_and_decoding(
    tmp_path, caplog, no_retry_wait):
  workdir = str(tmp_path)
  trainer.train_and_evaluate(tiny_config(), workdir)
  tear(workdir, 12)
  assert averaging.average_checkpoints(workdir, 2) == (8, [4, 8])
  assert 'checkpoints/12 is unreadable' in caplog.text
  assert params_lib.load_params(workdir, which='checkpoint').source == 'checkpoints/8'
  with pytest.raises(ValueError, match='restore_step=12: .*checkpoints/12 is unreadable'):
    params_lib.load_params(workdir, which='checkpoint', step=12)


def test_averaging_is_the_arithmetic_mean(tmp_path):
  workdir = str(tmp_path)
  trainer.train_and_evaluate(tiny_config(), workdir)
  steps = checkpoints.checkpoint_steps(workdir)
  assert steps == [4, 8, 12]
  trees = [params_lib.restore_params(os.path.join(workdir, 'checkpoints'), s)
           for s in steps]
  step, averaged_steps = averaging.average_checkpoints(workdir, 3)
  assert (step, averaged_steps) == (12, [4, 8, 12])
  loaded = params_lib.load_params(workdir)
  averaged = loaded.params
  assert loaded.source == 'averaged/12' and (loaded.kind, loaded.step) == ('averaged', 12)
  expected = jax.tree_util.tree_map(lambda *xs: np.mean(np.stack(xs).astype(np.float64), 0),
                                    *trees)
  jax.tree_util.tree_map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7),
                         averaged, expected)
  # Averaging one checkpoint is the identity.
  averaging.average_checkpoints(workdir, 1)
  assert_trees_equal(params_lib.load_params(workdir).params, trees[-1])


def test_a_torn_saves_temporary_folder_is_removed_at_the_start(tmp_path):
  """A save a kill cut short leaves orbax's `<step>.orbax-checkpoint-tmp-*` folder: the next
  Checkpointer removes it before orbax opens the folder, and keeps the whole checkpoints."""
  workdir = str(tmp_path)
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), workdir)
  torn = tmp_path / 'checkpoints' / '12.orbax-checkpoint-tmp-1764300000'
  (torn / 'train_state').mkdir(parents=True)
  (torn / 'train_state' / 'part').write_text('half a write')
  with checkpoints.Checkpointer(workdir, keep=5) as checkpointer:
    assert checkpointer.steps() == [4, 8]
  assert not torn.exists()
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['4', '8']


@pytest.mark.slow
def test_the_best_checkpoints_by_dev_loss(tmp_path):
  """decode_params='best' and average_select='best' choose by the dev losses metrics.jsonl
  holds (the last record of a step winning, a torn line skipped), among the checkpoints
  kept; ties go to the later step."""
  workdir = str(tmp_path)
  trainer.train_and_evaluate(tiny_config(), workdir)
  trees = {s: params_lib.restore_params(os.path.join(workdir, 'checkpoints'), s)
           for s in (4, 8, 12)}
  records = [{'step': 4, 'dev_loss': 1.0}, {'step': 8, 'dev_loss': 0.5},
             {'step': 12, 'dev_loss': 2.0}, {'step': 12, 'loss': 0.1},
             {'step': 16, 'dev_loss': 0.1}]  # a step with no checkpoint (moved aside)
  (tmp_path / 'metrics.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in records) + '{"step": 4, "dev_lo')
  assert params_lib.best_steps(workdir, 1, key='k') == [8]
  assert params_lib.best_steps(workdir, 2, key='k') == [4, 8]
  best = params_lib.load_params(workdir, which='best')
  assert (best.source, best.kind) == ('checkpoints/8', 'checkpoint')
  assert_trees_equal(best.params, trees[8])
  assert averaging.average_checkpoints(workdir, 2, best=True) == (8, [4, 8])
  expected = jax.tree_util.tree_map(lambda a, b: (np.asarray(a, np.float32) + b) / 2,
                                    trees[4], trees[8])
  jax.tree_util.tree_map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7),
                         params_lib.load_params(workdir, which='averaged').params, expected)
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('\n' + json.dumps({'step': 12, 'dev_loss': 0.5}) + '\n')  # a tie, recorded last
  assert params_lib.best_steps(workdir, 1, key='k') == [12]
  with pytest.raises(ValueError, match=r"restore_step=8: config.decode_params='best' chooses"):
    params_lib.load_params(workdir, which='best', step=8)
  (tmp_path / 'metrics.jsonl').write_text(json.dumps({'step': 4, 'loss': 1.0}) + '\n')
  with pytest.raises(ValueError, match=r"^config.average_select='best': no checkpoint in .* "
                                       r'has a dev loss in metrics.jsonl'):
    averaging.average_checkpoints(workdir, 2, best=True)


def test_averaging_fewer_checkpoints_than_asked(tmp_path):
  workdir = str(tmp_path)
  trainer.train_and_evaluate(tiny_config(num_train_steps=8), workdir)
  with pytest.raises(ValueError, match='average_last=5.*only 2'):
    averaging.average_checkpoints(workdir, 5)
  assert checkpoints.checkpoint_steps(workdir, checkpoints.AVERAGED) == []
  assert averaging.average_checkpoints(workdir, 5, allow_fewer=True) == (8, [4, 8])


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
  config = tiny_config(num_train_steps=40, log_every_steps=1, checkpoint_every_steps=2,
                       learning_rate_scale=1e12)
  with pytest.raises(trainer.TrainingDiverged, match='non-finite at step') as info:
    trainer.train_and_evaluate(config, str(tmp_path))
  bad_step = int(str(info.value).split('step ')[1].split('.')[0])
  steps = checkpoints.checkpoint_steps(str(tmp_path))
  assert all(s < bad_step for s in steps)
  if steps:
    (params, _, _), _ = latest_state_arrays(str(tmp_path))
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(params))


def test_finite_loss_with_non_finite_gradient_is_never_saved(tmp_path, monkeypatch):
  """bf16/fp16 overflow: the loss of a step is finite, its gradient is not, and its update
  has already made the parameters NaN. The guard must look at the gradient norm too."""
  import jax.numpy as jnp
  original = train_step.loss_sums

  def nan_gradient(params, *args, **kwargs):
    loss, sums = original(params, *args, **kwargs)
    leaf = jax.tree_util.tree_leaves(params)[0]
    # Value 0 · sqrt(0) = 0, gradient 0 · inf = NaN.
    return loss + 0.0 * jnp.sqrt(jnp.sum(leaf) * 0.0), sums
  monkeypatch.setattr(train_step, 'loss_sums', nan_gradient)
  config = tiny_config(num_train_steps=8, log_every_steps=100, checkpoint_every_steps=1)
  with pytest.raises(trainer.TrainingDiverged, match='gradient .*non-finite at step 1'):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert checkpoints.checkpoint_steps(str(tmp_path)) == []


@pytest.mark.parametrize('override,message', [
    ('--config.model.n_layers=3', 'n_layers'),
    ('--config.model.d_model=100', 'config.model.d_k'),  # 100 / 8 heads, d_k unset
    ('--config.model.dropout_rate=-0.1', 'config.model.dropout_rate'),
])
def test_config_mistakes_fail_before_compiling(cli, tmp_path, override, message):
  extra = ['--config.model.num_heads=8'] if 'd_model' in override else []
  done = cli(*cli_args(tmp_path, override, *extra))
  assert done.returncode != 0 and message in done.stderr
  assert not os.path.exists(tmp_path / 'checkpoints')


def _save_steps(checkpointer, state, losses):
  """Saves a checkpoint at each step of `losses` ({step: dev loss or None: not evaluated})."""
  for step, loss in losses.items():
    checkpointer.save(state.replace(step=state.step * 0 + step), {'position': step},
                      metrics=None if loss is None else {'dev_loss': loss})
    checkpointer.wait()


@pytest.mark.slow
def test_the_best_checkpoints_survive_the_rotation_and_a_resume(tmp_path):
  """keep=2, keep_best=2: the last two and the two of lowest dev loss stay, through orbax's
  preservation policies, also for a checkpointer that reopens the folder (a resumed run)."""
  state = _template(tiny_config())
  with checkpoints.Checkpointer(str(tmp_path), keep=2, keep_best=2) as checkpointer:
    _save_steps(checkpointer, state, {1: 3.0, 2: None, 3: 1.5, 4: 2.5, 5: None, 6: 1.0,
                                      7: None, 8: 4.0, 9: None})
    assert checkpointer.steps() == [3, 6, 8, 9]
    assert checkpointer.best_step() == 6
  with checkpoints.Checkpointer(str(tmp_path), keep=2, keep_best=2) as checkpointer:
    _save_steps(checkpointer, state, {10: None, 11: 2.0, 12: None, 13: None})
    assert checkpointer.steps() == [3, 6, 12, 13]
    _save_steps(checkpointer, state, {14: 0.5})
    assert checkpointer.steps() == [6, 13, 14]
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [6, 13, 14]


def test_keep_best_zero_keeps_the_last_only(tmp_path):
  state = _template(tiny_config())
  with checkpoints.Checkpointer(str(tmp_path), keep=2, keep_best=0) as checkpointer:
    _save_steps(checkpointer, state, {1: 0.5, 2: 3.0, 3: 2.0})
    assert checkpointer.steps() == [2, 3]


@pytest.mark.slow
def test_training_keeps_the_checkpoint_of_lowest_dev_loss(tmp_path):
  """The training loop gives each checkpoint its step's dev loss: the ones kept are the last
  and the lowest of metrics.jsonl's (ties to the later step), whichever that is."""
  workdir = str(tmp_path)
  summary = trainer.train_and_evaluate(tiny_config(
      eval_every_steps=2, checkpoint_every_steps=2, keep_checkpoints=1, keep_best=1,
      average_last=1), workdir)
  losses = metrics_lib.dev_losses(workdir)
  assert sorted(losses) == [2, 4, 6, 8, 10, 12]
  best = min(losses, key=lambda s: (losses[s], -s))
  assert checkpoints.checkpoint_steps(workdir) == sorted({best, STEPS})
  assert summary.endswith(f'kept as the best: checkpoints/{best}')
  with open(os.path.join(workdir, 'checkpoints', str(best), 'metrics', 'metrics')) as f:
    assert json.load(f)['dev_loss'] == losses[best]


@pytest.mark.slow
def test_average_measures_its_dev_loss_beside_its_checkpoints(tmp_path):
  """--mode=average's dev losses are training's dev loss (metrics.jsonl's, for the same
  checkpoints), recorded in steps.json and named where decoding loads the average."""
  workdir = str(tmp_path)
  config = tiny_config(eval_every_steps=4, average_last=3)
  trainer.train_and_evaluate(config, workdir)
  line = average_mode.run(config, workdir)
  record = params_lib.average_record(workdir, 12)
  assert record.steps == [4, 8, 12]
  recorded = metrics_lib.dev_losses(workdir)
  for step, loss in record.members_dev_loss.items():  # float32 sums of the same batches
    np.testing.assert_allclose(loss, recorded[step], rtol=1e-6)
  low, high = min(record.members_dev_loss.values()), max(record.members_dev_loss.values())
  assert line.endswith(f": dev loss {record.dev_loss:.4f}, its checkpoints' {low:.4f}–{high:.4f}")
  loaded = params_lib.load_params(workdir)
  assert loaded.dev_loss == record.dev_loss
  assert loaded.describe() == (f'averaged/12 (the mean of checkpoints [4, 8, 12]; dev loss '
                               f'{record.dev_loss:.4f})')
  assert params_lib.load_params(workdir, which='checkpoint').dev_loss == recorded[12]


@pytest.mark.slow
def test_an_average_worse_than_its_best_checkpoint_is_a_warning(tmp_path, monkeypatch, caplog):
  """The dev losses here are given (members measured newest first, then the mean)."""
  workdir = str(tmp_path)
  config = tiny_config(num_train_steps=8, average_last=2)
  trainer.train_and_evaluate(config, workdir)
  given = iter([2.5, 2.0, 2.25])  # checkpoints 8, 4, then their mean

  class GivenDevLoss:
    def __init__(self, config, workdir):
      pass

    def __call__(self, params):
      return next(given)

  monkeypatch.setattr(dev_loss_lib, 'DevLoss', GivenDevLoss)
  caplog.set_level('INFO')
  line = average_mode.run(config, workdir)
  assert line.endswith("averaged/8: dev loss 2.2500, its checkpoints' 2.0000–2.5000")
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert any(m.startswith('The average is worse on the dev set than its best checkpoint: dev '
                          'loss 2.2500 against 2.0000 of checkpoints/4.') and
             '--config.decode_params=best' in m for m in warnings), warnings
  assert 'Dev loss of averaged/8: 2.2500; of its checkpoints: 4: 2.0000, 8: 2.5000.' in caplog.text
