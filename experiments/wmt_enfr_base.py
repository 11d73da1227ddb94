"""Transformer (base) on WMT14 English→French: 38.1 BLEU (Table 2).

The base model of wmt_ende_base.py (Table 3 "base", dropout 0.1) on the English-French data:
WMT 2014 English-French, 36M sentences, a 32000 word-piece vocabulary (§5.1), averaged over
the last 5 checkpoints like every base model (§6.1). wmt_enfr_big.py takes its data from here.
"""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
wmt_ende_base = loading.load_sibling(__file__, 'wmt_ende_base')


def use_enfr_data(config: ml_collections.ConfigDict) -> None:
  """The English→French data of Table 2, in place of English→German."""
  config.tfds_name = 'wmt14_translate/fr-en'  # tfds stores the pair French first
  config.target_lang = 'fr'
  config.vocab_size = 32000  # 32000 word-pieces, §5.1


def get_config() -> ml_collections.ConfigDict:
  config = wmt_ende_base.get_config()
  use_enfr_data(config)
  # config.batching: the base's 'auto', packed rows on GPU and TPU (one compilation where the
  # buckets give tens; EN→FR's target side is the longer, so rows are 256 French tokens).
  return config
