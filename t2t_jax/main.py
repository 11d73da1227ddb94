"""Command line: `t2t-jax --config=FILE --workdir=DIR [--mode=MODE]` (the same as
`python -m t2t_jax.main ...` and `python -m t2t_jax ...`): parses the flags (cli.py), checks
the config, and runs the mode's module (MODES); `--help` lists the modes.
"""
from __future__ import annotations

if __name__ == '__main__':
  import sys

  from t2t_jax import cli
  cli.exit_if_help(sys.argv)  # before anything heavy is imported
  # Before anything else is imported: this may run the command again with glibc's huge pages
  # for XLA's buffers, saving most of a CPU train step's page faults (hugepages.py).
  from t2t_jax.platform import hugepages
  hugepages.reexec()

import os
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from t2t_jax import cli
from t2t_jax.config import command_line, rules, uses
from t2t_jax.config.modes import RECORDED_MODES
from t2t_jax.modes import (
  attention,
  average,
  export,
  params,
  plot,
  score,
  serve,
  study,
  train,
  translate,
)
from t2t_jax.modes import eval as eval_mode
from t2t_jax.modes import help as help_mode
from t2t_jax.platform import distributed, errors, quiet, xla
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.run import recorded as recorded_lib
from t2t_jax.training import checkpoints

# Each mode's module (t2t_jax/modes/): run(config, workdir) -> the line the command ends with.
MODES = {'train': train, 'average': average, 'eval': eval_mode, 'translate': translate,
         'score': score, 'serve': serve, 'attention': attention, 'export': export, 'params': params,
         'study': study, 'plot': plot, 'help': help_mode}
FLAGS = cli.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  quiet.install()  # one failure, one report: not the libraries' repeats of it
  # Before JAX's CPU backend starts: modes whose work is beam search run a device per core.
  xla.configure_cpu(decoding=FLAGS.mode in ('translate', 'score', 'eval', 'serve'))
  try:
    _dispatch()
  except BrokenPipeError:
    # The reader of stdout went away (`| head`): end quietly, as Unix tools do, with what a
    # shell reports for a process ended by SIGPIPE. At once: a stream's reader thread may be
    # blocked reading stdin, and the interpreter's shutdown would abort on that buffer's lock.
    logging.flush()
    sys.stderr.flush()
    os._exit(128 + 13)
  except train.StoppedBySignal as e:
    # Saved, but not finished: a non-zero status tells schedulers and loops to run it again.
    print(f't2t_jax: {e}', file=sys.stderr)
    sys.exit(e.exit_status)
  except Exception as e:  # re-raised unless it is the user's to fix
    if FLAGS.traceback or not errors.is_for_user(e):
      raise  # a bug: its traceback is what a report needs
    if not isinstance(e, checkpoints.CheckpointWriteError):
      sys.exit(f't2t_jax: error: {e}')  # its message names the key, file or path
    # A checkpoint on a full disk: orbax's writes in flight would fail again at exit, each with
    # a traceback, and TensorStore's threads may still print (from C++), burying the line that
    # names the folder. What was mid-write is a temporary the next run removes.
    print(f't2t_jax: error: {e}', file=sys.stderr, flush=True)
    logging.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    os._exit(1)


def _dispatch() -> None:
  if FLAGS.distributed:  # before anything starts a JAX backend (dtype 'auto' may)
    distributed.initialize(heartbeat_timeout_s=FLAGS.distributed_timeout,
                           start_timeout_s=FLAGS.distributed_start_timeout)
  mode = MODES[FLAGS.mode]
  if FLAGS.mode == 'help':  # the keys, of whatever config is at hand: nothing to check
    print(mode.run(FLAGS.config, FLAGS.workdir), end='')
    return
  if FLAGS.rows is not None and FLAGS.mode != 'study':
    raise errors.UserError(f'--rows: only --mode=study has rows, not --mode={FLAGS.mode}')
  if FLAGS.rows is not None and not FLAGS.rows:
    raise errors.UserError('--rows=: no row named; name some (--rows=A_h1,B_dk16), or leave '
                           '--rows out for every row')
  config = _config()
  rules.validate(config, FLAGS.mode)  # every mode: a bad value fails before work
  uses.check_overrides_used(config, FLAGS.mode, _overridden(), rules.batching_of(config),
                            check_mode=FLAGS.config is None)
  if FLAGS.mode != 'params':
    xla.enable_compilation_cache(config.compilation_cache_dir)
  line = mode.run(config, FLAGS.workdir)
  if line:
    print(line)


def _overridden() -> list[str]:
  """The config keys given on the command line ('beam_size', 'model.d_ff')."""
  if FLAGS.config is not None:
    return list(config_flags.get_override_values(FLAGS['config']))
  return [override.partition('=')[0].removeprefix('config.')
          for override in cli.RECORDED_OVERRIDES]


def _config() -> ml_collections.ConfigDict:
  """--config (checked against the run recorded in --workdir, for the modes that use a
  trained run), else that recorded config with the --config.KEY overrides given."""
  if FLAGS.mode != 'params' and FLAGS.workdir is None:
    raise errors.UserError(f'--workdir is required for --mode={FLAGS.mode}')
  if FLAGS.workdir is not None:
    workdir_lib.check_local(FLAGS.workdir)
  recorded = recorded_lib.load_config(FLAGS.workdir) if FLAGS.workdir else None
  where = os.path.join(FLAGS.workdir or '', workdir_lib.CONFIG)
  if FLAGS.config is not None:
    if recorded is not None and FLAGS.mode in RECORDED_MODES:
      recorded_lib.check_against_recorded(FLAGS.config, recorded, where)
    return FLAGS.config
  # --mode=params with only --workdir counts the recorded run's parameters.
  if FLAGS.mode not in RECORDED_MODES and not (FLAGS.mode == 'params' and FLAGS.workdir):
    raise errors.UserError(f'--mode={FLAGS.mode} needs --config=FILE (e.g. '
                           'experiments/wmt_ende_base.py)')
  if recorded is None:
    raise errors.UserError(f'{where}: no recorded run there (training records it); pass '
                           '--config=FILE, or point --workdir at a trained run')
  logging.info('Config: the run recorded in %s', where)
  return recorded_lib.from_recorded(recorded, cli.RECORDED_OVERRIDES, where)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, except that a --config file, Table 3 row or --config.KEY that does not
  exist is one line naming the nearest valid names, not a traceback (--traceback: it is).
  `argv` is sys.argv, as app.run passes it: ml_collections reads overrides from there.
  `--help` prints cli.usage() and exits 0."""
  cli.exit_if_help(argv)
  cli.RECORDED_OVERRIDES.clear()
  if not any(arg.split('=', 1)[0] in ('--config', '-config') for arg in argv[1:]):
    cli.RECORDED_OVERRIDES.extend(_as_override(arg) for arg in argv if _is_override(arg))
    argv = [arg for arg in argv if not _is_override(arg)]
  try:
    args = FLAGS(argv)
    if FLAGS.config is not None:
      FLAGS.config.keys()  # ml_collections defers a missing file's error to its first use
    return args
  except (flags.Error, KeyError, AttributeError, OSError, SyntaxError) as error:
    if _wants_traceback(argv):
      raise
    line = command_line.command_line_error(argv)
    if line:
      sys.exit(f't2t_jax: error: {line}')
    if not isinstance(error, flags.Error):
      raise
    # Other flag mistakes (a bad value, no --config) as absl's own parser reports them.
    sys.stderr.write(f'FATAL Flags parsing error: {error}\n'
                     'Pass --helpshort or --helpfull to see help on flags.\n')
    sys.exit(1)


def _is_override(arg: str) -> bool:
  return arg.startswith(('--config.', '-config.', '--noconfig.', '-noconfig.'))


def _as_override(arg: str) -> str:
  """'--config.x=1' -> 'config.x=1'; a bare boolean '--config.x' -> '=true', '--noconfig.x'
  -> '=false', as absl reads them."""
  name, equals, value = arg.lstrip('-').partition('=')
  if name.startswith('noconfig.'):
    return f'{name[2:]}=false'
  return f'{name}={value}' if equals else f'{name}=true'


def _wants_traceback(argv: list[str]) -> bool:
  """--traceback, parsed on its own: the failed parse may have stopped before reaching it."""
  alone = flags.FlagValues()
  flags.DEFINE_bool('traceback', False, '', flag_values=alone)
  alone(argv, known_only=True)
  return alone.traceback


def run() -> None:
  """Parses the command line (sys.argv) and runs its mode; exits with its status."""
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  run()
