"""Configs carry the paper's numbers (Table 3) and the model has the closed-form size."""
import pytest

from experiments import table3, wmt_ende_base, wmt_ende_big, wmt_enfr_big
from t2t_jax import config_lib, model

# Table 3, written out independently of experiments/: N, d_model, d_ff, h, d_k, d_v, P_drop, ε_ls.
BASE = dict(N=6, d_model=512, d_ff=2048, h=8, d_k=64, d_v=64, P_drop=0.1, eps_ls=0.1)
TABLE3 = {
    'base': {}, 'A_h1': dict(h=1, d_k=512, d_v=512), 'A_h4': dict(h=4, d_k=128, d_v=128),
    'A_h16': dict(h=16, d_k=32, d_v=32), 'A_h32': dict(h=32, d_k=16, d_v=16),
    'B_dk16': dict(d_k=16), 'B_dk32': dict(d_k=32), 'C_N2': dict(N=2), 'C_N4': dict(N=4),
    'C_N8': dict(N=8), 'C_d256': dict(d_model=256, d_k=32, d_v=32),
    'C_d1024': dict(d_model=1024, d_k=128, d_v=128), 'C_dff1024': dict(d_ff=1024),
    'C_dff4096': dict(d_ff=4096), 'D_drop0': dict(P_drop=0.0), 'D_drop2': dict(P_drop=0.2),
    'D_ls0': dict(eps_ls=0.0), 'D_ls2': dict(eps_ls=0.2), 'E_learned': {},
    'big': dict(d_model=1024, d_ff=4096, h=16, P_drop=0.3),
}


@pytest.mark.parametrize('row', sorted(TABLE3))
def test_table3_row(row):
  config = table3.get_config(row)
  m = config_lib.validate(config)
  want = {**BASE, **TABLE3[row]}
  got = dict(N=m.num_layers, d_model=m.d_model, d_ff=m.d_ff, h=m.num_heads, d_k=m.key_size,
             d_v=m.value_size, P_drop=m.dropout_rate, eps_ls=config.label_smoothing)
  assert got == want
  assert m.positional == ('learned' if row == 'E_learned' else 'sinusoidal')
  assert config.num_train_steps == (300_000 if row == 'big' else 100_000)
  assert config.vocab_size == 37000
  # The built model has exactly the closed-form number of parameters.
  assert model.init_param_count(m) == model.closed_form_param_count(m)


def test_unknown_row_is_a_clear_error():
  with pytest.raises(ValueError, match='unknown row'):
    table3.get_config('F_nonsense')


def test_base_optimizer_and_schedule_numbers():
  c = wmt_ende_base.get_config()
  assert (c.adam_beta1, c.adam_beta2, c.adam_eps) == (0.9, 0.98, 1e-9)
  assert c.warmup_steps == 4000 and c.tokens_per_batch == 25000
  assert (c.source_lang, c.target_lang) == ('en', 'de')


def test_big_and_enfr():
  big, enfr = wmt_ende_big.get_config(), wmt_enfr_big.get_config()
  assert big.model.dropout_rate == 0.3 and enfr.model.dropout_rate == 0.1
  assert enfr.vocab_size == 32000 and (enfr.source_lang, enfr.target_lang) == ('en', 'fr')
  assert enfr.tfds_name == 'wmt14_translate/fr-en'
  assert (enfr.model.d_model, enfr.model.d_ff, enfr.model.num_heads) == (1024, 4096, 16)


def test_closed_form_count_is_independent_arithmetic():
  """Base by hand: 37000·512 shared embedding + 6 encoder and 6 decoder layers."""
  attention = 4 * 512 * 512
  ffn = 2 * 512 * 2048 + 2048 + 512
  expected = 37000 * 512 + 6 * (attention + ffn + 2 * 1024) + 6 * (2 * attention + ffn + 3 * 1024)
  assert expected == 63_045_632
  assert model.init_param_count(config_lib.validate(wmt_ende_base.get_config())) == expected


@pytest.mark.parametrize('key,value,message', [
    ('label_smoothing', 1.5, 'config.label_smoothing'),
    ('warmup_steps', 0, 'config.warmup_steps'),
    ('dataset', 'wmt', 'config.dataset'),
    ('adam_eps', -1.0, 'config.adam_eps'),
])
def test_bad_config_names_the_key(key, value, message):
  config = wmt_ende_base.get_config()
  config[key] = value
  with pytest.raises(ValueError, match=message.replace('.', r'\.')):
    config_lib.validate(config)


def test_unknown_model_key_is_named():
  config = wmt_ende_base.get_config()
  config.model.n_layers = 3
  with pytest.raises(ValueError, match=r'config\.model\.n_layers'):
    config_lib.validate(config)
