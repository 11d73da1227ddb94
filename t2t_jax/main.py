"""Command line: `python -m t2t_jax.main --config=FILE --workdir=DIR [--mode=MODE]`.

Parses flags and dispatches; the work happens in the modules named for each mode.
"""
from __future__ import annotations

import json
import logging as python_logging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

MODES = ('train', 'params', 'average', 'translate', 'eval', 'attention')

config_flags.DEFINE_config_file('config', None, 'Experiment config file, e.g. '
                                'experiments/wmt_ende_base.py (or table3.py:ROW).',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, vocabulary and metrics.')
flags.DEFINE_enum('mode', 'train', MODES, 'What to do.')
flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize() first (multi-host '
                  'runs: TPU pods, Slurm, or JAX_COORDINATOR_ADDRESS and friends set).')
flags.DEFINE_string('input', None, 'translate: a file of sentences, one a line, or - for '
                    'stdin. attention: the sentence itself.')
flags.DEFINE_string('output', None, 'translate: the output file (default: stdout). attention: '
                    'the folder for the PNGs (default: WORKDIR/attention).')
flags.DEFINE_list('layers', None, 'attention: the layers to plot, e.g. 0,5 (default: all).')
flags.DEFINE_bool('traceback', False, 'Show the full traceback of an error.')
flags.mark_flags_as_required(['config'])
FLAGS = flags.FLAGS


class _QuietLibraries(python_logging.Filter):
  """Drops orbax's per-file INFO chatter, and its warning that a checkpoint item (params/)
  has no metadata file of its own (the step directory has it); other warnings still show."""

  def filter(self, record) -> bool:
    if '/orbax/' not in record.pathname:
      return True
    harmless = str(record.msg).startswith('Metadata file does not exist')
    return record.levelno >= python_logging.WARNING and not harmless


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.get_absl_handler().python_handler.addFilter(_QuietLibraries())
  try:
    _dispatch()
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    if FLAGS.traceback:
      raise
    # Config and data mistakes get their message, not a traceback (--traceback shows it).
    sys.exit(f't2t_jax: error: {e}')


def _dispatch() -> None:
  if FLAGS.mode == 'params':
    from t2t_jax import config_lib, model
    print(f'params: {model.init_param_count(config_lib.validate(FLAGS.config))}')
    return
  if FLAGS.workdir is None:
    raise app.UsageError(f'--workdir is required for --mode={FLAGS.mode}')
  if FLAGS.distributed:
    import jax
    jax.distributed.initialize()
  if FLAGS.mode == 'average':
    from t2t_jax import checkpoints
    step, steps = checkpoints.average_checkpoints(FLAGS.workdir, FLAGS.config.average_last,
                                                  allow_fewer=FLAGS.config.average_allow_fewer)
    print(f'averaged checkpoints {steps} into {FLAGS.workdir}/averaged/{step}')
    return
  if FLAGS.mode in ('translate', 'eval'):
    from t2t_jax import evaluate
    if FLAGS.mode == 'eval':
      scores = evaluate.run_eval(FLAGS.config, FLAGS.workdir)
      print(json.dumps(scores, indent=2))
    elif FLAGS.input is None:
      raise app.UsageError('--mode=translate needs --input=FILE (or - for stdin)')
    else:
      evaluate.run_translate(FLAGS.config, FLAGS.workdir, FLAGS.input, FLAGS.output)
    return
  if FLAGS.mode == 'attention':
    from t2t_jax import attention_maps
    if FLAGS.input is None:
      raise app.UsageError('--mode=attention needs --input="a sentence"')
    paths = attention_maps.run(FLAGS.config, FLAGS.workdir, FLAGS.input, FLAGS.output,
                               layers=FLAGS.layers)
    print('\n'.join(paths))
    return
  logging.info('Config:\n%s', FLAGS.config)
  from t2t_jax import train
  train.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main)
