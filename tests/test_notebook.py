"""notebooks/colab.ipynb: its structure (fast), and a tiny CPU demo run of the whole notebook.

The run executes every cell with nbclient in a kernel of this interpreter (the venv's python),
with the T2T_NOTEBOOK_* environment variables shrinking the demo to a few seconds of training
and keeping TensorBoard's server from starting.
"""
import ast
import json
import os
import re
import shlex
import shutil
import sys
import types

import pytest

from helpers import ROOT, TEST_XLA_FLAGS

nbformat = pytest.importorskip('nbformat')

NOTEBOOK = os.path.join(ROOT, 'notebooks', 'colab.ipynb')

# Keys of experiments/demo.py (and wmt_ende_base.py), shrunk for a test run.
TINY_OVERRIDES = ' '.join([
    '--config.num_train_steps=20',
    '--config.demo_num_train=2000',
    '--config.demo_num_eval=50',
    '--config.vocab_size=500',  # 300 is below the corpus's required characters
    '--config.model.num_layers=1',
    '--config.model.d_model=32',
    '--config.model.d_ff=64',
    '--config.checkpoint_every_steps=10',
    '--config.average_last=2',
    '--config.eval_every_steps=20',
    '--config.log_every_steps=10',
    '--config.decode_extra_length=10',  # an untrained model may never stop on its own
])


def read_notebook():
  with open(NOTEBOOK, encoding='utf-8') as f:
    return nbformat.read(f, as_version=4)


def code_cells(nb):
  return [cell for cell in nb.cells if cell.cell_type == 'code']


def tagged_cell(nb, tag):
  cells = [cell for cell in code_cells(nb) if tag in cell.metadata.get('tags', [])]
  assert len(cells) == 1, f'expected one code cell tagged {tag!r}, found {len(cells)}'
  return cells[0]


def pinned_jax_version():
  with open(os.path.join(ROOT, 'pyproject.toml'), encoding='utf-8') as f:
    return re.search(r'"jax==([^"]+)"', f.read()).group(1)


def test_notebook_is_valid_and_clean():
  nb = read_notebook()
  nbformat.validate(nb)
  assert nb.metadata.kernelspec.name == 'python3'
  for cell in code_cells(nb):
    assert not cell.outputs and cell.execution_count is None, 'commit the notebook without outputs'
    ast.parse(cell.source)  # plain Python: no ! or % magics, so nbclient runs it as is
  assert any(cell.cell_type == 'markdown' for cell in nb.cells)


def test_first_code_cell_holds_the_settings():
  nb = read_notebook()
  first = code_cells(nb)[0]
  assert first is tagged_cell(nb, 'parameters')
  # Colab form fields, empty: no placeholder that "Run all" would stop at.
  assert "REPO_URL = ''  # @param {type:\"string\"}\n" in first.source
  assert "REPO_REF = ''  # @param {type:\"string\"}\n" in first.source
  for name in ('T2T_NOTEBOOK_REPO_URL', 'T2T_NOTEBOOK_WORKDIR', 'T2T_NOTEBOOK_OVERRIDES',
               'T2T_NOTEBOOK_SKIP_INSTALL',
               'T2T_NOTEBOOK_RUNTIME', 'T2T_NOTEBOOK_TENSORBOARD'):
    assert name in first.source
  assert f"JAX_VERSION = '{pinned_jax_version()}'" in first.source


# A TPU or GPU runtime is one 16 GiB accelerator on today's Colab (a TPU v5e chip, a T4).
@pytest.mark.parametrize('runtime,config', [('tpu', 'experiments/wmt_ende_base_colab.py'),
                                            ('gpu', 'experiments/wmt_ende_base_colab.py'),
                                            ('cpu', 'experiments/demo.py')])
def test_runtime_selects_the_config(runtime, config):
  namespace = {'RUNTIME': runtime}
  exec(tagged_cell(read_notebook(), 'config').source, namespace)  # the cell as Colab runs it
  assert namespace['CONFIG'] == config
  assert os.path.exists(os.path.join(ROOT, config))


def test_the_accelerator_path_is_explained_with_its_numbers():
  """The markdown says what the Colab config changes and why: one v5e chip, bf16, 8
  micro-batches of the §5.1 batch, and the Drive arithmetic of keeping 5 checkpoints."""
  text = '\n'.join(cell.source for cell in read_notebook().cells if cell.cell_type == 'markdown')
  for phrase in ('experiments/wmt_ende_base_colab.py', 'v5e', '16 GiB', 'bfloat16',
                 "config.model.dtype='bfloat16'", 'config.grad_accum_steps=8',
                 'config.keep_checkpoints=5', '15 GB', '0.76 GB', '%tensorboard'):
    assert phrase in text, phrase
  assert 'v2-8 has 8 cores' not in text  # Colab's old TPU runtime


def run_code_cell(tag_or_index, cwd, **namespace):
  """The notebook's code cell (a tag, or its index among code cells) run in `cwd` as Colab
  runs it, in `namespace`, which it returns; an exception it raises is returned instead."""
  nb = read_notebook()
  cell = (code_cells(nb)[tag_or_index] if isinstance(tag_or_index, int)
          else tagged_cell(nb, tag_or_index))
  namespace = {'os': os, 'shlex': shlex, 'subprocess': __import__('subprocess'), **namespace}
  here = os.getcwd()
  os.chdir(cwd)
  try:
    exec(cell.source, namespace)
  except Exception as e:  # the caller looks at it
    return e
  finally:
    os.chdir(here)
  return namespace


CODE_CELL = 2  # the code cell that finds or clones the repository


def test_the_repository_comes_from_the_github_url_colab_opened():
  """Colab's Jupyter server names a notebook opened from GitHub by its URL, quoted."""
  namespace = run_code_cell(CODE_CELL, ROOT, REPO_URL='', REPO_REF='')
  github_repository = namespace['github_repository']
  path = ('fileId=https%3A%2F%2Fgithub.com%2Fsomeone%2Ft2t_jax%2Fblob%2Fdev-2%2Fnotebooks'
          '%2Fcolab.ipynb')
  assert github_repository(path) == ('https://github.com/someone/t2t_jax.git', 'dev-2')
  assert github_repository('https://colab.research.google.com/github/a/b.c/blob/main/x.ipynb'
                           ) == ('https://github.com/a/b.c.git', 'main')
  assert github_repository('fileId=1AbCdEf') is None  # a notebook on Google Drive
  assert namespace['opened_from']() is None  # not on Colab
  assert namespace['REPO_DIR'] == ROOT  # inside a checkout, that checkout


def test_outside_a_checkout_without_a_location_it_says_what_to_set(tmp_path):
  error = run_code_cell(CODE_CELL, tmp_path, REPO_URL='', REPO_REF='')
  [line] = error._render_traceback_()  # what IPython shows instead of a traceback
  assert line == ('Stopped: this notebook is not inside a checkout of t2t_jax and was not '
                  'opened from GitHub: set REPO_URL in the first code cell to the git URL of '
                  't2t_jax.')
  assert not os.path.exists(tmp_path / 't2t_jax')


def code_index(nb, cell):
  return next(i for i, c in enumerate(code_cells(nb)) if c is cell)


def test_tensorboard_starts_before_training():
  """TensorBoard is shown inline before the training cell, so its curves fill in live."""
  nb = read_notebook()
  board, train = tagged_cell(nb, 'tensorboard'), tagged_cell(nb, 'train')
  assert train.source.strip() == "t2t('train')"
  assert code_index(nb, tagged_cell(nb, 'config')) < code_index(nb, board)  # WORKDIR is set
  assert code_index(nb, board) < code_index(nb, train)
  assert "notebook.start('--logdir ' + shlex.quote(logdir))" in board.source
  assert "start_tensorboard(os.path.join(WORKDIR, 'tensorboard'))" in board.source
  assert "TENSORBOARD = os.environ.get('T2T_NOTEBOOK_TENSORBOARD', '1') != '0'" in (
      tagged_cell(nb, 'parameters').source)


def run_tensorboard_cell(monkeypatch, *, enabled, shell):
  """Runs the TensorBoard cell with tensorboard.notebook.start and IPython.get_ipython
  replaced; returns what the cell printed and the argument strings start was called with."""
  started = []
  # The cell sets TENSORBOARD_BINARY to the program it found: restored after the test.
  monkeypatch.setenv('TENSORBOARD_BINARY', 'tensorboard')
  monkeypatch.setattr('tensorboard.notebook.start', started.append)
  monkeypatch.setattr('IPython.get_ipython', lambda: shell)
  printed = []
  namespace = {'TENSORBOARD': enabled, 'WORKDIR': '/runs/my run', 'PYTHON': sys.executable,
               'os': os, 'shlex': shlex, 'shutil': shutil,
               'print': lambda *args: printed.append(' '.join(map(str, args)))}
  exec(tagged_cell(read_notebook(), 'tensorboard').source, namespace)
  return printed, started


def test_tensorboard_cell_starts_the_server_in_a_notebook(monkeypatch):
  pytest.importorskip('IPython')
  pytest.importorskip('tensorboard.notebook')
  printed, started = run_tensorboard_cell(monkeypatch, enabled=True,
                                          shell=types.SimpleNamespace())
  assert started == ["--logdir '/runs/my run/tensorboard'"]  # as %tensorboard --logdir
  assert printed == ['TensorBoard: on, reading /runs/my run/tensorboard']


@pytest.mark.parametrize('enabled,shell,why', [
    (False, types.SimpleNamespace(), 'off (T2T_NOTEBOOK_TENSORBOARD=0)'),  # the test run
    (True, None, 'off (not in a notebook)'),  # python outside IPython
])
def test_tensorboard_cell_starts_nothing_outside_a_notebook_or_when_off(monkeypatch, enabled,
                                                                        shell, why):
  pytest.importorskip('IPython')
  pytest.importorskip('tensorboard.notebook')
  printed, started = run_tensorboard_cell(monkeypatch, enabled=enabled, shell=shell)
  assert started == [] and printed == [f'TensorBoard: {why}']


def test_accelerator_installs_and_modes():
  source = '\n'.join(cell.source for cell in code_cells(read_notebook()))
  # The accelerator backends come from JAX_VERSION, which must be the pinned jax.
  assert "f'jax[tpu]=={JAX_VERSION}'" in source
  assert "f'jax[cuda12]=={JAX_VERSION}'" in source
  assert "package = REPO_DIR if RUNTIME == 'cpu' else REPO_DIR + '[wmt]'" in source
  assert "'-m', 'pip', 'install', '-q', '-e', package" in source
  assert 'sys.executable' in source
  for mode in ('train', 'average', 'translate', 'eval'):
    assert f"t2t('{mode}'" in source
  assert "'-m', 't2t_jax.main'" in source and 'subprocess' in source


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch):
  """A kernelspec that runs this interpreter, found first through JUPYTER_PATH."""
  name = 't2t-jax-test-python'
  spec_dir = tmp_path / 'jupyter' / 'kernels' / name
  spec_dir.mkdir(parents=True)
  (spec_dir / 'kernel.json').write_text(json.dumps({
      'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
      'display_name': 't2t_jax test (venv python)',
      'language': 'python',
  }))
  monkeypatch.setenv('JUPYTER_PATH', str(tmp_path / 'jupyter'))
  return name


@pytest.mark.slow
@pytest.mark.e2e
def test_notebook_runs_the_demo_on_cpu(tmp_path, monkeypatch, venv_kernel):
  """"Run all" in a fresh folder, as on a new Colab runtime: the notebook clones the
  repository (this checkout's last commit) from T2T_NOTEBOOK_REPO_URL and runs the demo."""
  nbclient = pytest.importorskip('nbclient')
  pytest.importorskip('ipykernel')
  runtime, workdir = tmp_path / 'content', tmp_path / 'run'
  runtime.mkdir()
  monkeypatch.setenv('T2T_NOTEBOOK_REPO_URL', ROOT)
  # The tiny demo spends most of its time compiling: TEST_XLA_FLAGS halve that.
  monkeypatch.setenv('XLA_FLAGS', f'--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}')
  monkeypatch.setenv('T2T_NOTEBOOK_WORKDIR', str(workdir))
  monkeypatch.setenv('T2T_NOTEBOOK_OVERRIDES', TINY_OVERRIDES)
  monkeypatch.setenv('T2T_NOTEBOOK_SKIP_INSTALL', '1')
  monkeypatch.setenv('T2T_NOTEBOOK_RUNTIME', 'cpu')  # the demo path even on a GPU machine
  monkeypatch.setenv('T2T_NOTEBOOK_TENSORBOARD', '0')  # no TensorBoard server from a test
  monkeypatch.setenv('MPLBACKEND', 'module://matplotlib_inline.backend_inline')
  nb = read_notebook()
  client = nbclient.NotebookClient(
      nb, kernel_name=venv_kernel, timeout=600,
      resources={'metadata': {'path': str(runtime)}})
  try:
    client.execute()
  finally:  # keep the executed notebook for a look when something fails
    nbformat.write(nb, str(tmp_path / 'executed.ipynb'))

  outputs = []
  images = 0
  for cell in code_cells(nb):
    for output in cell.outputs:
      assert output.output_type != 'error', f"{output.ename}: {output.evalue}"
      if output.output_type == 'stream':
        outputs.append(output.text)
      images += 'image/png' in output.get('data', {})
  text = ''.join(outputs)
  assert images >= 1, 'no training curve'
  assert 'TensorBoard: off (T2T_NOTEBOOK_TENSORBOARD=0)\n' in text  # and so no server
  assert f'code: {runtime / "t2t_jax"}\n' in text  # the clone

  eval_dir = workdir / 'eval'
  [name] = os.listdir(eval_dir)
  assert name.rsplit('-', 1)[0] == 'test-averaged-20-beam4-alpha0.6-extra10'  # + fingerprint
  scores = json.loads((eval_dir / os.listdir(eval_dir)[0] / 'scores.json').read_text())
  assert isinstance(scores['sacrebleu'], float) and 0 <= scores['sacrebleu'] <= 100
  assert f'"sacrebleu": {scores["sacrebleu"]}' in text  # printed by the notebook
  assert scores['params'].startswith('averaged')

  sources = (workdir / 'examples.en').read_text(encoding='utf-8').splitlines()
  translations = (workdir / 'examples.de').read_text(encoding='utf-8').splitlines()
  test_en = (workdir / 'demo_corpus' / 'test.en').read_text(encoding='utf-8').splitlines()
  assert len(sources) == len(translations) == 5 and sources == test_en[:5]
  for source, translation in zip(sources, translations, strict=True):
    assert f'EN: {source}\nDE: {translation}\n' in text
