"""Early stopping on the dev set: the count (against a hand-worked sequence), then a run that
stops, is resumed without a change (nothing happens), and with a raised patience or step
budget (it trains on)."""
import json
import os

import pytest

from t2t_jax.config import rules
from t2t_jax.modes import train as trainer
from t2t_jax.platform import errors
from t2t_jax.platform import metrics as metrics_lib
from t2t_jax.training import checkpoints, early_stopping
from test_checkpoints import tiny_config


def test_patience_counts_evaluations_since_the_best():
  watch = early_stopping.EarlyStopping('dev_loss', patience=2)
  stops = [watch.observe(step, {'dev_loss': loss})
           for step, loss in [(1, 3.0), (2, 2.0), (3, 2.0), (4, 1.9), (5, 2.5), (6, 1.95)]]
  assert stops == [False, False, False, False, False, True]  # 2.0 again is no improvement
  assert (watch.best_step, watch.waited) == (4, 2)
  assert not watch.observe(7, {'dev_perplexity': 9.0})  # an evaluation of something else


def test_dev_bleu_is_better_higher_and_a_raised_budget_counts_afresh():
  watch = early_stopping.EarlyStopping('dev_bleu', patience=2, history={1: 20.0, 2: 19.0,
                                                                        3: 18.0}, since=3)
  assert watch.best_step == 1 and watch.waited == 0
  assert not watch.observe(4, {'dev_bleu': 19.5})
  assert watch.observe(5, {'dev_bleu': 20.0})


def test_resuming_past_a_stop_needs_a_raised_patience_or_budget():
  stop = {'patience': 3, 'num_train_steps': 100}
  assert not early_stopping.resumes_past(stop, 3, 100)
  assert not early_stopping.resumes_past(stop, 2, 100)
  assert early_stopping.resumes_past(stop, 4, 100)
  assert early_stopping.resumes_past(stop, 0, 100)  # turned off
  assert early_stopping.resumes_past(stop, 3, 101)


def test_dev_bleu_needs_dev_bleu_during_training():
  with pytest.raises(errors.UserError, match='early_stopping_metric.*eval_bleu_every_steps'):
    rules.validate(tiny_config(early_stopping_patience=2, early_stopping_metric='dev_bleu',
                               eval_bleu_every_steps=0))


# A learning rate far below float32's resolution of the weights: no update changes them, so
# every dev loss is the first one, bitwise, and the stops fall at known steps on any host.
FROZEN = dict(lr_schedule='constant', learning_rate=1e-30, eval_every_steps=2,
              checkpoint_every_steps=2, keep_checkpoints=2, average_last=2)


def _stops(workdir):
  return metrics_lib.recorded(workdir, early_stopping.STOPPED)


@pytest.mark.slow
def test_a_run_stops_early_saves_and_resumes_only_when_asked(tmp_path):
  workdir = str(tmp_path)
  line = trainer.train_and_evaluate(tiny_config(early_stopping_patience=2, **FROZEN), workdir)
  assert line.startswith('Training stopped early at step 6 (of 12): no better dev loss than')
  assert '(step 2) in 2 evaluations' in line
  assert checkpoints.checkpoint_steps(workdir)[-1] == 6
  assert _stops(workdir)[6]['best_step'] == 2
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    assert json.loads(f.readlines()[-1])['stopped_early']['patience'] == 2

  again = trainer.train_and_evaluate(tiny_config(early_stopping_patience=2, **FROZEN), workdir)
  assert again.startswith('Training stopped early at step 6 (of 12)')
  assert 'nothing to do' in again and checkpoints.checkpoint_steps(workdir)[-1] == 6

  patient = trainer.train_and_evaluate(tiny_config(early_stopping_patience=3, **FROZEN), workdir)
  assert patient.startswith('Training stopped early at step 8 (of 12)')  # 4, 6, 8 after 2

  longer = trainer.train_and_evaluate(
      tiny_config(early_stopping_patience=3, **{**FROZEN, 'num_train_steps': 20}), workdir)
  assert longer.startswith('Training stopped early at step 14 (of 20)')  # 10, 12, 14 anew
  assert sorted(_stops(workdir)) == [6, 8, 14]
