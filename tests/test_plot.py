"""--mode=plot (modes/plot.py): the series and marks read from a hand-written metrics.jsonl,
as training writes it, and the picture written whole, never through a link; no training."""
import json
import os

import pytest

from experiments import demo
from t2t_jax.modes import plot
from t2t_jax.platform import errors
from t2t_jax.run import recorded as recorded_lib

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
# What training writes (modes/train.py): a record each config.log_every_steps, dev_* ones at
# each evaluation. Step 40 twice: a run resumed from step 20 logs it again (the last wins).
RECORDS = [
    {'step': 20, 'loss': 6.0, 'nll': 5.8, 'learning_rate': 0.001},
    {'step': 20, 'dev_loss': 5.5, 'dev_nll': 5.3, 'dev_perplexity': 200.0},
    {'step': 40, 'loss': 9.0, 'nll': 8.9, 'learning_rate': 0.002},
    {'step': 40, 'loss': 4.0, 'nll': 3.8, 'learning_rate': 0.002},
    {'step': 40, 'dev_loss': 3.0, 'dev_nll': 2.8, 'dev_perplexity': 16.4},
    {'step': 40, 'dev_bleu': 12.5, 'dev_tok_bleu': 13.0},
    {'step': 60, 'loss': 3.0, 'nll': 2.7, 'learning_rate': 0.0015},
    {'step': 60, 'dev_loss': 3.2, 'dev_nll': 3.0, 'dev_perplexity': 20.1},
    {'step': 80, 'loss': 2.5, 'nll': 2.2, 'learning_rate': 0.0012},
    {'step': 80, 'dev_loss': 3.1, 'dev_nll': 2.9, 'dev_perplexity': 18.2},
    {'step': 80, 'dev_bleu': 20.0, 'dev_tok_bleu': 21.0},
]


def write_run(workdir, records=RECORDS, *, checkpoints=(60, 80), averaged=None, torn=True):
  """A workdir as training left it: metrics.jsonl (its last line cut short by a kill, if
  `torn`), empty folders for the kept checkpoints, and an average's steps.json."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
    f.writelines(json.dumps(record) + '\n' for record in records)
    if torn:
      f.write('{"step": 100, "lo')
  for step in checkpoints:
    os.makedirs(os.path.join(workdir, 'checkpoints', str(step)))
  for step, steps in (averaged or {}).items():
    os.makedirs(os.path.join(workdir, 'averaged', str(step), 'params'))
    with open(os.path.join(workdir, 'averaged', str(step), 'steps.json'), 'w') as f:
      json.dump({'steps': steps}, f)
  return str(workdir)


def test_the_series_are_by_step_the_last_record_of_a_step_winning(tmp_path):
  workdir = write_run(tmp_path / 'run', averaged={60: [40, 60], 80: [60, 80]})
  curves = plot.curves(workdir)
  assert curves.series['loss'] == [(20, 6.0), (40, 4.0), (60, 3.0), (80, 2.5)]
  assert curves.series['learning_rate'] == [(20, 0.001), (40, 0.002), (60, 0.0015),
                                            (80, 0.0012)]
  assert curves.series['dev_loss'] == [(20, 5.5), (40, 3.0), (60, 3.2), (80, 3.1)]
  assert curves.series['dev_bleu'] == [(40, 12.5), (80, 20.0)]
  # The latest average and its checkpoints; the best of the kept checkpoints (60 and 80),
  # not step 40, whose dev loss is lower but whose checkpoint is gone.
  assert (curves.averaged_step, curves.averaged) == (80, [60, 80])
  assert (curves.best_step, curves.best_kept) == (80, True)
  assert curves.best_label == 'best: step 80, the kept checkpoint of lowest dev loss'


def test_without_a_kept_checkpoint_the_best_is_the_lowest_dev_loss_recorded(tmp_path):
  curves = plot.curves(write_run(tmp_path / 'run', checkpoints=()))
  assert (curves.best_step, curves.best_kept) == (40, False)
  assert 'lowest dev loss recorded (its checkpoint not kept)' in curves.best_label
  assert (curves.averaged_step, curves.averaged) == (None, [])


def test_a_run_without_dev_loss_or_bleu_has_no_best_step(tmp_path):
  train_only = [r for r in RECORDS if 'loss' in r]
  curves = plot.curves(write_run(tmp_path / 'run', train_only, torn=False))
  assert curves.best_step is None and 'dev_loss' not in curves.series
  assert curves.best_label == 'no dev loss recorded'


@pytest.mark.parametrize('records', [RECORDS, [r for r in RECORDS if 'dev_bleu' not in r]])
def test_the_picture_is_a_png(tmp_path, records):
  workdir = write_run(tmp_path / 'run', records, averaged={80: [60, 80]})
  line = plot.run(None, workdir)
  path = os.path.join(workdir, plot.PICTURE)
  assert line == f'wrote {path} (best: step 80, the kept checkpoint of lowest dev loss)'
  with open(path, 'rb') as f:
    assert f.read(8) == PNG_SIGNATURE
  assert os.path.getsize(path) > 1000
  assert [n for n in os.listdir(workdir) if '.tmp-' in n] == []  # the temporary renamed


def test_the_picture_replaces_a_planted_link_and_writes_nothing_through_it(tmp_path):
  workdir = write_run(tmp_path / 'run')
  victim = tmp_path / 'victim.txt'
  victim.write_text('untouched')
  os.symlink(victim, os.path.join(workdir, plot.PICTURE))
  plot.run(None, workdir)
  assert victim.read_text() == 'untouched'
  assert not os.path.islink(os.path.join(workdir, plot.PICTURE))


def test_no_metrics_says_to_train_first(tmp_path):
  with pytest.raises(errors.MissingFileError, match=r'metrics.jsonl: no such file; .*train '
                     r'first \(--mode=train\)'):
    plot.curves(str(tmp_path))
  write_run(tmp_path / 'empty', [], checkpoints=(), torn=True)  # a kill before the first log
  with pytest.raises(errors.UserError, match='no step logged yet; train first'):
    plot.curves(str(tmp_path / 'empty'))


def test_the_command_plots_a_recorded_run(cli, tmp_path):
  """`--workdir=DIR --mode=plot`: the config the run recorded, no --config."""
  workdir = write_run(tmp_path / 'run')
  recorded_lib.save_config(workdir, demo.get_config())
  done = cli(f'--workdir={workdir}', '--mode=plot')
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().splitlines()[-1].startswith(f'wrote {workdir}/curves.png (best: ')
  missing = cli('--config=experiments/demo.py', f'--workdir={tmp_path / "none"}', '--mode=plot')
  assert missing.returncode == 1
  assert missing.stderr.strip().splitlines()[-1] == (
      f't2t_jax: error: {tmp_path / "none"}/metrics.jsonl: no such file; it is written by '
      'training: train first (--mode=train)')
