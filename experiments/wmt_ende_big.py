"""Transformer (big) on WMT14 English→German: Table 3, row "big" (28.4 BLEU, Table 2)."""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
wmt_ende_base = loading.load_sibling(__file__, 'wmt_ende_base')


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_base.get_config()
  config.model.d_model = 1024  # Table 3 "big"
  config.model.d_ff = 4096  # Table 3 "big"
  config.model.num_heads = 16  # Table 3 "big"; d_k = d_v = 1024 / 16 = 64
  config.model.dropout_rate = 0.3  # P_drop for big EN→DE, Table 3 and §6.1
  config.num_train_steps = 300_000  # §5.2
  config.average_last = 20  # §6.1: big averages the last 20 checkpoints
  config.checkpoint_every_steps = 600  # §6.1's 10 minutes at §5.2's 1.0 s a step
  # config.batching: the base's 'auto', packed rows (one compilation) on GPU and TPU, §5.1's
  # buckets on a CPU, where packing is slower (docs/performance.md#batching).
  return config
