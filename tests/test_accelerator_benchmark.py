"""benchmarks/accelerator.py runs end to end at its tiny size on a CPU, so that it works
the first time it meets a GPU or TPU; its figures are checked for sense, not speed."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT, cpu_env


@pytest.mark.slow
def test_the_accelerator_benchmark_runs_every_part(tmp_path):
  out = tmp_path / 'figures.jsonl'
  env = cpu_env(None)  # one CPU device, as on one accelerator
  result = subprocess.run([sys.executable, 'benchmarks/accelerator.py', '--size=tiny',
                           f'--out={out}'], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in open(out)]
  parts = [line['part'] for line in lines]
  assert parts[0] == 'device' and lines[0]['size'] == 'tiny'
  assert parts.count('matmul') == 2 and parts.count('train') == 4 and parts.count('peer') == 1
  assert parts.count('decode') == 3 and parts.count('decode_agreement') == 1
  assert [line['cache'] for line in lines if line['part'] == 'compile'] == ['cold', 'warm']
  assert [line['mode'] for line in lines if line['part'] == 'demo'] == ['train', 'average',
                                                                        'eval']
  for line in lines:
    if line['part'] in ('train', 'peer'):
      assert line['ms'] > 0 and 0 < line['fraction_of_peak']
    if line['part'] == 'train':
      # The analytic count (model.train_step_flops) against XLA's own, which also counts
      # the elementwise work: the same order of magnitude.
      assert 0.5 < line['xla_gflop'] / line['analytic_gflop'] < 3
  demo_eval = lines[-1]
  assert demo_eval['compilations'] > 0 and 0 <= demo_eval['sacrebleu'] <= 100
  assert (out.parent / 'figures.md').read_text().startswith('| part | what | figure |')
