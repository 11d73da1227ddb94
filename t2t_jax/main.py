"""Command line: `t2t-jax --config=FILE --workdir=DIR [--mode=MODE]` (the same as
`python -m t2t_jax.main ...` and `python -m t2t_jax ...`): parses flags and dispatches to the
module of each mode. `--mode=help` lists every --config.KEY with its value and what it does.
"""
from __future__ import annotations

if __name__ == '__main__':
  # Before anything else is imported: this may run the command again with glibc's huge pages
  # for XLA's buffers, saving most of a CPU train step's page faults (hugepages.py).
  from t2t_jax.platform import hugepages
  hugepages.reexec()

import json
import os
import sys

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from t2t_jax import study, trainer, translate_command
from t2t_jax.apps import attention_maps, evaluate, export
from t2t_jax.config import command_line, key_help, loading, rules
from t2t_jax.model.transformer import ModelConfig, init_param_count
from t2t_jax.platform import distributed, errors, quiet, xla
from t2t_jax.platform import workdir as workdir_lib
from t2t_jax.run import averaging
from t2t_jax.run import recorded as recorded_lib
from t2t_jax.training import checkpoints

config_flags.DEFINE_config_file('config', None, 'Experiment config file, e.g. experiments/'
                                'wmt_ende_base.py (or table3.py:ROW). Needed to train and for '
                                'study; other modes read the run recorded in the workdir '
                                '(DIR/config.json) when it is absent.', lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, vocabulary and metrics.')
flags.DEFINE_enum('mode', 'train', rules.MODES, 'What to do.')
flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize() first (multi-host '
                  'runs: TPU pods, Slurm, or JAX_COORDINATOR_ADDRESS and friends set).')
flags.DEFINE_integer('distributed_start_timeout', 300, 'With --distributed: seconds to wait for '
                     'every process to connect before stopping with their names.', lower_bound=1)
flags.DEFINE_integer('distributed_timeout', 60, 'With --distributed: seconds without a '
                     'heartbeat from a process after which the others stop (it died).')
flags.DEFINE_string('input', None, 'translate and score: a file of sentences, one a line, or - '
                    'for stdin. attention: the sentence itself.')
flags.DEFINE_string('reference', None, "score: the file of translations to score, line i that "
                    "of --input's line i.")
flags.DEFINE_bool('per_token', False, "score: also each line's log P and its tokens' "
                  'log-probabilities (SCORE ||| LOGPROB ||| t1 t2 ...).')
flags.DEFINE_string('output', None, 'translate and score: the output file (default: stdout). '
                    'attention: the folder for the PNGs (default: WORKDIR/attention). export: '
                    'the Hugging Face MarianMT folder to write (new or empty).')
flags.DEFINE_integer('n_best', None, 'translate: write the K best translations of each line, as '
                     'lines `LINE ||| TRANSLATION ||| SCORE` (LINE counted from 0, best first; '
                     'K ≤ config.beam_size), or K samples with config.decode_method=sample.',
                     lower_bound=1)
flags.DEFINE_integer('stream_lines', 16, 'translate --input=-: a batch of at most this many lines '
                     "(typed ones) is decoded in small shapes compiled ahead; more (a pipe's), "
                     'length-sorted as a file is.', lower_bound=1)
flags.DEFINE_float('stream_wait', 0.1, 'translate --input=-: seconds a batch takes the lines that '
                   'arrive after its first one.', lower_bound=0)
flags.DEFINE_list('layers', None, 'attention: the layers to plot, e.g. 0,5 (default: all).')
flags.DEFINE_list('rows', None, 'study: the rows of the study file (experiments/table3.py) to '
                  'train and evaluate, e.g. A_h1,A_h4,B_dk16 (default: every row).')
flags.DEFINE_bool('traceback', False, 'Show the full traceback of an error.')
FLAGS = flags.FLAGS
# Modes that use a trained run: without --config they read the config it recorded.
RECORDED_MODES = ('average', 'translate', 'score', 'eval', 'attention', 'export')
# --config.KEY=VALUE overrides of the recorded config (no --config): absl knows them only as a
# --config file's, so parse_flags takes them out first, anew for each command of a process.
_recorded_overrides: list[str] = []


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  quiet.install()  # one failure, one report: not the libraries' repeats of it
  # Before JAX's CPU backend starts: modes whose work is beam search run a device per core.
  xla.configure_cpu(decoding=FLAGS.mode in ('translate', 'score', 'eval'))
  try:
    _dispatch()
  except BrokenPipeError:
    # The reader of stdout went away (`| head`): end quietly, as Unix tools do, with what a
    # shell reports for a process ended by SIGPIPE. At once: a stream's reader thread may be
    # blocked reading stdin, and the interpreter's shutdown would abort on that buffer's lock.
    logging.flush()
    sys.stderr.flush()
    os._exit(128 + 13)
  except trainer.StoppedBySignal as e:
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
  if FLAGS.mode == 'help':
    print(_key_help(), end='')
    return
  if FLAGS.rows is not None and FLAGS.mode != 'study':
    raise errors.UserError(f'--rows: only --mode=study has rows, not --mode={FLAGS.mode}')
  if FLAGS.rows is not None and not FLAGS.rows:
    raise errors.UserError('--rows=: no row named; name some (--rows=A_h1,B_dk16), or leave '
                           '--rows out for every row')
  config = _config()
  rules.validate(config, FLAGS.mode)  # every mode: a bad value fails before work
  if FLAGS.mode == 'params':
    print(f'params: {init_param_count(ModelConfig.from_config(config))}')
    return
  xla.enable_compilation_cache(config.compilation_cache_dir)
  mode, workdir = FLAGS.mode, FLAGS.workdir
  if mode == 'average':
    step, steps = averaging.average_checkpoints(
        workdir, config.average_last, allow_fewer=config.average_allow_fewer,
        step=config.restore_step, best=config.average_select == 'best')
    print(f'averaged checkpoints {steps} into {workdir}/averaged/{step}')
  elif mode == 'eval':
    print(json.dumps(evaluate.run_eval(config, workdir), indent=2))
  elif mode == 'translate':
    if FLAGS.input is None:
      raise errors.UserError('--mode=translate needs --input=FILE (or - for stdin)')
    translate_command.run_translate(config, workdir, FLAGS.input, FLAGS.output,
                                    n_best=FLAGS.n_best, stream_lines=FLAGS.stream_lines,
                                    stream_wait_s=FLAGS.stream_wait)
  elif mode == 'score':
    if FLAGS.input is None or FLAGS.reference is None:
      raise errors.UserError('--mode=score needs --input=FILE (the sources) and --reference=FILE '
                             '(their translations, line for line)')
    translate_command.run_score(config, workdir, FLAGS.input, FLAGS.reference, FLAGS.output,
                                per_token=FLAGS.per_token)
  elif mode == 'export':
    if FLAGS.output is None:
      raise errors.UserError('--mode=export needs --output=DIR (the Hugging Face folder to write)')
    export.run_export(config, workdir, FLAGS.output)
    print(f'exported {workdir} to {FLAGS.output} (transformers.MarianMTModel)')
  elif mode == 'attention':
    if FLAGS.input is None:
      raise errors.UserError('--mode=attention needs --input="a sentence"')
    print('\n'.join(attention_maps.run(config, workdir, FLAGS.input, FLAGS.output,
                                       layers=FLAGS.layers)))
  elif mode == 'study':
    _study()
  else:
    logging.info('Config:\n%s', config)
    trainer.train_and_evaluate(config, workdir)


def _key_help() -> str:
  """--mode=help's text: the keys of --config, else of the run recorded in --workdir (with the
  --config.* overrides given), else of the base config, each with its config file's comment."""
  files = [key_help.BASE]
  if FLAGS.config is not None:
    files.append(config_flags.get_config_filename(FLAGS['config']).partition(':')[0])
    config = FLAGS.config
  elif FLAGS.workdir and (recorded := recorded_lib.load_config(FLAGS.workdir)) is not None:
    where = os.path.join(FLAGS.workdir, workdir_lib.CONFIG)
    config = recorded_lib.from_recorded(recorded, _recorded_overrides, where)
  else:
    config = loading.load_module(key_help.BASE, 't2t_jax_config_base').get_config()
    if FLAGS.workdir:  # not silently: the user asked about a run
      where = os.path.join(FLAGS.workdir, workdir_lib.CONFIG)
      return (f'{where}: no recorded run there, so these are the defaults of {key_help.BASE} '
              '(pass --config=FILE, or the --workdir of a trained run)\n\n'
              + key_help.describe(config, tuple(files)))
  return key_help.describe(config, tuple(files))


def _study() -> None:
  """--mode=study: the --config file's rows (--rows), each with every --config.* override."""
  study_file, colon, row = config_flags.get_config_filename(FLAGS['config']).partition(':')
  if colon:
    raise errors.UserError(f'--config={study_file}:{row}: --mode=study takes its rows from '
                           f'--rows (--config={study_file} --rows={row})')
  study.run_study(study_file, FLAGS.rows, config_flags.get_override_values(FLAGS['config']),
                  FLAGS.workdir)
  print(f'wrote {FLAGS.workdir}/{study.TABLE_MD}, {study.TABLE_JSON} and {study.TABLE_PNG}')


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
  return recorded_lib.from_recorded(recorded, _recorded_overrides, where)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, except that a --config file, Table 3 row or --config.KEY that does not
  exist is one line naming the nearest valid names, not a traceback (--traceback: it is).
  `argv` is sys.argv, as app.run passes it: ml_collections reads overrides from there."""
  _recorded_overrides.clear()
  if not any(arg.split('=', 1)[0] in ('--config', '-config') for arg in argv[1:]):
    _recorded_overrides.extend(_as_override(arg) for arg in argv if _is_override(arg))
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
