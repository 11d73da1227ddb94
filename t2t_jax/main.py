"""Command line: `python -m t2t_jax.main --config=FILE --workdir=DIR [--mode=MODE]`.

Parses flags and dispatches; the work happens in the modules named for each mode.
"""
from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

MODES = ('train', 'params')

config_flags.DEFINE_config_file('config', None, 'Experiment config file, e.g. '
                                'experiments/wmt_ende_base.py (or table3.py:ROW).',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, vocabulary and metrics.')
flags.DEFINE_enum('mode', 'train', MODES, 'What to do.')
flags.DEFINE_bool('distributed', False, 'Call jax.distributed.initialize() first (multi-host '
                  'runs: TPU pods, Slurm, or JAX_COORDINATOR_ADDRESS and friends set).')
flags.mark_flags_as_required(['config'])
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.mode == 'params':
    from t2t_jax import config_lib, model
    print(f'params: {model.init_param_count(config_lib.validate(FLAGS.config))}')
    return
  if FLAGS.workdir is None:
    raise app.UsageError(f'--workdir is required for --mode={FLAGS.mode}')
  if FLAGS.distributed:
    import jax
    jax.distributed.initialize()
  logging.info('Config:\n%s', FLAGS.config)
  from t2t_jax import train
  train.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == '__main__':
  app.run(main)
