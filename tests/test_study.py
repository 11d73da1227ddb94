"""--mode=study (t2t_jax/study.py): Table 3's rows trained, evaluated as §6.2 did, and set
beside the paper's printed values; a second run resumes instead of retraining."""
import json
import math
import os

import pytest

from helpers import ROOT
from t2t_jax.apps import evaluate
from t2t_jax.model import transformer
from t2t_jax.model.transformer import ModelConfig
from t2t_jax.modes import study
from t2t_jax.modes import train as trainer
from t2t_jax.platform import errors
from t2t_jax.run import recorded as recorded_lib

TABLE3_FILE = os.path.join(ROOT, 'experiments', 'table3.py')
# Every row alike: a tiny synthetic task, 4 steps (the study's shared budget).
TINY = {'dataset': 'synthetic', 'vocab_size': 40, 'max_length': 12, 'tokens_per_batch': 192,
        'model.num_layers': 1, 'model.d_model': 32, 'model.d_ff': 64, 'num_train_steps': 4,
        'warmup_steps': 2, 'checkpoint_every_steps': 2, 'log_every_steps': 2,
        'eval_every_steps': 4, 'decode_tokens_per_batch': 256, 'eval_tokens_per_batch': 256,
        'decode_extra_length': 5}
# Table 3's printed cells for the two rows (A: h = 4; B: d_k = 32).
PAPER = {'A_h4': dict(N=6, d_model=512, d_ff=2048, h=4, d_k=128, d_v=128, P_drop=0.1,
                      eps_ls=0.1, train_steps=100_000, ppl=5.00, bleu=25.5, params_millions=65),
         'B_dk32': dict(N=6, d_model=512, d_ff=2048, h=8, d_k=32, d_v=64, P_drop=0.1,
                        eps_ls=0.1, train_steps=100_000, ppl=5.01, bleu=25.4,
                        params_millions=60)}


def read_jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def studied(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('study'))
  results = study.study_rows(TABLE3_FILE, ['A_h4', 'B_dk32'], TINY, workdir)
  return workdir, results


@pytest.mark.slow
def test_both_rows_tabulated_beside_the_paper(studied):
  workdir, results = studied
  with open(os.path.join(workdir, 'table3.json'), encoding='utf-8') as f:
    table = json.load(f)
  assert table == results
  assert [r['row'] for r in table] == ['A_h4', 'B_dk32']
  assert all(set(r) == {'row', 'measured', 'paper'} for r in table)
  for r in table:
    assert r['paper'] == PAPER[r['row']]
  a, b = (r['measured'] for r in table)
  assert (a['N'], a['d_model'], a['d_ff'], a['h'], a['d_k'], a['d_v']) == (1, 32, 64, 4, 128, 128)
  assert (b['N'], b['d_model'], b['d_ff'], b['h'], b['d_k'], b['d_v']) == (1, 32, 64, 8, 32, 64)
  configs = study.row_configs(study.load_study(TABLE3_FILE), ['A_h4', 'B_dk32'], TINY)
  for r in table:
    m = r['measured']
    assert m['train_steps'] == 4 and (m['P_drop'], m['eps_ls']) == (0.1, 0.1)
    assert m['params'] == transformer.closed_form_param_count(ModelConfig.from_config(
        configs[r['row']]))
    assert m['train_minutes'] > 0
  with open(os.path.join(workdir, 'table3.md'), encoding='utf-8') as f:
    text = f.read()
  assert '| A_h4 | measured | 1 | 32 | 64 | 4 | 128 | 128 | 0.1 | 0.1 | 4 |' in text
  paper = '| | paper | 6 | 512 | 2048 | '
  assert paper + '4 | 128 | 128 | 0.1 | 0.1 | 100000 | 5.00 | 25.5 | 65 |' in text
  assert paper + '8 | 32 | 64 | 0.1 | 0.1 | 100000 | 5.01 | 25.4 | 60 |' in text
  with open(os.path.join(workdir, 'table3.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
def test_rows_are_evaluated_as_section_6_2(studied):
  """Dev set, the last checkpoint (not averaged), beam search: the eval folder says so. The
  perplexity is the training loop's dev perplexity at that step, computed by another path
  (trainer.py's dev set), and exp of the eval's per-piece nll."""
  workdir, results = studied
  for r in results:
    row_dir = os.path.join(workdir, r['row'])
    [name] = os.listdir(os.path.join(row_dir, evaluate.EVAL))
    assert name.rsplit('-', 1)[0] == 'dev-checkpoint-4-beam4-alpha0.6-extra5'
    with open(os.path.join(row_dir, evaluate.EVAL, name, 'scores.json'), encoding='utf-8') as f:
      scores = json.load(f)
    assert (scores['split'], scores['params']) == ('dev', 'checkpoints/4')
    assert r['measured']['bleu'] == scores['tok_bleu']
    assert r['measured']['ppl'] == pytest.approx(math.exp(scores['nll']), rel=1e-6)
    dev = [m for m in read_jsonl(os.path.join(row_dir, 'metrics.jsonl')) if 'dev_loss' in m]
    assert dev[-1]['step'] == 4
    assert r['measured']['ppl'] == pytest.approx(dev[-1]['dev_perplexity'], rel=1e-5)
    assert not os.path.exists(os.path.join(row_dir, 'averaged'))


@pytest.mark.slow
def test_a_second_run_resumes_finished_and_unfinished_rows(studied, monkeypatch):
  workdir, results = studied

  def refuse(*args, **kwargs):
    raise AssertionError('a finished row was trained or evaluated again')

  with monkeypatch.context() as patch:
    patch.setattr(trainer, 'train_and_evaluate', refuse)
    patch.setattr(evaluate, 'evaluate', refuse)
    # A smaller decoding batch changes how a row is evaluated, not its numbers.
    again = {**TINY, 'decode_tokens_per_batch': 128}
    assert study.study_rows(TABLE3_FILE, ['A_h4', 'B_dk32'], again, workdir) == results
  # A larger budget: each row continues from its step 4, it does not start again.
  longer = study.study_rows(TABLE3_FILE, ['B_dk32'], {**TINY, 'num_train_steps': 6}, workdir)
  invocations = read_jsonl(os.path.join(workdir, 'B_dk32', 'provenance.jsonl'))
  assert [i['first_step'] for i in invocations] == [1, 5]
  # The table keeps A_h4, which this invocation did not run, marked with how it differs.
  with open(os.path.join(workdir, 'table3.json'), encoding='utf-8') as f:
    assert json.load(f) == longer
  a, b = longer
  assert (a['row'], b['row']) == ('A_h4', 'B_dk32')
  assert b['measured']['train_steps'] == 6 and 'earlier_invocation' not in b['measured']
  assert a['measured'] == {**results[0]['measured'], 'earlier_invocation': True,
                           'differs_in': ['num_train_steps']}
  with open(os.path.join(workdir, 'table3.md'), encoding='utf-8') as f:
    text = f.read()
  assert '| A_h4 (earlier) | measured |' in text
  assert "A_h4 (earlier): recorded by an earlier invocation; its settings differ from this " \
         "one's in: num_train_steps." in text


@pytest.mark.parametrize('rows, overrides, message', [
    (['A_h4', 'Z'], {}, '--rows: unknown row(s) Z; choose from base,A_h1,'),
    (['A_h4', 'A_h4'], {}, '--rows: a row named twice'),
    (['B_dk16', 'A_h4'], {'model.num_heads': 2},
     '--config.model.num_heads: row A_h4 sets it (Table 3 varies it there)'),
    (['C_d1024'], {'model.d_k': 16}, '--config.model.d_k: row C_d1024 sets it'),
    (['base'], {'model.dropout_rate': -1.0}, 'config.model.dropout_rate'),
])
def test_mistakes_are_refused_before_any_row_trains(tmp_path, rows, overrides, message):
  with pytest.raises(errors.UserError) as raised:
    study.study_rows(TABLE3_FILE, rows, overrides, str(tmp_path / 'study'))
  assert message in str(raised.value)
  assert not os.path.exists(tmp_path / 'study')


def test_a_config_that_is_no_study(tmp_path):
  with pytest.raises(errors.UserError, match='needs a study file, with rows'):
    study.study_rows(os.path.join(ROOT, 'experiments', 'wmt_ende_base.py'), None, {},
                    str(tmp_path))


def test_command_line_passes_rows_and_overrides(cli, tmp_path):
  """main.py hands --rows and every --config.* override to the study (here: refused at once)."""
  result = cli('--config=experiments/table3.py', '--mode=study', f'--workdir={tmp_path}',
               '--rows=D_ls0,A_h1', '--config.model.d_v=8')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      't2t_jax: error: --config.model.d_v: row A_h1 sets it (Table 3 varies it there); '
      'leave it out, or leave A_h1 out of --rows')


def test_rows_share_the_vocabulary_of_a_row_trained_on_the_same_text(tmp_path):
  """Perplexity per word-piece compares rows only over the same pieces: a new row takes an
  earlier row's vocabulary (and encoded data, hard-linked), never one of other settings."""
  configs = study.row_configs(study.load_study(TABLE3_FILE), ['base', 'C_N2', 'C_N4'],
                              {'dataset': 'files', 'train_files': 'x/train',
                               'dev_files': 'x/dev'})
  donor = tmp_path / 'base'
  (donor / 'vocab').mkdir(parents=True)
  (donor / 'vocab' / 'spm.model').write_bytes(b'pieces')
  (donor / 'data_cache' / 'train-1').mkdir(parents=True)
  (donor / 'data_cache' / 'train-1' / 'ids.npy').write_bytes(b'ids')
  (donor / 'data_cache' / '.tmp-host-1-x').mkdir()  # a killed writer's leftovers
  recorded = recorded_lib.config_dict(configs['base'])
  (donor / 'config.json').write_text(json.dumps(recorded))
  study._share_vocabulary(configs['C_N2'], str(tmp_path / 'C_N2'), str(tmp_path))
  assert (tmp_path / 'C_N2' / 'vocab' / 'spm.model').read_bytes() == b'pieces'
  shared = tmp_path / 'C_N2' / 'data_cache' / 'train-1' / 'ids.npy'
  assert shared.stat().st_ino == (donor / 'data_cache' / 'train-1' / 'ids.npy').stat().st_ino
  assert os.listdir(tmp_path / 'C_N2' / 'data_cache') == ['train-1']
  assert sorted(os.listdir(tmp_path / 'C_N2')) == ['data_cache', 'vocab']  # no temporary left
  # Another vocabulary size: nothing is shared, the row trains its own.
  (donor / 'config.json').write_text(json.dumps({**recorded, 'vocab_size': 100}))
  study._share_vocabulary(configs['C_N4'], str(tmp_path / 'C_N4'), str(tmp_path))
  assert not os.path.exists(tmp_path / 'C_N4')
