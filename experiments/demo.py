"""The built-in demo: a small Transformer on a generated English→German corpus, sized for
a 2-core CPU (the README's first command; its runs' times and BLEU: WORKSPACE.md, Results).

The corpus (t2t_jax/data/demo_corpus/) is a seeded grammar with German gender, case and
verb-final subordinate clauses; it is written into WORKDIR/demo_corpus/ on first use.
Same architecture and recipe as the paper, scaled down; see wmt_ende_base.py for the keys.
Train it on your own files instead with
  --config.dataset=files --config.train_files=PREFIX ...
(reading PREFIX.en and PREFIX.de, one sentence a line; experiments/wmt_sample.py does so).
"""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
wmt_ende_base = loading.load_sibling(__file__, 'wmt_ende_base')


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_base.get_config()
  config.dataset = 'demo'
  config.demo_num_train = 50_000
  config.demo_num_eval = 1000  # dev and test sentences each, none of them in train
  config.demo_seed = 0
  config.vocab_size = 2000
  config.vocab_sample_sentences = 100_000
  config.max_length = 64
  config.tokens_per_batch = 2048
  config.eval_tokens_per_batch = 4096
  # Both sides padded to the longer one's bucket, in coarser buckets: 8 batch shapes
  # (compilations) instead of ~40, for 0.84 instead of 0.93 padding efficiency; on a
  # ten-minute CPU run compiling is the bigger cost.
  config.bucket_band = 0
  config.bucket_growth = 1.25
  config.pack_length = 64  # config.batching='packed': rows of max_length tokens
  config.model.num_layers = 3
  config.model.d_model = 128
  config.model.d_ff = 512
  config.model.num_heads = 4
  config.model.dropout_rate = 0.1
  config.model.max_len = 256
  config.learning_rate_scale = 1.0
  config.warmup_steps = 400
  config.num_train_steps = 1000  # with setup, averaging and eval: 3–7 minutes on 2 cores
  config.log_every_steps = 50
  config.eval_every_steps = 400
  config.checkpoint_every_steps = 50
  config.checkpoint_every_minutes = 0.0
  config.average_last = 4  # the last 150 steps
  return config
