"""A small Transformer for a 2-core CPU: the README's first command and the tests' default.

Same architecture and training recipe as the paper, scaled down; see wmt_ende_base.py
for what each key means.
"""
import ml_collections

from experiments import wmt_ende_base


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_base.get_config()
  config.dataset = 'synthetic'
  config.vocab_size = 64
  config.max_length = 16
  config.tokens_per_batch = 1024  # 64 rows of 16
  config.model.num_layers = 2
  config.model.d_model = 128
  config.model.d_ff = 512
  config.model.num_heads = 4
  config.model.dropout_rate = 0.1
  config.model.max_len = 64
  config.num_train_steps = 600
  config.warmup_steps = 200
  config.log_every_steps = 50
  config.eval_every_steps = 200
  config.checkpoint_every_steps = 100
  config.checkpoint_every_minutes = 0.0
  config.average_last = 5
  return config
