r"""The demo-sized model on real WMT text, a learning check: 30 minutes of training on a
2-core CPU. Bring the text: a ~10k-pair EN-DE training sample, and newstest2013 as dev
(§6.2) and test set; each a PREFIX naming PREFIX.en and PREFIX.de, one sentence a line:

  RUN="python -m t2t_jax.main --config=experiments/wmt_sample.py --workdir=runs/wmt_sample \
       --config.train_files=TRAIN_PREFIX --config.dev_files=DEV_PREFIX \
       --config.test_files=TEST_PREFIX"
  $RUN
  $RUN --mode=average
  $RUN --mode=eval

The config names no files of its own (a path on one machine is a mistake on another):
training without --config.train_files stops at once with an error naming the key.
"""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
demo = loading.load_sibling(__file__, 'demo')


def get_config() -> ml_collections.ConfigDict:
  config = demo.get_config()
  config.dataset = 'files'
  # PREFIXes from the command line (see above); the validator names a missing one.
  config.train_files = ''
  config.dev_files = ''  # newstest2013, §6.2's dev set
  config.test_files = ''
  config.eval_split = 'dev'
  config.vocab_size = 4000  # a 10k-pair sample cannot fill 37000 pieces
  config.max_length = 96
  config.tokens_per_batch = 4096
  config.eval_tokens_per_batch = 8192
  config.train_minutes = 30.0  # the time budget; the step count below is only a bound
  config.num_train_steps = 20_000
  config.warmup_steps = 500
  config.eval_every_steps = 250
  config.checkpoint_every_steps = 250
  config.average_last = 5
  return config
