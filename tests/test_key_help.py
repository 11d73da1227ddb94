"""--mode=help (t2t_jax/config/key_help.py): every config key, its value and the comment its
config file gives it."""
import os

from helpers import ROOT
from t2t_jax.config import key_help, loading

EXAMPLE = '''
def get_config():
  config = Config()
  # ----- Data (§5.1) -----
  config.dataset = 'a # b'  # where pairs come from. More words here.
  # A block above a key documents it: its first sentence. The rest is
  # more detail.
  config.max_length = 256
  config.seed = 0
  config.model = Config()

  # ----- Model (§3) -----
  config.model.d_model = 512  # §3.1
'''


def test_a_keys_doc_is_its_comment_or_the_block_above_it(tmp_path):
  path = tmp_path / 'example.py'
  path.write_text(EXAMPLE)
  assert list(key_help.documented_keys(str(path))) == [
      ('Data (§5.1)', 'dataset', 'where pairs come from.'),
      ('Data (§5.1)', 'max_length', 'A block above a key documents it: its first sentence.'),
      ('Data (§5.1)', 'seed', ''),  # a block documents the one key below it, no more
      ('Data (§5.1)', 'model', ''),
      ('Model (§3)', 'model.d_model', '§3.1')]
  assert list(key_help.documented_keys(str(tmp_path / 'missing.py'))) == []


def test_every_key_of_the_base_config_is_documented():
  config = loading.load_module(key_help.BASE, 'base_for_help').get_config()
  text = key_help.describe(config)
  # A key's line, then its doc's continuation lines (wrapped, never cut), under its '#'.
  lines = [line for line in text.splitlines() if line.startswith('  ') and
           not line.lstrip().startswith('#')]
  assert len(lines) == len(list(key_help._flat(config)))
  assert [line for line in lines if '  # ' not in line] == []
  assert 'Other keys' not in text and '…' not in text
  assert all(len(line) <= 100 for line in text.splitlines() if '  # ' in line)
  assert "  warmup_steps = 4000  # §5.3" in text.splitlines()
  all_lines = text.splitlines()
  first = next(i for i, line in enumerate(all_lines) if line.startswith('  decode_params = '))
  end = next((i for i in range(first + 1, len(all_lines))
              if not all_lines[i].lstrip().startswith('#')), len(all_lines))
  assert ' '.join(line.strip().lstrip('# ') for line in all_lines[first:end]).endswith(
      "'best' = the checkpoint of lowest dev loss (of those at steps where training evaluated "
      'the dev set).')


def test_help_mode_lists_the_keys_of_a_config_or_of_a_run(cli, tiny_workdir):
  done = cli('--mode=help', '--config=experiments/demo.py')
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  assert '  num_train_steps = 1000  # §5.2' in lines
  assert '  model.d_model = 128  # §3.1' in lines
  assert 'Checkpoints and averaging (§5.2, §6.1)' in lines
  # demo.py's own keys, documented by demo.py
  assert any(line.startswith('  demo_num_eval = 1000  # ') for line in lines)
  run = cli('--mode=help', f'--workdir={tiny_workdir}', '--config.beam_size=7')
  assert run.returncode == 0, run.stderr[-2000:]
  assert '  beam_size = 7  # §6.1' in run.stdout.splitlines()
  alone = cli('--mode=help')
  assert '  vocab_size = 37000  # shared source-target BPE vocabulary, §5.1' in alone.stdout
  assert os.path.isfile(os.path.join(ROOT, 'experiments', 'wmt_ende_base.py'))


def test_help_mode_says_when_the_workdir_holds_no_run(cli, tmp_path):
  """A mistyped --workdir showed the base config's defaults as if they were the run's."""
  done = cli('--mode=help', f'--workdir={tmp_path / "no-run"}')
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.splitlines()[0] == (
      f'{tmp_path / "no-run" / "config.json"}: no recorded run there, so these are the '
      f'defaults of {key_help.BASE} (pass --config=FILE, or the --workdir of a trained run)')
