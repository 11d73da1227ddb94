"""Every row of Table 3 (variations on the base model, EN→DE, newstest2013 dev).

Pick a row through the config-string argument:
  --config=experiments/table3.py:B_dk16
or train and evaluate many rows, and tabulate them beside the paper's (t2t_jax/modes/study.py):
  --config=experiments/table3.py --mode=study --rows=A_h1,A_h4
Rows leave everything else at "base"; blank cells of Table 3 mean "as base" (its caption:
"Unlisted values are identical to those of the base model").

Table 3's protocol (§6.2), which every row here follows: the development set newstest2013,
beam search as in §6.1, and no checkpoint averaging; perplexity per word-piece. (Table 2's
configs keep newstest2014 and averaging, §6.1.)
"""
import ml_collections

from t2t_jax.config import loading

# Loaded by path, not imported: experiments/ is no installed package (loading.load_sibling).
wmt_ende_base = loading.load_sibling(__file__, 'wmt_ende_base')
wmt_ende_big = loading.load_sibling(__file__, 'wmt_ende_big')

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

# Table 3 as printed: dev perplexity (per word-piece), dev BLEU and parameters (×10^6),
# newstest2013. Blank cells are the base model's, as the caption says; rows A, D and E print
# no parameter count, so theirs is base's 65.
PAPER_RESULTS: dict[str, tuple[float, float, int]] = {  # row -> (PPL, BLEU, params ×10^6)
    'base': (4.92, 25.8, 65),
    'A_h1': (5.29, 24.9, 65), 'A_h4': (5.00, 25.5, 65), 'A_h16': (4.91, 25.8, 65),
    'A_h32': (5.01, 25.4, 65),
    'B_dk16': (5.16, 25.1, 58), 'B_dk32': (5.01, 25.4, 60),
    'C_N2': (6.11, 23.7, 36), 'C_N4': (5.19, 25.3, 50), 'C_N8': (4.88, 25.5, 80),
    'C_d256': (5.75, 24.5, 28), 'C_d1024': (4.66, 26.0, 168),
    'C_dff1024': (5.12, 25.4, 53), 'C_dff4096': (4.75, 26.2, 90),
    'D_drop0': (5.77, 24.6, 65), 'D_drop2': (4.95, 25.5, 65),
    'D_ls0': (4.67, 25.3, 65), 'D_ls2': (5.47, 25.7, 65),
    'E_learned': (4.92, 25.7, 65),
    'big': (4.33, 26.4, 213),
}
# Table 3's hyperparameter columns of its base and big rows; the others vary `ROWS`' keys.
PAPER_BASE = {'N': 6, 'd_model': 512, 'd_ff': 2048, 'h': 8, 'd_k': 64, 'd_v': 64,
              'P_drop': 0.1, 'eps_ls': 0.1, 'train_steps': 100_000}
PAPER_BIG = {**PAPER_BASE, 'd_model': 1024, 'd_ff': 4096, 'h': 16, 'P_drop': 0.3,
             'train_steps': 300_000}
# config key -> Table 3's column
COLUMN_OF_KEY = {'model.num_layers': 'N', 'model.d_model': 'd_model', 'model.d_ff': 'd_ff',
                 'model.num_heads': 'h', 'model.d_k': 'd_k', 'model.d_v': 'd_v',
                 'model.dropout_rate': 'P_drop', 'label_smoothing': 'eps_ls'}


def paper_row(row: str) -> dict:
  """Table 3's printed row: its columns (blank = base's) and results."""
  ppl, bleu, params = PAPER_RESULTS[row]
  columns = dict(PAPER_BIG if row == 'big' else PAPER_BASE)
  for key, value in ROWS.get(row, {}).items():
    if key in COLUMN_OF_KEY:  # row E's positions have no column of their own
      columns[COLUMN_OF_KEY[key]] = value
  return {**columns, 'ppl': ppl, 'bleu': bleu, 'params_millions': params}


def rows() -> list[str]:
  """Every row, in Table 3's order: what --mode=study runs without --rows."""
  return [*ROWS, 'big']


def get_config(row: str = 'base') -> ml_collections.ConfigDict:
  if row not in PAPER_RESULTS:
    raise ValueError(f'experiments/table3.py: unknown row {row!r}; '
                     f'choose one of {sorted(rows())}')
  config = wmt_ende_big.get_config() if row == 'big' else wmt_ende_base.get_config()
  for key, value in ROWS.get(row, {}).items():
    target = config
    *parents, leaf = key.split('.')
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  # §6.2's protocol: "on the development set, newstest2013. We used beam search as described
  # in the previous section, but no checkpoint averaging."
  config.eval_split = 'dev'
  config.decode_params = 'checkpoint'
  return config
