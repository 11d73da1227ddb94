"""Every --config.KEY with its value and what it does: of --config, else of the run in
--workdir (with the --config.KEY overrides given), else of the base config."""
from __future__ import annotations

import os

import ml_collections
from ml_collections import config_flags

from t2t_jax import cli
from t2t_jax.config import key_help, loading
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.run import recorded as recorded_lib


def run(config: ml_collections.ConfigDict | None, workdir: str | None) -> str:
  """The keys' text (main checks no config for this mode: `config` is --config's, or None)."""
  files = [key_help.BASE]
  if config is not None:
    files.append(config_flags.get_config_filename(cli.FLAGS['config']).partition(':')[0])
  elif workdir and (recorded := recorded_lib.load_config(workdir)) is not None:
    where = os.path.join(workdir, workdir_lib.CONFIG)
    config = recorded_lib.from_recorded(recorded, cli.RECORDED_OVERRIDES, where)
  else:
    config = loading.load_module(key_help.BASE, 't2t_jax_config_base').get_config()
    if workdir:  # not silently: the user asked about a run
      where = os.path.join(workdir, workdir_lib.CONFIG)
      return (f'{where}: no recorded run there, so these are the defaults of {key_help.BASE} '
              '(pass --config=FILE, or the --workdir of a trained run)\n\n'
              + key_help.describe(config, tuple(files)))
  return key_help.describe(config, tuple(files))
