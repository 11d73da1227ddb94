"""benchmarks/accelerator.py (its parts in benchmarks/accelerator_parts/) runs end to end at
its tiny size on a CPU, so that it works the first time it meets a GPU or TPU; its figures are
checked for sense, not speed."""
import json
import subprocess
import sys

import pytest

from helpers import ROOT, cpu_env


@pytest.mark.slow
@pytest.mark.e2e
def test_the_accelerator_benchmark_runs_its_parts_in_process(tmp_path):
  out = tmp_path / 'figures.jsonl'
  env = cpu_env(None)  # one CPU device, as on one accelerator
  # The compile and demo parts run processes of their own: test_benchmarks.py runs them on
  # those processes' output, and the demo's modes run in test_notebook.py and test_readme.py.
  parts = 'matmul,train,forms,profile,flags,peer,decode'
  result = subprocess.run([sys.executable, 'benchmarks/accelerator.py', '--size=tiny',
                           f'--out={out}', f'--parts={parts}',
                           '--forms=xla,no dropout,all levers',
                           '--decode-forms=xla,cpu forms', f'--profile-dir={tmp_path}/profile'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in open(out)]
  parts = [line['part'] for line in lines]
  assert parts[0] == 'device' and lines[0]['size'] == 'tiny'
  assert parts.count('matmul') == 2 and parts.count('train') == 4 and parts.count('peer') == 1
  assert parts.count('decode') == 3 and parts.count('decode_agreement') == 1
  assert [line['sentences'] for line in lines if line['part'] == 'decode_sweep'] == [2, 4, 8]
  # Each XLA_FLAGS set in a process of its own: the GPU flags' names parse here too.
  assert [line['form'] for line in lines if line['part'] == 'flags'] == [
      'default', 'command buffers off', 'command buffers, every kind']
  for line in lines:
    if line['part'] in ('train', 'peer'):
      assert line['ms'] > 0 and 0 < line['fraction_of_peak']
    if line['part'] == 'train':
      # The analytic count (model.train_step_flops) against XLA's own, which also counts
      # the elementwise work: the same order of magnitude.
      assert 0.5 < line['xla_gflop'] / line['analytic_gflop'] < 3
  forms = [line for line in lines if line['part'] == 'forms']
  assert [line['form'] for line in forms] == ['xla', 'no dropout', 'all levers']
  assert forms[0]['vs_xla'] == 1 and forms[1]['vs_xla'] > 0 and forms[2]['vs_xla'] > 0
  decode_forms = [(line['form'], line['sentences'], line['ids_equal_xla_share'])
                  for line in lines if line['part'] == 'decode_forms']
  # The CPU forms' top-k and maximum give lax.top_k's and jnp.max's beams.
  assert decode_forms == [('xla', 4, 1), ('xla', 8, 1), ('cpu forms', 4, 1), ('cpu forms', 8, 1)]
  profile = [line for line in lines if line['part'] == 'profile']
  assert profile[0]['busy_ms_per_step'] > 0 and any('kernel' in line for line in profile)
  assert 'HloModule' in (tmp_path / 'profile' / 'base_step_hlo.txt').read_text()[:200]
  assert (tmp_path / 'profile' / 'base_step_trace.json.gz').stat().st_size > 0
  assert (out.parent / 'figures.md').read_text().startswith('| part | what | figure |')

