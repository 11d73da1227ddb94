"""The package's imports follow the data flow (README: "Files follow the data flow, and imports
point down it").

A reader should be able to read the package bottom up, each file using only what came before
it, and a change to a file should affect only the files above it. Two rules keep it so:
  * every module is placed in a layer of pyproject.toml's [tool.importlinter] contracts, and
    imports only modules below it (import-linter; its layers admit no cycle);
  * no import inside a function or class (ruff's PLC0415, `make lint`): a late import hides a
    dependency, usually an upward one or a cycle. The exceptions are the heavy optional
    libraries in LAZY, each marked `# noqa: PLC0415 (reason)`, which ruff cannot restrict to
    those libraries nor make give a reason: the test below does.
"""
from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = 't2t_jax'

# Optional heavy dependencies that may be imported inside a function, so that the paths that
# do not need them (the demo, the tests) do not pay seconds to import them. Submodules too.
LAZY = ('tensorflow', 'tensorflow_datasets', 'matplotlib', 'tensorboard', 'sacremoses',
        'uvicorn', 'ctranslate2')
# The package's modules that import an optional extra at their top (FastAPI): imported late
# by the mode that needs them, so that the others run without the extra.
LAZY_MODULES = ('t2t_jax.apps.server',)
_LATE = re.compile(r'#\s*noqa:\s*PLC0415\b(.*)$')


def _fail(problems: list[str], what: str) -> None:
  if problems:
    pytest.fail(f'{len(problems)} {what}:\n' + '\n'.join(problems), pytrace=False)


def late_import_problems(source: str, label: str) -> list[str]:
  """The `# noqa: PLC0415` imports of `source` that import something other than LAZY, or give
  no reason (in the noqa's parentheses, or on a comment line just above their run)."""
  lines = source.splitlines()
  problems = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
      continue
    late = _LATE.search(lines[node.end_lineno - 1])
    if late is None:
      continue
    names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
             else [node.module or ''])
    if isinstance(node, ast.ImportFrom) and all(f'{node.module}.{alias.name}' in LAZY_MODULES
                                                for alias in node.names):
      names = []
    where = f'{label}:{node.lineno}'
    problems += [f'{where}: {name} imported late: only {", ".join(LAZY)} may be'
                 for name in names if name.split('.')[0] not in LAZY]
    above = node.lineno - 2  # a comment above a run of late imports speaks for the run
    while above >= 0 and _LATE.search(lines[above]) and not lines[above].lstrip().startswith('#'):
      above -= 1
    if not re.search(r'[A-Za-z]', late.group(1)) and not (
        above >= 0 and lines[above].lstrip().startswith('#')):
      problems.append(f'{where}: a late import with no reason (in the noqa\'s parentheses, or '
                      'a comment line above)')
  return problems


def package_files() -> list[pathlib.Path]:
  return sorted((ROOT / PACKAGE).rglob('*.py'))


def test_late_imports_are_the_heavy_libraries_with_a_reason():
  problems = []
  for path in package_files():
    source = path.read_text(encoding='utf-8')
    if path == ROOT / PACKAGE / '__init__.py':
      continue  # its public names load on first use (test_package_init_...)
    problems += late_import_problems(source, str(path.relative_to(ROOT)))
  _fail(problems, 'late import(s)')


def test_the_late_import_rule_fails_on_what_it_forbids():
  """On a synthetic file: a broken rule must not pass silently."""
  source = '\n'.join([
      'def ok():',
      '  # TF is slow to import; only this path needs it.',
      '  import tensorflow as tf  # noqa: PLC0415',
      '  from matplotlib import pyplot  # noqa: PLC0415 (heatmaps only)',
      'def bad():',
      '  x = 1',
      '  import tensorboard.compat  # noqa: PLC0415',
      '  from jax.experimental import multihost_utils  # noqa: PLC0415 (multi-process only)',
  ])
  assert late_import_problems(source, 'm.py') == [
      "m.py:7: a late import with no reason (in the noqa's parentheses, or a comment line "
      'above)',
      f'm.py:8: jax.experimental imported late: only {", ".join(LAZY)} may be']


LINT_IMPORTS = pathlib.Path(sys.executable).parent / 'lint-imports'


def lint_imports(root: pathlib.Path) -> subprocess.CompletedProcess:
  """import-linter's verdict on the package under `root`, by `root`/pyproject.toml's
  contracts."""
  return subprocess.run([str(LINT_IMPORTS), '--config', str(root / 'pyproject.toml'),
                         '--no-cache'], cwd=root, env={**os.environ, 'PYTHONPATH': str(root)},
                        capture_output=True, text=True, timeout=300)


def test_every_module_sits_in_its_layer_and_imports_only_below():
  result = lint_imports(ROOT)
  assert result.returncode == 0, result.stdout[-3000:]
  assert re.search(r'Contracts: \d+ kept, 0 broken', result.stdout)


@pytest.mark.e2e
def test_the_contracts_catch_an_upward_import_and_an_unplaced_module(tmp_path):
  """The package copied, with errors.py (the lowest module) importing the loss, the search
  importing training (its sibling: a trained run, run/, joins them), and a new module nobody
  placed: import-linter names all three."""
  shutil.copytree(ROOT / PACKAGE, tmp_path / PACKAGE,
                  ignore=shutil.ignore_patterns('__pycache__'))
  shutil.copy(ROOT / 'pyproject.toml', tmp_path)
  errors = tmp_path / PACKAGE / 'platform' / 'errors.py'
  errors.write_text(errors.read_text() + '\nfrom t2t_jax.training import losses\n')
  decode = tmp_path / PACKAGE / 'decoding' / 'decode.py'
  decode.write_text(decode.read_text() + '\nfrom t2t_jax.training import checkpoints\n')
  (tmp_path / PACKAGE / 'training' / 'unplaced.py').write_text('')
  result = lint_imports(tmp_path)
  assert result.returncode == 1
  assert 't2t_jax.platform.errors -> t2t_jax.training.losses' in result.stdout
  assert 't2t_jax.decoding.decode -> t2t_jax.training.checkpoints' in result.stdout
  assert 't2t_jax.training.unplaced' in result.stdout
  assert re.search(r'Contracts: \d+ kept, [1-9]\d* broken', result.stdout)


def named_alike(module: str, package: str) -> bool:
  """`trainer` and `training`, `model` and `models`: a module and a package whose names
  share a stem of five letters or more (or all of the shorter one)."""
  stem = os.path.commonprefix([module, package])
  return len(stem) >= min(5, len(module), len(package))


def test_no_module_is_named_like_a_package_beside_it():
  """`trainer.py` beside `training/` left a reader guessing which holds the loop."""
  assert named_alike('trainer', 'training') and named_alike('model', 'models')
  assert not named_alike('main', 'model') and not named_alike('cli', 'config')
  names = {path.stem for path in (ROOT / PACKAGE).glob('*.py')}
  packages = {path.parent.name for path in (ROOT / PACKAGE).glob('*/__init__.py')}
  clashes = [f'{PACKAGE}/{name}.py beside {PACKAGE}/{package}/'
             for name in sorted(names - {'__init__', '__main__'}) for package in sorted(packages)
             if named_alike(name, package)]
  _fail(clashes, 'module(s) named like a subpackage')


def test_package_init_imports_nothing_of_the_project():
  """Every submodule import runs the package __init__, so it imports nothing of the project
  when it runs; its public names (`from t2t_jax import Translator`) load on first use,
  through PEP 562's module __getattr__."""
  init = ROOT / PACKAGE / '__init__.py'
  tree = ast.parse(init.read_text(encoding='utf-8'))
  inside = {id(node) for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef) and function.name == '__getattr__'
            for node in ast.walk(function)}
  _fail([f'{init.relative_to(ROOT)}:{node.lineno}: imports {node.module}; every submodule '
         'import runs this file, so it must import nothing of the project (outside __getattr__)'
         for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and id(node) not in inside
         and (node.module or '').split('.')[0] == PACKAGE],
        'project import(s) in the package __init__')


@pytest.mark.e2e
def test_a_submodule_import_loads_no_jax_and_the_public_names_load_on_use():
  """What a new interpreter imports: this test process has imported everything."""
  code = ('import sys, t2t_jax.platform.errors, t2t_jax.platform.progress, t2t_jax.cli; '
          'assert "jax" not in sys.modules; from t2t_jax import Translator, Hypothesis; '
          'from t2t_jax.apps import translator; '
          'assert (Translator, Hypothesis) == (translator.Translator, translator.Hypothesis); '
          'import t2t_jax; assert sorted(t2t_jax.__all__) == ["Hypothesis", "Translator"]; '
          'from t2t_jax import Nothing')
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 1, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "ImportError: cannot import name 'Nothing' from 't2t_jax' "
      f"({ROOT / PACKAGE / '__init__.py'})")
