"""What several test modules share: the repository root, the command line (in this process,
or as a new process where the process is the point), the tiny configs (a trained run's, a
train step's, a text-file corpus's), a dead process id, tolerances, and the tiny models that
decoding is checked on against brute force.
pytest puts tests/ on sys.path (no __init__.py), so a test module imports this as `helpers`.
It starts no JAX backend (conftest.py sets XLA's flags after importing it)."""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import random
import re
import subprocess
import sys
import threading
import traceback
from unittest import mock

import jax
import ml_collections
import numpy as np
from absl import logging as absl_logging
from absl.testing import flagsaver

from experiments import demo, wmt_ende_base
from t2t_jax.data.tokenizer import EOS_ID, PAD_ID
from t2t_jax.model.transformer import ModelConfig, Transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Most of the suite's time is XLA:CPU compiling tiny programs. Without LLVM's optimizations
# and with XLA's classic fusion emitters it compiles them about twice as fast; they compute
# the same, only slower, which tiny sizes do not notice. This process (conftest.py) and
# every subprocess the tests start use these flags, so results compared across processes
# still come from the same programs.
TEST_XLA_FLAGS = '--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false'


def cpu_env(devices: int | None, **extra: str) -> dict[str, str]:
  """os.environ for a subprocess on `devices` CPU devices (None: XLA's own choice, the
  user's default), with TEST_XLA_FLAGS and `extra` variables."""
  flags = TEST_XLA_FLAGS
  if devices is not None:
    flags = f'--xla_force_host_platform_device_count={devices} {flags}'
  return dict(os.environ, XLA_FLAGS=flags, **extra)


# ------------------------------------------------------------------------- the command line

def the_one_error(stderr: str) -> str:
  """The error line, asserting that it is the last line and that everything before it is
  the run's INFO and WARNING log (which config was read, what differs from the recorded
  one; a record may span lines): nothing else, no traceback."""
  records = []
  for line in stderr.strip().splitlines():
    if re.match(r'[IWEF]\d{4} |t2t_jax: ', line) or not records:
      records.append(line)
    else:
      records[-1] += '\n' + line
  assert 'Traceback' not in stderr, stderr[-3000:]
  assert records and records[-1].startswith('t2t_jax: error: '), stderr[-3000:]
  assert '\n' not in records[-1], stderr[-3000:]
  assert all(re.match(r'[IW]\d{4} ', r) for r in records[:-1]), stderr[-3000:]
  return records[-1]


COMMAND = [sys.executable, '-m', 't2t_jax.main']


def run_process(*args: str, devices: int | None = 2, env: dict | None = None,
                timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
  """`python -m t2t_jax.main ARGS` as a new process, from the repository root, its output
  captured as text, on `devices` CPU devices (cpu_env). For the `e2e` tests only: those of
  what a process is (its start, signals, exit status, device count, closed streams)."""
  return subprocess.run([*COMMAND, *args], cwd=ROOT, env=cpu_env(devices, **(env or {})),
                        capture_output=True, text=True, timeout=timeout, **kwargs)


def run_main(capfd, *args: str, input: str | bytes = '') -> subprocess.CompletedProcess:
  """`python -m t2t_jax.main ARGS` run in this process, as the `cli` fixture (conftest.py)
  calls it: main.main after main.parse_flags, with sys.argv, the working directory (the
  repository root), stdin (`input`) and os.environ its own, and what a command sets for the
  whole process (flags, JAX's cache directory, the log handler, the unraisable hook) put
  back afterwards. Its stdout and stderr as text (capfd: file descriptors too), and its exit
  status as the interpreter makes it: a SystemExit's code, 1 and the traceback on stderr for
  an uncaught exception. It runs on this process's 8 CPU devices."""
  from t2t_jax import main  # here: importing it defines the command line's flags

  argv = [main.__file__, *args]
  data = input.encode() if isinstance(input, str) else input
  stdin = io.TextIOWrapper(io.BytesIO(data), encoding='utf-8')
  handler = absl_logging.get_absl_handler()
  threads = set(threading.enumerate())
  capfd.readouterr()  # what came before is not this command's output
  with contextlib.ExitStack() as undo:
    undo.enter_context(mock.patch.dict(os.environ))
    undo.enter_context(mock.patch.object(sys, 'argv', argv))
    undo.enter_context(mock.patch.object(sys, 'stdin', stdin))
    undo.enter_context(mock.patch.object(sys, 'unraisablehook', sys.unraisablehook))
    undo.enter_context(contextlib.chdir(ROOT))
    undo.enter_context(_jax_config('jax_compilation_cache_dir'))
    undo.enter_context(_log_handler(handler))  # left last: restoring the flags logs a level
    undo.enter_context(flagsaver.flagsaver())
    try:
      args = main.parse_flags(argv)
      if main.FLAGS['verbosity'].using_default_value:
        main.FLAGS.verbosity = 0  # INFO, as app.run sets it after parsing
      main.main(args)
      status = 0
    except SystemExit as e:
      status = _exit_status(e.code)
    except Exception:  # what the interpreter does with an uncaught one
      traceback.print_exc()
      status = 1
    # The interpreter joins the threads a command started before it exits.
    for thread in set(threading.enumerate()) - threads:
      if not thread.daemon:
        thread.join()
  out, err = capfd.readouterr()
  return subprocess.CompletedProcess(args, status, out, err)


def _exit_status(code) -> int:
  """The exit status of SystemExit(code), as the interpreter makes it."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  print(code, file=sys.stderr)
  return 1


@contextlib.contextmanager
def _jax_config(name: str):
  value = getattr(jax.config, name)
  try:
    yield
  finally:
    jax.config.update(name, value)


@contextlib.contextmanager
def _log_handler(handler):
  """absl's handler on the root logger, writing to this command's stderr, as app.run sets
  it up (absl_logging.use_absl_handler); the handler and the levels of the root and absl
  loggers (which --verbosity sets) as they were before afterwards."""
  absl_logger = logging.getLogger('absl')
  attached, levels = handler in logging.root.handlers, (logging.root.level, absl_logger.level)
  absl_logging.use_absl_handler()
  stream = handler.python_handler.setStream(sys.stderr)
  try:
    yield
  finally:
    handler.flush()
    if stream is not None:
      handler.python_handler.setStream(stream)
    if not attached:
      logging.root.removeHandler(handler)
    logging.root.setLevel(levels[0])
    absl_logger.setLevel(levels[1])


# ------------------------------------------------------------------------------ tolerances

# Tolerances follow from the dtype and the printed precision, never from one machine's
# result: another device count splits a batch's sums differently, another host's kernels
# (AVX2 or AVX-512, another core count) order a reduction differently, and each rounds anew.
F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23: float32's rounding, relative
# A float32 result computed in another order: a sum of n terms rounds within (n - 1)·eps of
# its terms' magnitude, and these tests' tiny models sum at most ~128 terms a level.
REORDERED_F32 = 128 * F32_EPS
BF16_EPS = float(jax.numpy.finfo(jax.numpy.bfloat16).eps)  # 2**-7: bfloat16's spacing at 1


def trained_rtol(steps: int) -> float:
  """A float32 result after `steps` training steps computed in another order: each step's
  rounding carries into the next step's parameters."""
  return steps * REORDERED_F32


def assert_printed(printed, values, decimals: int, rtol: float = 0.0) -> None:
  """Numbers printed with `decimals` decimals (strings) are `values` within one unit of that
  precision (each print rounds by up to half a unit), plus rtol·|value| where the values were
  computed another way (REORDERED_F32: on other devices or in another order). One unit is
  compared with a margin for reading a decimal back into binary (1e-6 relative)."""
  unit = 10.0 ** -decimals
  np.testing.assert_allclose([float(p) for p in printed], values, rtol=rtol,
                             atol=unit * (1 + 1e-6))


def dead_pid() -> int:
  """The id of a process that has ended."""
  process = subprocess.Popen(['true'])
  process.wait()
  return process.pid


# ---------------------------------------------------------- a tiny trained run (synthetic)


def tiny_config() -> ml_collections.ConfigDict:
  """The tiny trained run's config (conftest.tiny_workdir): 6 steps, checkpoints at 3 and 6."""
  config = demo.get_config()
  config.dataset = 'synthetic'
  config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=4)
  config.vocab_size, config.max_length, config.tokens_per_batch = 40, 12, 16 * 12
  config.num_train_steps, config.log_every_steps, config.eval_every_steps = 6, 6, 6
  config.checkpoint_every_steps = 3
  config.decode_tokens_per_batch = 64
  config.decode_extra_length = 5
  return config


_tiny = tiny_config()
# tiny_config() on the command line (but its step counts).
TINY_CLI = ['--config=experiments/demo.py', '--config.dataset=synthetic',
            '--config.model.num_layers=1', '--config.model.d_model=32', '--config.model.d_ff=64',
            f'--config.vocab_size={_tiny.vocab_size}', f'--config.max_length={_tiny.max_length}',
            f'--config.tokens_per_batch={_tiny.tokens_per_batch}',
            f'--config.decode_tokens_per_batch={_tiny.decode_tokens_per_batch}',
            f'--config.decode_extra_length={_tiny.decode_extra_length}']


def tiny_step_config() -> ml_collections.ConfigDict:
  """A two-layer tiny model without dropout, for comparing train steps."""
  config = demo.get_config()
  config.dataset = 'synthetic'
  config.model.update(num_layers=2, d_model=32, d_ff=64, num_heads=4, dropout_rate=0.0)
  config.vocab_size, config.max_length, config.tokens_per_batch = 40, 12, 16 * 12
  config.warmup_steps = 10
  return config


# ------------------------------------------------------------- a tiny corpus of text files

MAX_LENGTH = 40
TOKENS_PER_BATCH = 480


def corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
  """Sentence pairs of correlated lengths, some empty, some too long."""
  rng = random.Random(seed)
  syllables = ['the', 'ing', 'er', 'sch', 'ü', 'an', 'ke', 'lo', 'mi', 'st',
               'ein', 'ch', 'ta', 'ri', 'on', 'qu']
  words = [''.join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(200)]
  sources, targets = [], []
  for i in range(n):
    length = rng.choice([rng.randint(1, 4), rng.randint(1, 9), rng.randint(5, 15)])
    target_length = max(1, round(length * rng.uniform(0.7, 1.4)))
    sources.append(' '.join(rng.choices(words, k=length)) + '.')
    targets.append(' '.join(rng.choices(words, k=target_length)) + '!')
    if i % 97 == 5:
      (sources if i % 2 else targets)[-1] = '  '  # an empty side
  return sources, targets


def write_pair(prefix, sources, targets, langs=('en', 'de')) -> None:
  for lang, lines in zip(langs, (sources, targets), strict=True):
    with open(f'{prefix}.{lang}', 'w', encoding='utf-8') as f:
      f.write(''.join(line + '\n' for line in lines))


def make_config(tmp_path, n_train=600, **overrides) -> ml_collections.ConfigDict:
  """dataset='files' on a generated corpus written into tmp_path (train, dev, test)."""
  config = wmt_ende_base.get_config()
  config.dataset = 'files'
  for split, n, seed in (('train', n_train, 0), ('dev', 60, 1), ('test', 50, 2)):
    write_pair(tmp_path / split, *corpus(n, seed))
    config[f'{split}_files'] = str(tmp_path / split)
  config.vocab_size = 300
  config.vocab_sample_sentences = 2000
  config.max_length = MAX_LENGTH
  config.tokens_per_batch = TOKENS_PER_BATCH
  config.eval_tokens_per_batch = 256
  config.update(overrides)
  return config


# ------------------------------------- tiny models for checking decoding against brute force

SMALL = ModelConfig(vocab_size=13, num_layers=2, d_model=16, d_ff=32, num_heads=2,
                    dropout_rate=0.0, deterministic=True)
# Vocabulary: PAD, EOS and 4 words, so exhaustive search over short outputs is cheap.
EXACT = SMALL.replace(vocab_size=6, num_layers=1)


@functools.cache
def _init_fn(config: ModelConfig):
  dummy = np.ones((1, 2), np.int32)
  return jax.jit(lambda rng: Transformer(config).init(rng, dummy, dummy)['params'])


def model_params(config: ModelConfig, seed: int, embedding_scale: float = 3.0):
  """Random weights; a larger embedding makes next-token distributions peaked, so that
  near-ties (which float rounding could flip) are unlikely."""
  params = _init_fn(config)(jax.random.PRNGKey(seed))
  params['shared_embedding']['embedding'] *= embedding_scale
  return params


@functools.cache
def full_logits_fn(config: ModelConfig):
  """Teacher-forced logits [n, t, v] with no cache (Transformer.__call__): the reference."""
  return jax.jit(lambda params, src, targets: Transformer(config).apply(
      {'params': params}, src, targets))


def padded(outputs, width: int) -> np.ndarray:
  """Outputs (lists of ids) 0-padded to [n, width]: later positions cannot change earlier
  logits (causal mask), and one width means one compilation of the reference."""
  targets = np.zeros((len(outputs), width), np.int32)
  for i, output in enumerate(outputs):
    targets[i, :len(output)] = output
  return targets


def log_softmax64(logits) -> np.ndarray:
  """log-softmax over the last axis in float64."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def output_limit(src_row, extra_length: int) -> int:
  """Per-sentence maximum output length: input length + extra (§6.1), 1 without words."""
  length = int((src_row != PAD_ID).sum())
  return length + extra_length if (src_row > EOS_ID).any() else 1


def trim(ids) -> list[int]:
  """The output up to and including the first EOS."""
  ids = list(np.asarray(ids))
  return ids[:ids.index(EOS_ID) + 1] if EOS_ID in ids else ids


class CompileLog(logging.Handler):
  """The thread and function of each XLA compilation JAX logs (jax_log_compiles)."""

  def __init__(self):
    super().__init__()
    self.records = []

  def emit(self, record):
    message = record.getMessage()
    if message.startswith('Finished XLA compilation of'):
      self.records.append((record.threadName, message.split()[4]))
