"""Transformer (big) on WMT14 English→French: 41.0 BLEU (Table 2; NeurIPS version; the arXiv
revision prints 41.8)."""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
wmt_ende_big = loading.load_sibling(__file__, 'wmt_ende_big')
wmt_enfr_base = loading.load_sibling(__file__, 'wmt_enfr_base')


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_big.get_config()
  wmt_enfr_base.use_enfr_data(config)  # WMT14 English-French, 32000 word-pieces (§5.1)
  config.model.dropout_rate = 0.1  # "P_drop = 0.1, instead of 0.3", §6.1
  # config.batching: the base's 'auto', packed rows on GPU and TPU, buckets on a CPU.
  return config
