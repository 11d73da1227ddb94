"""docs/data.md's first recipe for a corpus of your own, as written, on a 300-pair corpus (the
README's commands: tests/test_readme.py)."""
import os
import re
import shlex

import pytest

from helpers import ROOT, corpus, write_pair

DATA_MD = os.path.join(ROOT, 'docs', 'data.md')
# The recipe trains the demo config's 1000 steps, minutes on 2 cores; the test takes one, then
# the dev loss and a checkpoint as the last of the 1000 would, compiling no batch shape ahead
# that one step does not use.
FEWER_STEPS = ['--config.num_train_steps=1', '--config.checkpoint_every_steps=1',
               '--config.eval_every_steps=1', '--config.log_every_steps=1',
               '--config.compile_ahead=false']


def own_files_recipe() -> str:
  """The bash block of docs/data.md's `files` source, on one line, its comment removed."""
  text = open(DATA_MD, encoding='utf-8').read()
  section = text[text.index('- **`files`**'):]
  block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
  return ' '.join(shlex.split(block.replace('\\\n', ' '), comments=True))


@pytest.mark.slow
def test_own_files_recipe_trains_on_a_small_corpus(cli, tmp_path):
  recipe = own_files_recipe()
  prefix = 'python -m t2t_jax.main --config=experiments/demo.py --workdir=runs/mine '
  assert recipe.startswith(prefix), recipe
  for split, n, seed in (('train', 300, 0), ('dev', 10, 1)):
    write_pair(tmp_path / split, *corpus(n, seed))
  args = shlex.split(recipe)[3:]
  for name in ('runs/mine', 'data/train', 'data/dev'):
    assert sum(a.endswith(f'={name}') for a in args) == 1, (name, recipe)
    args = [a.replace(f'={name}', f'={tmp_path / os.path.basename(name)}') for a in args]
  done = cli(*args, *FEWER_STEPS)
  assert done.returncode == 0, done.stderr[-3000:]
  assert os.listdir(tmp_path / 'mine' / 'checkpoints') == ['1']
  assert os.path.exists(tmp_path / 'mine' / 'vocab' / 'spm.model')
