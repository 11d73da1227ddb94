"""The package's imports follow the data flow (README: "Files follow the data flow, and imports
point down it").

A reader should be able to read the package bottom up, each file using only what came before
it, and a change to a file should affect only the files above it. Two rules keep it so:
  * every module is placed in a layer of pyproject.toml's [tool.importlinter] contracts, and
    imports only modules below it (import-linter; its layers admit no cycle);
  * no import of the package's own modules inside a function or class (a late import hides a
    dependency, usually an upward one or a cycle); third-party modules only for the heavy
    optional dependencies in LAZY, each with a comment giving the reason (read here with
    `ast`, never imported: import-linter sees where an import points, not where it sits).
Each failure is one line per problem, naming file:line.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = 't2t_jax'

# Optional heavy dependencies that may be imported inside a function, so that the paths that
# do not need them (the demo, the tests) do not pay seconds to import them. Submodules too.
LAZY = ('tensorflow', 'tensorflow_datasets', 'matplotlib', 'tensorboard', 'sacremoses')

# Directives to tools: they silence a check but give no reason (one may follow them).
PRAGMA = re.compile(r'pylint:\s*\S+|noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?|'
                    r'type:\s*ignore\S*|pragma:\s*no\s*cover|(fmt|isort|ruff):\s*\S+')

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclasses.dataclass(frozen=True)
class Import:
  """One imported module, as the file names it, made absolute."""
  line: int
  target: str  # dotted module name; `from m import x` targets m.x if that is a module, else m
  nested: bool  # inside a function or class: runs late, out of sight of the module's header
  commented: bool  # a reason comment on its line(s), or directly above its run of imports
  scope: str = ''  # the innermost function or class it sits in ('' at module level)


def is_project(module: str) -> bool:
  return module == PACKAGE or module.startswith(PACKAGE + '.')


def is_lazy(module: str) -> bool:
  return any(module == name or module.startswith(name + '.') for name in LAZY)


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  """`t2t_jax/data/demo_corpus/lexicon.py` -> `t2t_jax.data.demo_corpus.lexicon`; packages
  by their name."""
  parts = path.relative_to(root).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def package_modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Every module of the package under `root`, subpackages included, by dotted name."""
  return {module_name(path, root): path for path in sorted((root / PACKAGE).rglob('*.py'))}


def _reason_lines(source: str) -> tuple[set[int], set[int]]:
  """The lines carrying a comment that is more than a pragma, and those that are only one."""
  with_reason, comment_only = set(), set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type != tokenize.COMMENT:
      continue
    if any(char.isalpha() for char in PRAGMA.sub('', token.string)):
      with_reason.add(token.start[0])
      if not token.line[:token.start[1]].strip():
        comment_only.add(token.start[0])
  return with_reason, comment_only


def _walk(node: ast.AST, scope: str = '') -> Iterator[tuple[ast.stmt, str]]:
  """Import statements with the innermost function or class they sit in ('' at module
  level: if/try/with do not count)."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.Import, ast.ImportFrom)):
      yield child, scope
    else:
      yield from _walk(child, child.name if isinstance(child, _SCOPES) else scope)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
  """The module a `from ... import` reads from, relative imports resolved against `module`."""
  if not node.level:
    return node.module or ''
  package = (module if is_package else module.rpartition('.')[0]).split('.')
  base = package[:len(package) - node.level + 1]
  return '.'.join(base + ([node.module] if node.module else []))


def _targets(node: ast.stmt, module: str, is_package: bool, modules: set[str]) -> list[str]:
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  base = _absolute(node, module, is_package)
  # `from t2t_jax.data import pipeline` imports the module t2t_jax.data.pipeline; `from
  # t2t_jax.model.transformer import Transformer` the module t2t_jax.model.transformer. The
  # parent package's __init__ that Python runs on the way is not an edge: it would put every
  # subpackage module in a cycle with its __init__.
  return [f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base
          for alias in node.names]


def source_imports(source: str, module: str, is_package: bool, modules: set[str],
                   filename: str = '<source>') -> list[Import]:
  """Every module `source` imports, at any depth, with its line and placement."""
  nodes = list(_walk(ast.parse(source, filename)))
  with_reason, comment_only = _reason_lines(source)
  import_lines = {line for node, _ in nodes for line in range(node.lineno, node.end_lineno + 1)}
  imports = []
  for node, scope in nodes:
    above = node.lineno - 1
    while above in import_lines and above not in with_reason:
      above -= 1  # a comment above a run of imports speaks for the whole run
    commented = (above in comment_only or
                 any(line in with_reason for line in range(node.lineno, node.end_lineno + 1)))
    imports += [Import(node.lineno, target, bool(scope), commented, scope)
                for target in _targets(node, module, is_package, modules)]
  return imports


def project_imports(path: pathlib.Path, root: pathlib.Path,
                    modules: set[str]) -> list[Import]:
  """The imports of the package's own modules in the file at `path`."""
  return [imp for imp in file_imports(path, root, modules) if is_project(imp.target)]


def file_imports(path: pathlib.Path, root: pathlib.Path, modules: set[str]) -> list[Import]:
  return source_imports(path.read_text(encoding='utf-8'), module_name(path, root),
                        path.name == '__init__.py', modules, str(path))


def nesting_problems(label: str, imports: list[Import]) -> list[str]:
  """Imports inside a function or class that the rules do not allow, as `file:line: why`."""
  problems = []
  for imp in [imp for imp in imports if imp.nested]:
    where = f'{label}:{imp.line}: {imp.target} imported inside a function or class'
    if is_project(imp.target):
      problems.append(f'{where}: import the package\'s own modules at the top of the file')
    elif not is_lazy(imp.target):
      problems.append(f'{where}: only {", ".join(LAZY)} may be imported lazily')
    elif not imp.commented:
      problems.append(f'{where} with no comment giving the reason (on the line or just above)')
  return problems


def _fail(problems: list[str], what: str) -> None:
  if problems:
    pytest.fail(f'{len(problems)} {what}:\n' + '\n'.join(problems), pytrace=False)


# The package itself.


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


def test_no_late_imports():
  modules = package_modules(ROOT)
  problems = []
  for module, path in modules.items():
    imports = file_imports(path, ROOT, set(modules))
    if module == PACKAGE:  # its public names load on first use (the next test)
      imports = [imp for imp in imports if imp.scope != '__getattr__']
    problems += nesting_problems(str(path.relative_to(ROOT)), imports)
  _fail(problems, 'import(s) inside a function or class')


def test_no_module_is_named_like_a_package_beside_it():
  """`train.py` beside `training/` would leave a reader guessing which holds the step."""
  names = {path.stem for path in (ROOT / PACKAGE).glob('*.py')}
  packages = {path.parent.name for path in (ROOT / PACKAGE).glob('*/__init__.py')}
  clashes = [f'{PACKAGE}/{name}.py beside {PACKAGE}/{package}/'
             for name in sorted(names) for package in sorted(packages)
             if name.rstrip('s') == package.rstrip('s') or package.startswith(name)]
  _fail(clashes, 'module(s) named like a subpackage')


def test_package_init_imports_nothing_of_the_project():
  """Every submodule import runs the package __init__, so it imports nothing of the project
  when it runs; its public names (`from t2t_jax import Translator`) load on first use,
  through PEP 562's module __getattr__."""
  init = ROOT / PACKAGE / '__init__.py'
  _fail([f'{init.relative_to(ROOT)}:{imp.line}: imports {imp.target}; every submodule import '
         'runs this file, so it must import nothing of the project (outside __getattr__)'
         for imp in project_imports(init, ROOT, set(package_modules(ROOT)))
         if imp.scope != '__getattr__'],
        'project import(s) in the package __init__')


@pytest.mark.e2e
def test_a_submodule_import_loads_no_jax_and_the_public_names_load_on_use():
  """What a new interpreter imports: this test process has imported everything."""
  code = ('import sys, t2t_jax.platform.errors, t2t_jax.platform.progress; '
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


# The late-import checker, on a synthetic file: a broken checker must not pass silently.


def test_checker_allows_only_commented_lazy_heavy_imports():
  source = '\n'.join([
      'try:', '  import tensorflow', 'except ImportError:', '  pass',  # module level: fine
      'def ok():',
      '  # TF is slow to import; only this path needs it.',
      '  import tensorflow as tf',
      '  import tensorflow_datasets as tfds',  # covered by the comment above the run
      '  from matplotlib import pyplot  # heatmaps only',
      'def bad():',
      '  import tensorboard.compat  # pylint: disable=g-import-not-at-top',
      '  import matplotlib',
      '  from jax.experimental import multihost_utils  # multi-process only',
      'class C:',
      '  import numpy as np',
      'def also_ok():',
      '  import tensorboard  # noqa: E402 (TensorBoard imports TF)',
  ])
  imports = source_imports(source, 't2t_jax.m', False, {'t2t_jax.m'})
  allowed = ', '.join(LAZY)
  assert nesting_problems('m.py', imports) == [
      'm.py:11: tensorboard.compat imported inside a function or class with no comment giving '
      'the reason (on the line or just above)',
      'm.py:12: matplotlib imported inside a function or class with no comment giving the '
      'reason (on the line or just above)',
      f'm.py:13: jax.experimental imported inside a function or class: only {allowed} may '
      'be imported lazily',
      f'm.py:15: numpy imported inside a function or class: only {allowed} may be imported '
      'lazily']
