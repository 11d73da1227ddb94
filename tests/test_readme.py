"""The README's commands as a user types them: the GPU quick start runs end to end at a tiny
size on a CPU (the Python API example: tests/test_translator.py)."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers import ROOT, cpu_env

README = os.path.join(ROOT, 'README.md')
# The quick start's commands at a tiny size: a synthetic task instead of WMT14, a small model,
# a handful of steps with a checkpoint each (the five that --mode=average wants).
TINY_TRAINING = ['--config.dataset=synthetic', '--config.model.num_layers=1',
                 '--config.model.d_model=32', '--config.model.d_ff=64',
                 '--config.vocab_size=40', '--config.max_length=12',
                 '--config.tokens_per_batch=192', '--config.warmup_steps=10',
                 '--config.num_train_steps=6', '--config.checkpoint_every_steps=1',
                 '--config.log_every_steps=3', '--config.eval_every_steps=6',
                 '--config.decode_tokens_per_batch=64', '--config.decode_extra_length=5']


def quick_start() -> list[str]:
  """The commands of the README's first bash block under its GPU quick start."""
  text = open(README, encoding='utf-8').read()
  section = text[text.index("## Train the paper's base model on your GPUs"):]
  block = re.search(r'```bash\n(.*?)```', section, re.S).group(1)
  return [line.split('  #')[0].strip() for line in block.splitlines()
          if line.strip() and not line.startswith('#')]


@pytest.mark.e2e
def test_the_gpu_quick_start_runs(tmp_path):
  commands = quick_start()
  install, accelerator, *runs = commands
  assert install == "python3 -m venv .venv && .venv/bin/python -m pip install -e '.[wmt]'"
  assert accelerator == ".venv/bin/python -m pip install 'jax[cuda12]==0.10.2'"
  jax_pin = re.search(r'"jax==([\d.]+)"', open(os.path.join(ROOT, 'pyproject.toml')).read())
  assert accelerator.endswith(f"=={jax_pin.group(1)}'")  # the accelerator's JAX is the pin's
  assert [shlex.split(run)[0] for run in runs] == ['.venv/bin/t2t-jax'] * len(runs)
  env = cpu_env(2)
  for run in runs:
    args = [a.replace('runs/base', str(tmp_path / 'base')) for a in shlex.split(run)[1:]]
    if any(a.startswith('--config=') for a in args):  # training: a tiny size
      args += TINY_TRAINING
    done = subprocess.run([sys.executable, '-m', 't2t_jax', *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f'{run}\n{done.stderr[-3000:]}'
  # The second training command resumed the first run (already finished) with micro-batches.
  assert os.listdir(tmp_path / 'base' / 'averaged') == ['6']
  scores = [os.path.join(folder, 'scores.json') for folder in
            (tmp_path / 'base' / 'eval').iterdir()]
  assert len(scores) == 1 and os.path.exists(scores[0])  # where the quick start says
