"""The README's commands as a user types them: the GPU quick start (its set-up commands from
docs/install.md), then WORKSPACE.md's Table 2 commands for that run, end to end at a tiny size
on a CPU (the Python API example: tests/test_translator.py)."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import ROOT, cpu_env

README = os.path.join(ROOT, 'README.md')
INSTALL = os.path.join(ROOT, 'docs', 'install.md')
WORKSPACE = os.path.join(ROOT, 'WORKSPACE.md')
# The quick start's commands at a tiny size: a synthetic task instead of WMT14, a small model,
# a handful of steps with a checkpoint each (the five that --mode=average wants).
TINY_TRAINING = ['--config.dataset=synthetic', '--config.model.num_layers=1',
                 '--config.model.d_model=32', '--config.model.d_ff=64',
                 '--config.vocab_size=40', '--config.max_length=12',
                 '--config.tokens_per_batch=192', '--config.warmup_steps=10',
                 '--config.num_train_steps=6', '--config.checkpoint_every_steps=1',
                 '--config.log_every_steps=3', '--config.eval_every_steps=6',
                 '--config.decode_tokens_per_batch=64', '--config.decode_extra_length=5']


def first_block(path: str, heading: str) -> list[str]:
  """The commands of the first bash block under `heading` in `path`."""
  text = open(path, encoding='utf-8').read()
  section = text[text.index(heading):]
  block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
  return [line.split('  #')[0].strip() for line in block.splitlines()
          if line.strip() and not line.startswith('#')]


def quick_start() -> list[str]:
  """The GPU quick start: docs/install.md's set-up commands, then the README's."""
  return (first_block(INSTALL, '## GPUs and TPUs')
          + first_block(README, "## Train the paper's base model on your GPUs"))


def table2_for(workdir: str) -> list[str]:
  """WORKSPACE.md's Table 2 commands that go on from the quick start's run: those on `workdir`
  other than its first training command, then the average and eval of any run (runs/NAME)."""
  text = open(WORKSPACE, encoding='utf-8').read()
  table = text[text.index('### Table 2'):text.index('### Table 3')]
  commands = re.findall(r'^\|[^|]*\| `([^`]*)` \|', table, re.M)
  own = [c for c in commands if f'--workdir={workdir}' in c.split()][1:]
  return own + [c.replace('runs/NAME', workdir) for c in commands if 'runs/NAME' in c]


@pytest.mark.e2e
def test_the_gpu_quick_start_runs(tmp_path):
  install, accelerator, *runs = quick_start()
  assert install == "python3 -m venv .venv && .venv/bin/python -m pip install -e '.[wmt]'"
  assert accelerator == ".venv/bin/python -m pip install 'jax[cuda12]==0.10.2'"
  jax_pin = re.search(r'"jax==([\d.]+)"', open(os.path.join(ROOT, 'pyproject.toml')).read())
  assert accelerator.endswith(f"=={jax_pin.group(1)}'")  # the accelerator's JAX is the pin's
  assert runs == ['.venv/bin/t2t-jax --config=experiments/wmt_ende_base.py --workdir=runs/base']
  then = table2_for('runs/base')
  assert [c.split()[-1] for c in then] == ['--config.grad_accum_steps=8', '--mode=average',
                                           '--mode=eval']
  env = cpu_env(2)
  for run in runs + then:
    args = [a.replace('runs/base', str(tmp_path / 'base')) for a in shlex.split(run)]
    command = 1 if args[0] == '.venv/bin/t2t-jax' else 3
    assert args[:command] in (['.venv/bin/t2t-jax'], ['python', '-m', 't2t_jax.main']), run
    args = args[command:]
    if any(a.startswith('--config=') for a in args):  # training: a tiny size
      args += TINY_TRAINING
    done = subprocess.run([sys.executable, '-m', 't2t_jax', *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f'{run}\n{done.stderr[-3000:]}'
  # The second training command resumed the first run (already finished) with micro-batches.
  assert os.listdir(tmp_path / 'base' / 'averaged') == ['6']
  scores = [os.path.join(folder, 'scores.json') for folder in
            (tmp_path / 'base' / 'eval').iterdir()]
  assert len(scores) == 1 and os.path.exists(scores[0])  # where WORKSPACE.md says
