"""The package's imports follow the data flow (README: "Files follow the data flow, and imports
point down it").

A reader should be able to read the package bottom up, each file using only what came before
it, and a change to a file should affect only the files above it. Three rules keep it so:
  * no cycle among the package's modules;
  * no import of the package's own modules inside a function or class (a late import hides a
    dependency, usually an upward one or a cycle); third-party modules only for the heavy
    optional dependencies in LAZY, each with a comment giving the reason;
  * every module is placed in ORDER, and imports only modules placed before it.

The files are read with `ast`, never imported: the checks take milliseconds and still speak
when a refactor has left the package unimportable, which is when they are needed most. Each
failure is one line per problem, naming file:line.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import pathlib
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = 't2t_jax'

# The subpackages, bottom first, each a layer of the data flow with its modules bottom first:
# a module may import only modules listed before it, so a package imports only the packages
# before it. A new file must be placed here deliberately (test_every_module_is_in_order),
# which is where its layer gets decided. Each package's __init__ (a docstring) comes first.
LAYERS = {
    # plumbing: no paper in it
    'platform': ['errors', 'quiet', 'progress', 'files', 'hugepages', 'xla', 'distributed',
                 'workdir', 'metrics', 'mesh'],
    # the config (experiments/*.py are checked by rules)
    'config': ['rules', 'loading', 'recorded_run', 'command_line', 'key_help'],
    # §5.1's data
    'data': ['tokenizer', 'id_cache', 'sources', 'batching', 'packing', 'synthetic',
             'demo_corpus.lexicon', 'demo_corpus.grammar', 'demo_corpus.sampling',
             'demo_corpus.writer', 'demo_corpus', 'demo_corpus.__main__', 'pipeline'],
    # one seam for every backend-specific way of computing the same thing, then §3's model
    'model': ['kernels', 'transformer'],
    # §5's loss, optimizer and step, checkpoints and §6.1's averaging
    'training': ['losses', 'optim', 'train_step', 'ahead', 'checkpoints', 'fine_tune'],
    # §6.1's beam search, BLEU and what uses them
    'decoding': ['decode', 'sampling', 'batch_plan', 'scoring', 'translator', 'bleu', 'evaluate',
                 'attention_maps', 'export'],
}
# Over the layers: the loop that drives them all, Table 3's study of many runs (§6.2), the
# command line; then the package __init__, which imports nothing of the project (every
# submodule import runs it).
ENTRY_POINTS = ['trainer', 'study', 'main', '__main__']
ORDER = [
    *[name for package, modules in LAYERS.items()
      for name in [f'{PACKAGE}.{package}', *(f'{PACKAGE}.{package}.{m}' for m in modules)]],
    *(f'{PACKAGE}.{m}' for m in ENTRY_POINTS),
    PACKAGE,
]

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


def import_graph(root: pathlib.Path) -> dict[str, dict[str, int]]:
  """module -> {project module it imports: first line}, at any depth, self-imports left out."""
  modules = package_modules(root)
  graph = {}
  for module, path in modules.items():
    graph[module] = {}
    for imp in project_imports(path, root, set(modules)):
      if imp.target != module:
        graph[module].setdefault(imp.target, imp.line)
  return graph


def _components(graph: dict[str, dict[str, int]]) -> list[list[str]]:
  """Tarjan's strongly connected components: each cycle lies inside one."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(node: str) -> None:
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for succ in graph.get(node, {}):
      if succ not in index:
        visit(succ)
        low[node] = min(low[node], low[succ])
      elif succ in on_stack:
        low[node] = min(low[node], index[succ])
    if low[node] == index[node]:
      component = []
      while not component or component[-1] != node:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      found.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return found


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str, within: set[str]) -> list[str]:
  """Breadth first from `start` back to it, inside one strongly connected component."""
  parents, frontier = {start: None}, [start]
  while frontier:
    node = frontier.pop(0)
    for succ in sorted(graph.get(node, {})):
      if succ == start:
        path = [node]
        while parents[path[-1]] is not None:
          path.append(parents[path[-1]])
        return path[::-1] + [start]
      if succ in within and succ not in parents:
        parents[succ] = node
        frontier.append(succ)
  raise AssertionError(f'{start} is in no cycle')


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
  """One shortest cycle per tangle of modules, e.g. [a, b, a]; none when the graph is a DAG."""
  return [_shortest_cycle(graph, component[0], set(component))
          for component in _components(graph) if len(component) > 1]


def cycle_problems(graph: dict[str, dict[str, int]]) -> list[str]:
  """One line per tangle: its shortest cycle through its first module, and the rest of it."""
  problems = []
  for component in _components(graph):
    if len(component) > 1:
      cycle = _shortest_cycle(graph, component[0], set(component))
      rest = sorted(set(component) - set(cycle))
      problems.append('cycle: ' + ' → '.join(cycle) +
                      (f' (tangled with it: {", ".join(rest)})' if rest else ''))
  return problems


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


def order_problems(root: pathlib.Path, order: list[str]) -> list[str]:
  """Imports that do not point to a module placed earlier in `order`, as `file:line: why`."""
  modules = package_modules(root)
  rank = {module: i for i, module in enumerate(order)}
  problems = []
  for module, edges in import_graph(root).items():
    if module not in rank:
      continue  # reported by placement_problems
    label = modules[module].relative_to(root)
    for target, line in sorted(edges.items(), key=lambda edge: edge[1]):
      if target not in rank:
        problems.append(f'{label}:{line}: {module} imports {target}, which is not in ORDER')
      elif rank[target] > rank[module]:
        problems.append(f'{label}:{line}: {module} imports {target}, which ORDER places above '
                        'it (a module imports only modules before it)')
  return problems


def placement_problems(root: pathlib.Path, order: list[str]) -> list[str]:
  """Modules on disk missing from `order`, and modules in `order` missing from disk."""
  modules = package_modules(root)
  duplicates = sorted({module for module in order if order.count(module) > 1})
  return ([f'{module} ({modules[module].relative_to(root)}) is not in ORDER: place it in '
           'its layer' for module in modules if module not in order] +
          [f'{module} is in ORDER but no such module exists' for module in order
           if module not in modules] +
          [f'{module} is in ORDER more than once' for module in duplicates])


def layer_of(module: str) -> str:
  """`t2t_jax.data.demo_corpus.writer` -> `data`; an entry point (`t2t_jax.main`) -> ``."""
  parts = module.split('.')
  return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ''


def layer_problems(root: pathlib.Path) -> list[str]:
  """Imports from one subpackage into another above it in LAYERS (entry points are above
  them all), as `file:line: why`: the package-level view of order_problems."""
  modules = package_modules(root)
  rank = {layer: i for i, layer in enumerate([*LAYERS, ''])}
  problems = []
  for module, edges in import_graph(root).items():
    if module == PACKAGE or layer_of(module) not in rank:
      continue
    for target, line in sorted(edges.items(), key=lambda edge: edge[1]):
      if rank.get(layer_of(target), -1) > rank[layer_of(module)]:
        problems.append(f'{modules[module].relative_to(root)}:{line}: the '
                        f'{layer_of(module) or "entry-point"} layer imports {target} of '
                        f'{layer_of(target) or "the entry points"}, above it')
  return problems


def _fail(problems: list[str], what: str) -> None:
  if problems:
    pytest.fail(f'{len(problems)} {what}:\n' + '\n'.join(problems), pytrace=False)


# The package itself.


def test_no_import_cycle():
  _fail(cycle_problems(import_graph(ROOT)), 'import cycle(s) among the package\'s modules')


def test_no_late_imports():
  modules = package_modules(ROOT)
  problems = []
  for module, path in modules.items():
    imports = file_imports(path, ROOT, set(modules))
    if module == PACKAGE:  # its public names load on first use (the next test)
      imports = [imp for imp in imports if imp.scope != '__getattr__']
    problems += nesting_problems(str(path.relative_to(ROOT)), imports)
  _fail(problems, 'import(s) inside a function or class')


def test_every_module_is_in_order():
  _fail(placement_problems(ROOT, ORDER), 'mismatch(es) between ORDER and the files')


def test_imports_point_down_the_order():
  _fail(order_problems(ROOT, ORDER), 'import(s) against the data flow')


def test_subpackages_import_only_the_layers_below():
  _fail(layer_problems(ROOT), 'import(s) from a higher subpackage')


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
          'from t2t_jax.decoding import translator; '
          'assert (Translator, Hypothesis) == (translator.Translator, translator.Hypothesis); '
          'import t2t_jax; assert sorted(t2t_jax.__all__) == ["Hypothesis", "Translator"]; '
          'from t2t_jax import Nothing')
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 1, result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "ImportError: cannot import name 'Nothing' from 't2t_jax' "
      f"({ROOT / PACKAGE / '__init__.py'})")


# The checker, on synthetic packages: a broken checker must not pass silently.


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  for name, source in {'__init__.py': '', **files}.items():
    path = tmp_path / PACKAGE / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding='utf-8')
  return tmp_path


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
  root = _package(tmp_path, {
      'a.py': 'from t2t_jax import b\n',
      'b.py': 'import t2t_jax.c as c\n',
      'c.py': 'def f():\n  from t2t_jax.a import thing\n',
      'd.py': 'from t2t_jax import a\n',
  })
  assert find_cycles(import_graph(root)) == [['t2t_jax.a', 't2t_jax.b', 't2t_jax.c', 't2t_jax.a']]
  assert cycle_problems(import_graph(root)) == [
      'cycle: t2t_jax.a → t2t_jax.b → t2t_jax.c → t2t_jax.a']
  imports = file_imports(root / PACKAGE / 'c.py', root, set(package_modules(root)))
  assert nesting_problems('c.py', imports) == [
      'c.py:2: t2t_jax.a imported inside a function or class: import the package\'s own '
      'modules at the top of the file']


def test_checker_resolves_subpackages_and_relative_imports(tmp_path):
  root = _package(tmp_path, {
      'sub/__init__.py': 'from . import x\nfrom .y import make\n',
      'sub/x.py': 'from t2t_jax.sub import y\n',
      'sub/y.py': 'from .. import top\nfrom ..top import thing\n',
      'sub/__main__.py': 'import t2t_jax.sub\n',
      'top.py': 'from t2t_jax import errors_are_attributes\n',
  })
  assert import_graph(root) == {
      't2t_jax': {}, 't2t_jax.top': {'t2t_jax': 1}, 't2t_jax.sub': {'t2t_jax.sub.x': 1,
                                                                     't2t_jax.sub.y': 2},
      't2t_jax.sub.__main__': {'t2t_jax.sub': 1}, 't2t_jax.sub.x': {'t2t_jax.sub.y': 1},
      't2t_jax.sub.y': {'t2t_jax.top': 1}}


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


def test_checker_finds_upward_imports_and_unplaced_modules(tmp_path):
  root = _package(tmp_path, {
      'low.py': 'from t2t_jax import high\n',
      'high.py': 'from t2t_jax import low, attribute\nimport t2t_jax.gone\n',
      'new.py': '',
  })
  order = ['t2t_jax.low', 't2t_jax.high', 't2t_jax.planned', 't2t_jax']
  assert order_problems(root, order) == [
      't2t_jax/high.py:1: t2t_jax.high imports t2t_jax, which ORDER places above it (a '
      'module imports only modules before it)',
      't2t_jax/high.py:2: t2t_jax.high imports t2t_jax.gone, which is not in ORDER',
      't2t_jax/low.py:1: t2t_jax.low imports t2t_jax.high, which ORDER places above it (a '
      'module imports only modules before it)']
  assert placement_problems(root, order) == [
      't2t_jax.new (t2t_jax/new.py) is not in ORDER: place it in its layer',
      't2t_jax.planned is in ORDER but no such module exists']
