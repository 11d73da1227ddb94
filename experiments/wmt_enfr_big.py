"""Transformer (big) on WMT14 English→French: 41.8 BLEU in Table 2 and the abstract (arXiv v5;
§6.1's text says 41.0, the figure of the first versions)."""
import ml_collections

from t2t_jax import config_lib

# Loaded by path, not imported: experiments/ is no installed package (config_lib.load_sibling).
wmt_ende_big = config_lib.load_sibling(__file__, 'wmt_ende_big')


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_big.get_config()
  config.tfds_name = 'wmt14_translate/fr-en'  # tfds stores the pair French first
  config.target_lang = 'fr'
  config.vocab_size = 32000  # 32000 word-pieces, §5.1
  config.model.dropout_rate = 0.1  # "P_drop = 0.1, instead of 0.3", §6.1
  return config
