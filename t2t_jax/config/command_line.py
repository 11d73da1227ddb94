"""A --config file, Table 3 row or --config.KEY that does not exist, as one line naming the
nearest valid names (difflib), instead of the traceback ml_collections gives."""
from __future__ import annotations

import difflib
import glob
import os
import re
from collections.abc import Sequence
from typing import Any

import ml_collections

from t2t_jax.config import loading


def command_line_error(argv: Sequence[str]) -> str | None:
  """The line for a --config file, row or --config.KEY override that does not exist, else None
  (the original error is then shown). Loads the config again, as ml_collections' flag does."""
  path = _config_argument(argv)
  if path is None:
    return None  # absl says --config is required
  file, colon, row = path.partition(':')  # as ml_collections: FILE[:ARGUMENT]
  if not os.path.isfile(file):
    return _missing_file(path, file, colon + row)
  try:
    get_config = getattr(loading.load_module(file, 't2t_jax_config_check'), 'get_config', None)
    if not callable(get_config):
      return (f'--config={path}: {file} defines no get_config(); a config file returns its '
              'ml_collections.ConfigDict from get_config() (see experiments/demo.py)')
    config = get_config(*([row] if colon else []))
  except SyntaxError as e:
    return f'{file}, line {e.lineno}: not a Python config file ({e.msg})'
  except (ValueError, TypeError) as e:  # get_config's own message, e.g. table3.py's unknown row
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    named = message.split(':', 1)[0].endswith(os.path.basename(file))
    return message if named else f'{file}: {message}'
  for arg in argv[1:]:
    override = re.match(r'-{1,2}(?:no)?config\.([^=]+)', arg)
    message = override and _unknown_key(config, override.group(1))
    if message:
      return message
  return None


def _config_argument(argv: Sequence[str]) -> str | None:
  """The value of --config (`--config=F` or `--config F`; the last one wins, as in absl)."""
  value = None
  for i, arg in enumerate(argv[1:], 1):
    name, equals, rest = arg.partition('=')
    if name in ('--config', '-config'):
      value = rest if equals else (argv[i + 1] if i + 1 < len(argv) else None)
  return value


def _missing_file(path: str, file: str, row: str) -> str:
  """Names the experiments/*.py nearest to `file` by name (all of them if none is near)."""
  folder = os.path.relpath(loading.EXPERIMENTS)  # as the user would type it, from where they are
  names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, '*.py'))
                 if not p.endswith('__init__.py'))
  nearest = difflib.get_close_matches(os.path.basename(file), names)
  hint = ('did you mean ' + ' or '.join(os.path.join(folder, n) + row for n in nearest) + '?'
          if nearest else 'the configs are ' + ', '.join(os.path.join(folder, n) for n in names))
  return f'--config={path}: no such file; {hint}'


def _unknown_key(config: Any, path: str) -> str | None:
  """`config.modle: no such key; did you mean config.model?` for the first missing part."""
  node, walked = config, 'config'
  for part in path.split('.'):
    if not isinstance(node, ml_collections.ConfigDict):
      return (f'{walked}.{part}: no such key; {walked} is a value '
              f'({type(node).__name__}), not a group of keys')
    if part not in node:
      keys = sorted(node.keys())
      nearest = difflib.get_close_matches(part, keys)
      hint = ('did you mean ' + ' or '.join(f'{walked}.{k}' for k in nearest) + '?' if nearest
              else f'the keys of {walked} are ' + ', '.join(keys))
      return f'{walked}.{part}: no such key; {hint}'
    node, walked = node[part], f'{walked}.{part}'
  return None
