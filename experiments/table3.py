"""Every row of Table 3 (variations on the base model, EN→DE, newstest2013 dev).

Pick a row through the config-string argument:
  --config=experiments/table3.py:B_dk16
Rows leave everything else at "base"; blank cells of Table 3 mean "as base".
"""
import ml_collections

from t2t_jax import config_lib

# Loaded by path, not imported: experiments/ is no installed package (config_lib.load_sibling).
wmt_ende_base = config_lib.load_sibling(__file__, 'wmt_ende_base')
wmt_ende_big = config_lib.load_sibling(__file__, 'wmt_ende_big')

# row name -> overrides of the base config; keys with a dot go into config.model.
ROWS: dict[str, dict] = {
    'base': {},
    # (A) number of heads at constant computation: d_k = d_v = d_model / h.
    'A_h1': {'model.num_heads': 1, 'model.d_k': 512, 'model.d_v': 512},
    'A_h4': {'model.num_heads': 4, 'model.d_k': 128, 'model.d_v': 128},
    'A_h16': {'model.num_heads': 16, 'model.d_k': 32, 'model.d_v': 32},
    'A_h32': {'model.num_heads': 32, 'model.d_k': 16, 'model.d_v': 16},
    # (B) smaller attention key size d_k; d_v stays 64.
    'B_dk16': {'model.d_k': 16, 'model.d_v': 64},
    'B_dk32': {'model.d_k': 32, 'model.d_v': 64},
    # (C) bigger and smaller models.
    'C_N2': {'model.num_layers': 2},
    'C_N4': {'model.num_layers': 4},
    'C_N8': {'model.num_layers': 8},
    'C_d256': {'model.d_model': 256, 'model.d_k': 32, 'model.d_v': 32},
    'C_d1024': {'model.d_model': 1024, 'model.d_k': 128, 'model.d_v': 128},
    'C_dff1024': {'model.d_ff': 1024},
    'C_dff4096': {'model.d_ff': 4096},
    # (D) dropout and label smoothing.
    'D_drop0': {'model.dropout_rate': 0.0},
    'D_drop2': {'model.dropout_rate': 0.2},
    'D_ls0': {'label_smoothing': 0.0},
    'D_ls2': {'label_smoothing': 0.2},
    # (E) learned positional embedding instead of sinusoids.
    'E_learned': {'model.positional': 'learned'},
}

# Table 3's last column (×10^6), for the README's comparison; blank cells = base.
PAPER_PARAMS_MILLIONS: dict[str, int] = {
    'base': 65, 'B_dk16': 58, 'B_dk32': 60, 'C_N2': 36, 'C_N4': 50, 'C_N8': 80,
    'C_d256': 28, 'C_d1024': 168, 'C_dff1024': 53, 'C_dff4096': 90, 'big': 213,
}


def get_config(row: str = 'base') -> ml_collections.ConfigDict:
  if row == 'big':
    return wmt_ende_big.get_config()
  if row not in ROWS:
    raise ValueError(f'experiments/table3.py: unknown row {row!r}; '
                     f'choose one of {sorted([*ROWS, "big"])}')
  config = wmt_ende_base.get_config()
  for key, value in ROWS[row].items():
    target = config
    *parents, leaf = key.split('.')
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return config
