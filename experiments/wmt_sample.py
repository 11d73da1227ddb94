"""The demo-sized model on real WMT text: the 10k-pair EN-DE sample in ../shared/data/
(newstest2013 as dev set), a learning check: 30 minutes of training on a 2-core CPU.

  python -m t2t_jax.main --config=experiments/wmt_sample.py --workdir=runs/wmt_sample
  python -m t2t_jax.main --config=experiments/wmt_sample.py --workdir=runs/wmt_sample --mode=average
  python -m t2t_jax.main --config=experiments/wmt_sample.py --workdir=runs/wmt_sample --mode=eval

Paths are relative to the repository root; set --config.train_files etc. for your own data.
"""
import ml_collections

from experiments import demo


def get_config() -> ml_collections.ConfigDict:
  config = demo.get_config()
  config.dataset = 'files'
  config.train_files = '../shared/data/wmt_ende_sample/train'
  config.dev_files = '../shared/data/wmt_ende_sample/newstest2013'  # §6.2's dev set
  config.test_files = '../shared/data/wmt_ende_sample/newstest2013'
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
