"""Configs loaded by path: `--config` names a file, and a config may build on another
(`load_sibling`), since experiments/ is no installed package."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENTS = os.path.join(ROOT, 'experiments')


def load_sibling(config_file: str, name: str) -> types.ModuleType:
  """The config `name`.py beside `config_file` (a config's own __file__), loaded by path from
  any directory: wmt_ende_big.py builds on wmt_ende_base.py so."""
  folder = os.path.dirname(os.path.abspath(config_file))
  return load_config_module(os.path.join(folder, f'{name}.py'))


def load_config_module(file: str) -> types.ModuleType:
  """A config file (experiments/table3.py) as a module, for what it defines beside
  get_config (the study's rows and the paper's values)."""
  name = os.path.splitext(os.path.basename(file))[0]
  return load_module(file, f't2t_jax_config_{name}')


def load_module(file: str, module_name: str) -> types.ModuleType:
  """A Python file as a fresh module, not entered in sys.modules, as ml_collections loads it."""
  loader = importlib.machinery.SourceFileLoader(module_name, file)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  loader.exec_module(module)
  return module
