"""The command line's flags, and `--help`: the modes with a line each, these flags, and where
the config keys are listed. Light on purpose (absl's flags and ml_collections alone): `--help`
answers before JAX or any mode is imported."""
from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from collections.abc import Sequence

from absl import flags
from ml_collections import config_flags

from t2t_jax.config.modes import MODES

config_flags.DEFINE_config_file('config', None, 'Experiment config file, e.g. experiments/'
                                'wmt_ende_base.py (or table3.py:ROW). Needed to train and for '
                                'study; other modes read the run recorded in the workdir '
                                '(DIR/config.json) when it is absent.', lock_config=True)
flags.DEFINE_string('workdir', None, 'Directory for checkpoints, vocabulary and metrics.')
flags.DEFINE_enum('mode', 'train', MODES, 'What to do (--help lists the modes).')
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
                     'Moses n-best lines `LINE ||| TRANSLATION ||| logP= .. lp= .. ||| SCORE` '
                     '(LINE counted from 0, best first; K ≤ config.beam_size), or K samples '
                     'with config.decode_method=sample.', lower_bound=1)
flags.DEFINE_integer('stream_lines', 16, 'translate --input=-: a batch of at most this many lines '
                     "(typed ones) is decoded in small shapes compiled ahead; more (a pipe's), "
                     'length-sorted as a file is.', lower_bound=1)
flags.DEFINE_float('stream_wait', 0.1, 'translate --input=-: seconds a batch takes the lines that '
                   'arrive after its first one.', lower_bound=0)
flags.DEFINE_integer('port', 8000, 'serve: the TCP port to listen on.', lower_bound=0,
                     upper_bound=65535)
flags.DEFINE_string('host', '127.0.0.1', 'serve: the address to listen on (0.0.0.0: every '
                    'interface; this machine alone by default).')
flags.DEFINE_list('layers', None, 'attention: the layers to plot, e.g. 0,5 (default: all).')
flags.DEFINE_list('rows', None, 'study: the rows of the study file (experiments/table3.py) to '
                  'train and evaluate, e.g. A_h1,A_h4,B_dk16 (default: every row).')
flags.DEFINE_bool('traceback', False, 'Show the full traceback of an error.')
FLAGS = flags.FLAGS
# --config.KEY=VALUE overrides of a recorded config (no --config): absl knows them only as a
# --config file's, so main.parse_flags takes them out first, anew for each command of a process.
RECORDED_OVERRIDES: list[str] = []
# This module's flags, in the order --help lists them.
OWN_FLAGS = ('config', 'workdir', 'mode', 'input', 'output', 'reference', 'per_token', 'n_best',
             'stream_lines', 'stream_wait', 'port', 'host', 'layers', 'rows', 'distributed',
             'distributed_start_timeout', 'distributed_timeout', 'traceback')
# What asks for this module's help; absl's --helpfull still lists every flag of every library.
HELP_ARGS = ('--help', '-help', '-h', '--helpshort', '-helpshort', '-?')
_WIDTH = 100


def summary(mode: str) -> str:
  """The first line of t2t_jax/modes/<mode>.py's docstring, read without importing it."""
  spec = importlib.util.find_spec(f't2t_jax.modes.{mode}')
  with open(spec.origin, encoding='utf-8') as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ''
  return docstring.split('\n\n')[0].replace('\n', ' ')


def usage() -> str:
  """--help's text."""
  name = 't2t-jax'
  lines = [f'{name}: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).', '',
           f'usage: {name} --config=FILE --workdir=DIR [--mode=MODE] [--config.KEY=VALUE ...]',
           f'       {name} --workdir=DIR --mode=MODE [--config.KEY=VALUE ...]',
           '         (a trained run, with the config it recorded)', '', 'modes:']
  indent = ' ' * 14
  for mode in MODES:
    lines += textwrap.wrap(summary(mode), _WIDTH, initial_indent=f'  {mode:<11} ',
                           subsequent_indent=indent)
  lines += ['', 'flags:']
  for flag in OWN_FLAGS:
    default = FLAGS[flag].default
    shown = f' (default: {FLAGS[flag].default_as_str})' if default not in (None, False) else ''
    lines += textwrap.wrap(f'{FLAGS[flag].help}{shown}', _WIDTH, subsequent_indent=' ' * 4,
                           initial_indent=f'  --{flag}: ')
  lines += ['', *textwrap.wrap(
      f'Every --config.KEY with its value and what it does: {name} --mode=help [--config=FILE | '
      "--workdir=DIR]. absl's flags as well (logging; --verbosity=1 shows the libraries' INFO "
      'lines): --helpfull. The modes in full: docs/modes.md.', _WIDTH)]
  return '\n'.join(lines) + '\n'


def exit_if_help(argv: Sequence[str]) -> None:
  """Prints usage() and exits 0 if `argv` asks for help (before anything heavy is imported)."""
  if any(arg in HELP_ARGS for arg in argv[1:]):
    sys.stdout.write(usage())
    sys.stdout.flush()
    sys.exit(0)
