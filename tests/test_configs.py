"""Configs carry the paper's numbers (Table 3), the model has the closed-form size, and the
one validator (t2t_jax/config/rules.py) names every mistake's key before any work."""
import ast
import dataclasses
import glob
import os
import re
import subprocess
import sys

import ml_collections
import pytest

from experiments import (
  demo,
  table3,
  wmt_ende_base,
  wmt_ende_big,
  wmt_enfr_base,
  wmt_enfr_big,
  wmt_sample,
)
from helpers import ROOT
from t2t_jax.config import loading, rules, uses
from t2t_jax.config import modes as modes_lib
from t2t_jax.model import transformer
from t2t_jax.model.transformer import ModelConfig
from t2t_jax.platform import errors
from t2t_jax.run import recorded as recorded_lib

# What experiments/wmt_sample.py's docstring asks for: the files come from the command line.
SAMPLE_FILES = {'train_files': 'sample/train', 'dev_files': 'sample/newstest2013',
                'test_files': 'sample/newstest2013'}

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
  rules.validate(config)
  m = ModelConfig.from_config(config)
  want = {**BASE, **TABLE3[row]}
  got = dict(N=m.num_layers, d_model=m.d_model, d_ff=m.d_ff, h=m.num_heads, d_k=m.key_size,
             d_v=m.value_size, P_drop=m.dropout_rate, eps_ls=config.label_smoothing)
  assert got == want
  assert m.positional == ('learned' if row == 'E_learned' else 'sinusoidal')
  assert config.num_train_steps == (300_000 if row == 'big' else 100_000)
  assert config.vocab_size == 37000
  # The built model has exactly the closed-form number of parameters.
  assert transformer.init_param_count(m) == transformer.closed_form_param_count(m)


def test_unknown_row_is_a_clear_error():
  with pytest.raises(ValueError, match='unknown row'):
    table3.get_config('F_nonsense')


def test_base_optimizer_and_schedule_numbers():
  c = wmt_ende_base.get_config()
  assert (c.adam_beta1, c.adam_beta2, c.adam_eps) == (0.9, 0.98, 1e-9)
  # §5.1's ~25000 tokens a side are real tokens; the key caps padded slots, 92.6% of which
  # hold real tokens with the base buckets (README's compilation benchmark).
  assert c.warmup_steps == 4000 and c.tokens_per_batch == 27000
  assert 24_000 < 0.926 * c.tokens_per_batch < 26_000
  assert (c.source_lang, c.target_lang) == ('en', 'de')


# Table 3 as printed: (PPL (dev), BLEU (dev), params ×10⁶; blank = base's, as its caption).
TABLE3_RESULTS = {
    'base': (4.92, 25.8, 65), 'A_h1': (5.29, 24.9, 65), 'A_h4': (5.00, 25.5, 65),
    'A_h16': (4.91, 25.8, 65), 'A_h32': (5.01, 25.4, 65), 'B_dk16': (5.16, 25.1, 58),
    'B_dk32': (5.01, 25.4, 60), 'C_N2': (6.11, 23.7, 36), 'C_N4': (5.19, 25.3, 50),
    'C_N8': (4.88, 25.5, 80), 'C_d256': (5.75, 24.5, 28), 'C_d1024': (4.66, 26.0, 168),
    'C_dff1024': (5.12, 25.4, 53), 'C_dff4096': (4.75, 26.2, 90), 'D_drop0': (5.77, 24.6, 65),
    'D_drop2': (4.95, 25.5, 65), 'D_ls0': (4.67, 25.3, 65), 'D_ls2': (5.47, 25.7, 65),
    'E_learned': (4.92, 25.7, 65), 'big': (4.33, 26.4, 213),
}


@pytest.mark.parametrize('row', sorted(TABLE3))
def test_table3_paper_row_and_protocol(row):
  """paper_row: Table 3's printed cells; every row evaluates as §6.2 (dev, no averaging)."""
  ppl, bleu, params = TABLE3_RESULTS[row]
  steps = 300_000 if row == 'big' else 100_000
  want = {**BASE, **TABLE3[row], 'train_steps': steps, 'ppl': ppl, 'bleu': bleu,
          'params_millions': params}
  assert table3.paper_row(row) == want
  config = table3.get_config(row)
  assert (config.eval_split, config.decode_params) == ('dev', 'checkpoint')
  assert table3.rows() == list(TABLE3_ORDER)


TABLE3_ORDER = ('base', 'A_h1', 'A_h4', 'A_h16', 'A_h32', 'B_dk16', 'B_dk32', 'C_N2', 'C_N4',
                'C_N8', 'C_d256', 'C_d1024', 'C_dff1024', 'C_dff4096', 'D_drop0', 'D_drop2',
                'D_ls0', 'D_ls2', 'E_learned', 'big')


def test_table2_configs_keep_test_set_and_averaging():
  """Table 2 (§6.1): newstest2014, the averaged checkpoints, saved every 10 minutes of the
  paper's steps (§5.2: base 0.4 s a step, big 1.0 s) so the window is the same on any
  machine."""
  for get, last, seconds_a_step in ((wmt_ende_base.get_config, 5, 0.4),
                                    (wmt_ende_big.get_config, 20, 1.0),
                                    (wmt_enfr_base.get_config, 5, 0.4),
                                    (wmt_enfr_big.get_config, 20, 1.0)):
    config = get()
    assert (config.eval_split, config.decode_params, config.average_last) == ('test', 'auto',
                                                                              last)
    assert config.checkpoint_every_steps == round(10 * 60 / seconds_a_step)
    assert config.checkpoint_every_minutes == 0


def test_big_and_enfr():
  big, enfr = wmt_ende_big.get_config(), wmt_enfr_big.get_config()
  assert big.model.dropout_rate == 0.3 and enfr.model.dropout_rate == 0.1
  assert enfr.vocab_size == 32000 and (enfr.source_lang, enfr.target_lang) == ('en', 'fr')
  assert enfr.tfds_name == 'wmt14_translate/fr-en'
  assert (enfr.model.d_model, enfr.model.d_ff, enfr.model.num_heads) == (1024, 4096, 16)


def test_enfr_base_is_the_base_model_on_the_enfr_data():
  """Table 2's EN→FR base (38.1): base's model and training, big EN→FR's data and vocabulary."""
  base, enfr_big, enfr_base = (wmt_ende_base.get_config(), wmt_enfr_big.get_config(),
                               wmt_enfr_base.get_config())
  assert enfr_base.model.to_dict() == base.model.to_dict()
  for key in ('tfds_name', 'source_lang', 'target_lang', 'vocab_size'):
    assert enfr_base[key] == enfr_big[key], key
  differing = {key for key in base.keys() if key != 'model' and base[key] != enfr_base[key]}
  assert differing == {'tfds_name', 'target_lang', 'vocab_size'}
  assert enfr_base.average_last == 5  # §6.1, base models


def test_closed_form_count_is_independent_arithmetic():
  """Base by hand: 37000·512 shared embedding + 6 encoder and 6 decoder layers."""
  attention = 4 * 512 * 512
  ffn = 2 * 512 * 2048 + 2048 + 512
  expected = 37000 * 512 + 6 * (attention + ffn + 2 * 1024) + 6 * (2 * attention + ffn + 3 * 1024)
  assert expected == 63_045_632
  config = ModelConfig.from_config(wmt_ende_base.get_config())
  assert transformer.init_param_count(config) == expected


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
    rules.validate(config)


def test_unknown_model_key_is_named():
  config = wmt_ende_base.get_config()
  config.model.n_layers = 3
  for check in (rules.validate, ModelConfig.from_config):
    with pytest.raises(errors.UserError, match=r'^config\.model\.n_layers: unknown key; '
                                               r"known keys: \['d_ff', "):
      check(config)


# One bad value (or more) for every key of RULES, each to be named by validate. Values that
# ml_collections refuses to store (1.5 in an int field, 'yes' in a bool one) cannot reach
# validate; None and True (for an int) can.
BAD_VALUES = [
    ('dataset', 'wmt'), ('dataset', ''), ('tfds_name', ''), ('tfds_data_dir', None),
    ('tfds_manual_dir', None), ('source_lang', ''), ('target_lang', ' '), ('train_split', ''),
    ('dev_split', None), ('test_split', None), ('train_files', None), ('dev_files', None),
    ('test_files', None), ('init_from', None),
    ('demo_num_train', 0), ('demo_num_eval', -1), ('demo_seed', -1),
    ('vocab_size', 0), ('vocab_sample_sentences', 0), ('vocab_sample_sentences', -5),
    ('max_length', 0), ('tokens_per_batch', -1), ('eval_tokens_per_batch', 0),
    ('bucket_growth', 0.9), ('bucket_band', -1), ('batching', 'pack'), ('pack_length', 0),
    ('model', None), ('model.num_layers', 0),
    ('model.d_model', -512), ('model.d_ff', 0), ('model.num_heads', 0), ('model.d_k', 0),
    ('model.d_v', -64), ('model.dropout_rate', 1.0), ('model.positional', 'absolute'),
    ('model.max_len', 0), ('model.dtype', 'float64'), ('model.kernels', 'gpu'),
    ('compile_ahead', None),
    ('label_smoothing', 1.5), ('label_smoothing', -0.1),
    ('num_train_steps', 0), ('num_train_steps', True), ('train_minutes', -1.0),
    ('warmup_steps', 0), ('adam_beta1', 1.0), ('adam_beta2', -0.1), ('adam_eps', 0.0),
    ('learning_rate_scale', -1.0), ('grad_accum_steps', 0), ('grad_accum_steps', True),
    ('seed', -1), ('seed', 2**63), ('seed', None),
    ('log_every_steps', 0), ('eval_every_steps', -100), ('beam_size', 0), ('beam_alpha', -0.6),
    ('decode_method', 'top_p'), ('sample_temperature', 0.0), ('sample_temperature', -1.0),
    ('sample_temperature', float('inf')), ('beam_alpha', float('nan')),
    ('sample_top_p', 0.0), ('sample_top_p', 1.5),
    ('sample_top_k', -1), ('sample_seed', -1), ('sample_seed', 2**32), ('ensemble', None),
    ('ensemble_weights', None), ('lr_schedule', 'cosine'), ('learning_rate', -1.0),
    ('average_select', 'worst'),
    ('decode_extra_length', -1), ('decode_tokens_per_batch', -1), ('decode_bucket_growth', 0.5),
    ('max_decode_input_length', 0), ('export_format', 'onnx'),
    ('eval_split', 'valid'), ('eval_bleu_every_steps', -1), ('checkpoint_every_minutes', -10.0),
    ('checkpoint_every_steps', -1), ('keep_checkpoints', 0), ('average_last', 0),
    ('keep_best', -1), ('early_stopping_patience', -2), ('early_stopping_metric', 'bleu'),
    ('eval_metrics', ''),
    ('average_allow_fewer', None), ('restore_step', -1), ('restart', None),
    ('decode_params', 'latest'), ('decode_params', ''), ('compilation_cache_dir', None),
]


def set_key(config, key, value):
  *parents, leaf = key.split('.')
  for parent in parents:
    config = config[parent]
  config[leaf] = value


@pytest.mark.parametrize('key,value', BAD_VALUES, ids=[f'{k}={v!r}' for k, v in BAD_VALUES])
def test_every_bad_value_is_named(key, value):
  config = demo.get_config()  # demo has every key of base and the demo_* ones
  set_key(config, key, value)
  # config.<key>: what is allowed, then what was given.
  expected = re.escape(f'config.{key}: must be ') + '.+' + re.escape(f', got {value!r}') + '$'
  with pytest.raises(errors.UserError, match=expected):
    rules.validate(config)


@pytest.mark.parametrize('ensemble,weights,message', [
    ('', '1', r"weighs the models of config.ensemble, which is ''"),
    ('runs/a', '1', r"1 weight\(s\) for 2 model\(s\): one for this run, then one for each "
                    r"of config.ensemble='runs/a'"),
    ('runs/a,runs/b', '1,2', r'2 weight\(s\) for 3 model\(s\)'),
    ('runs/a', '1,0', 'must be positive numbers'),
    ('runs/a', '1,nan', 'must be positive numbers'),
    ('runs/a', 'a,b', 'must be positive numbers'),
])
def test_ensemble_weights_are_one_positive_number_a_model(ensemble, weights, message):
  config = demo.get_config()
  config.ensemble, config.ensemble_weights = ensemble, weights
  with pytest.raises(errors.UserError, match=r'^config.ensemble_weights=.*' + message):
    rules.validate(config, 'translate')


@pytest.mark.parametrize('value,ok', [('xla+one_pass_loss', True), ('cpu+fused_attention', True),
                                      ('xla+rbg_dropout+one_pass_loss', True), ('auto', True),
                                      ('xla+nope', False), ('xla+rbg_dropout+rbg_dropout', False),
                                      ('one_pass_loss', False), ('auto+one_pass_loss', False)])
def test_kernels_take_levers_after_a_choice(value, ok):
  config = demo.get_config()
  config.model.kernels = value
  if ok:
    rules.validate(config)
    assert ModelConfig.from_config(config).forms.name.split('+')[1:] == value.split('+')[1:]
  else:
    with pytest.raises(errors.UserError, match=r"^config.model.kernels: must be 'auto' or one of "
                                               r"\('xla', 'cpu'\), then levers joined by '\+'"):
      rules.validate(config)


def test_decode_tokens_per_batch_0_is_per_platform():
  config = demo.get_config()
  assert config.decode_tokens_per_batch == 0
  assert [rules.decode_tokens_of(config, b) for b in ('cpu', 'gpu', 'tpu')] == [4096, 16384,
                                                                                16384]
  config.decode_tokens_per_batch = 1000
  assert rules.decode_tokens_of(config, 'gpu') == 1000


def test_a_constant_rate_needs_its_rate():
  config = demo.get_config()
  config.lr_schedule = 'constant'
  with pytest.raises(errors.UserError, match=r"^config.learning_rate: must be > 0 with "
                                             r"config.lr_schedule='constant'.*got 0.0$"):
    rules.validate(config)
  config.learning_rate = 1e-5
  rules.validate(config)


def test_ensemble_weights_sum_to_one():
  config = demo.get_config()
  assert rules.ensemble_weights(config) is None
  config.ensemble, config.ensemble_weights = 'runs/a, runs/b', '2, 1,1'
  assert rules.ensemble_weights(config) == (0.5, 0.25, 0.25)


def test_every_key_has_a_rule_and_a_bad_value():
  """A key added to the configs without a rule (or a test of it) fails here."""
  for config in (wmt_ende_base.get_config(), demo.get_config()):
    assert set(config.keys()) <= set(rules.RULES)
    assert set(config.model.keys()) == set(rules.MODEL_RULES)
  assert set(rules.RULES) == set(demo.get_config().keys())  # no rule for a gone key
  assert {key.split('.')[0] for key, _ in BAD_VALUES} == set(rules.RULES)
  assert {key for key, _ in BAD_VALUES if key.startswith('model.')} == {
      f'model.{k}' for k in rules.MODEL_RULES}


def test_model_rules_cover_every_model_config_field():
  """MODEL_RULES against the dataclass itself: a field added to ModelConfig without a rule
  (or a rule left for a gone field) fails here. vocab_size is a top-level key (RULES);
  deterministic and decode are modes set in code, not config keys."""
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  assert set(rules.MODEL_RULES) == fields - {'vocab_size', 'deterministic', 'decode'}
  assert 'vocab_size' in rules.RULES


@pytest.mark.parametrize('changes,message', [
    ({'source_lang': 'de', 'target_lang': 'de'}, r'config\.target_lang: must differ'),
    ({'keep_checkpoints': 4, 'average_last': 5}, r'config\.average_last: must be ≤ '
     r'config\.keep_checkpoints \(4\)'),
    ({'model.positional': 'learned', 'model.max_len': 255},
     r'config\.model\.max_len: must be ≥ config\.max_length \(256\)'),
    ({'model.positional': 'learned', 'decode_extra_length': 512},
     r'config\.decode_extra_length: must be < config\.model\.max_len \(512\)'),
    ({'sample_top_k': 37001}, r'config\.sample_top_k: must be ≤ config\.vocab_size \(37000\)'),
    ({'eval_metrics': 'bleu,meteor'}, r"config\.eval_metrics='bleu,meteor': name one or more "
     r'of bleu, chrf, ter'),
    ({'early_stopping_patience': 3, 'early_stopping_metric': 'dev_bleu'},
     r"config\.early_stopping_metric='dev_bleu': needs dev BLEU during training, "
     r'config\.eval_bleu_every_steps > 0'),
    # A packed row: it left the longer pairs out with an INFO line, or 1e8 tokens failed in
    # XLA's allocator after a compilation.
    ({'batching': 'packed', 'pack_length': 255},
     r'config\.pack_length: must be ≥ config\.max_length \(256\) with packed batches'),
    ({'batching': 'packed', 'pack_length': 100_000_000},
     r'config\.pack_length: must be ≤ config\.tokens_per_batch \(27000\)'),
    ({'batching': 'packed', 'pack_length': 27000},
     r'config\.pack_length: 27000 tokens a row need 391\.1 GiB a device for the attention '
     r'weights alone \(1 rows'),
])
def test_rules_across_keys(changes, message):
  config = wmt_ende_base.get_config()
  for key, value in changes.items():
    set_key(config, key, value)
  with pytest.raises(ValueError, match=message):
    rules.validate(config)


def test_learned_positions_at_the_limits_are_fine():
  config = table3.get_config('E_learned')
  config.decode_extra_length = config.model.max_len - 1  # one input position left
  config.max_length = config.model.max_len
  config.average_last = config.keep_checkpoints
  rules.validate(config)
  assert ModelConfig.from_config(config).positional == 'learned'


def test_a_missing_key_is_named():
  config = wmt_ende_base.get_config()
  del config['restore_step']
  with pytest.raises(errors.UserError, match=r'^config\.restore_step: missing'):
    rules.validate(config)
  config = wmt_ende_base.get_config()
  del config.model['positional']
  with pytest.raises(errors.UserError, match=r'^config\.model\.positional: missing'):
    rules.validate(config)


def sample_with_files():
  """experiments/wmt_sample.py with the three --config.*_files its docstring asks for."""
  config = wmt_sample.get_config()
  config.update(SAMPLE_FILES)
  return config


EXPERIMENTS = {
    'wmt_ende_base': wmt_ende_base.get_config, 'wmt_ende_big': wmt_ende_big.get_config,
    'wmt_enfr_big': wmt_enfr_big.get_config, 'wmt_enfr_base': wmt_enfr_base.get_config,
    'demo': demo.get_config,
    'wmt_sample': sample_with_files,
    **{f'table3:{row}': (lambda row=row: table3.get_config(row)) for row in sorted(TABLE3)},
}


@pytest.mark.parametrize('mode', rules.MODES)
@pytest.mark.parametrize('name', sorted(EXPERIMENTS))
def test_every_experiment_validates_in_every_mode(name, mode):
  assert rules.validate(EXPERIMENTS[name](), mode) is None


@pytest.mark.parametrize('name', sorted(EXPERIMENTS))
def test_model_config_from_config_is_the_config_model(name):
  """ModelConfig.from_config gives what rules.model_config gave: every key of
  config.model as the field of that name, vocab_size shared, dtype and kernels 'auto' resolved."""
  config = EXPERIMENTS[name]()
  m = ModelConfig.from_config(config)
  fields = config.model.to_dict()
  if fields['dtype'] == 'auto':
    fields['dtype'] = rules.compute_dtype()
  if fields['kernels'] == 'auto':
    fields['kernels'] = rules.kernel_forms()
  assert m == ModelConfig(vocab_size=config.vocab_size, **fields)
  assert m.dtype == 'float32' and m.kernels == 'cpu'  # 'auto' on the CPU the tests run on
  assert (m.vocab_size, m.d_model, m.num_layers) == (
      config.vocab_size, config.model.d_model, config.model.num_layers)
  heads = config.model.d_model // config.model.num_heads
  assert m.key_size == (config.model.d_k or heads)
  assert m.value_size == (config.model.d_v or heads)
  assert not m.deterministic and not m.decode


def test_from_config_keeps_a_concrete_dtype():
  config = demo.get_config()
  config.model.dtype = 'bfloat16'
  assert ModelConfig.from_config(config).dtype == 'bfloat16'


def test_demo_dataset_on_the_base_config_names_the_missing_key():
  """Was an AttributeError traceback: base has no demo_* keys."""
  config = wmt_ende_base.get_config()
  config.dataset = 'demo'
  expected = (r"^config\.demo_num_train: missing; config\.dataset='demo' needs it "
              r'\(see experiments/demo\.py\)$')
  for mode in ('train', 'eval'):
    with pytest.raises(errors.UserError, match=expected):
      rules.validate(config, mode)
  for mode in ('params', 'average', 'translate', 'attention'):  # read the workdir only
    rules.validate(config, mode)


def test_files_dataset_needs_train_files_for_training_only():
  config = wmt_ende_base.get_config()
  config.dataset = 'files'
  with pytest.raises(errors.UserError, match=r"^config\.train_files: empty; config\.dataset="
                                             r"'files' needs it for --mode=train \(pass "
                                             r'--config\.train_files=PREFIX: reads PREFIX\.en '
                                             r'and PREFIX\.de'):
    rules.validate(config, 'train')
  for mode in ('params', 'average', 'translate', 'attention'):
    rules.validate(config, mode)


def test_eval_needs_the_files_of_config_eval_split():
  config = wmt_ende_base.get_config()
  config.update(dataset='files', eval_split='dev', train_files='t', test_files='t')
  rules.validate(config, 'train')  # training without a dev set is allowed
  with pytest.raises(errors.UserError, match=r"^config\.dev_files: empty; config\.dataset="
                                             r"'files' needs it for --mode=eval with "
                                             r"config\.eval_split='dev'"):
    rules.validate(config, 'eval')
  config.eval_split = 'test'
  rules.validate(config, 'eval')


def test_tfds_eval_needs_the_split_of_config_eval_split():
  config = wmt_ende_base.get_config()
  config.update(eval_split='dev', dev_split='')
  rules.validate(config, 'train')
  with pytest.raises(errors.UserError, match=r'^config\.dev_split: empty; .*--mode=eval.*'
                                             r'--config\.dev_split=SPLIT'):
    rules.validate(config, 'eval')


def test_wmt_sample_asks_for_its_files_in_one_line():
  with pytest.raises(errors.UserError) as raised:
    rules.validate(wmt_sample.get_config(), 'train')
  message = str(raised.value)
  assert message.startswith('config.train_files: empty;') and '\n' not in message
  assert '--config.train_files=PREFIX' in message


@pytest.mark.parametrize('key,dataset', [(key, dataset) for key, reader in rules.READ_BY.items()
                                         for dataset in rules.DATASETS if dataset != reader])
def test_a_key_its_dataset_does_not_read_is_refused(key, dataset):
  """train_files with dataset='demo' once trained on the demo corpus without a word."""
  config = demo.get_config()
  config.dataset, config[key] = dataset, 'some/prefix'
  with pytest.raises(errors.UserError, match=(
      rf"^config\.{key}='some/prefix': read only with config\.dataset='{rules.READ_BY[key]}', "
      rf"not '{dataset}', which would ignore it; add --config\.dataset={rules.READ_BY[key]}")):
    rules.validate(config, 'params')
  config.dataset = rules.READ_BY[key]
  rules.validate(config, 'params')  # read there


@pytest.mark.parametrize('name', sorted(EXPERIMENTS))
def test_shipped_configs_name_no_path_of_a_machine(name):
  config = EXPERIMENTS[name]() if name != 'wmt_sample' else wmt_sample.get_config()
  for key in ('train_files', 'dev_files', 'test_files', 'tfds_data_dir', 'tfds_manual_dir'):
    assert config[key] == '', key
  for path in os.listdir(os.path.join(ROOT, 'experiments')):
    if path.endswith('.py'):
      with open(os.path.join(ROOT, 'experiments', path), encoding='utf-8') as f:
        assert '../shared' not in f.read(), path


def test_dataset_table_covers_every_dataset_and_only_modes():
  assert set(rules.DATASET_KEYS) == set(rules.DATASETS)
  for needs in rules.DATASET_KEYS.values():
    assert set(needs.keys) <= set(rules.MODES)
  with pytest.raises(ValueError, match='mode='):
    rules.validate(demo.get_config(), 'training')


def test_modes_are_main_py_s():
  """The --mode choices (cli.py) are config/modes.py's MODES itself, the modes `validate`
  knows, and each has its module in t2t_jax/modes/ (read from the sources: importing cli or
  main would define their absl flags)."""
  with open(os.path.join(ROOT, 't2t_jax', 'cli.py'), encoding='utf-8') as f:
    tree = ast.parse(f.read())
  enum = [call for call in ast.walk(tree) if isinstance(call, ast.Call)
          and ast.unparse(call.func) == 'flags.DEFINE_enum' and call.args[0].value == 'mode']
  assert len(enum) == 1 and ast.unparse(enum[0].args[2]) == 'MODES'
  assert rules.MODES is modes_lib.MODES
  with open(os.path.join(ROOT, 't2t_jax', 'main.py'), encoding='utf-8') as f:
    table = [node for node in ast.walk(ast.parse(f.read())) if isinstance(node, ast.Assign)
             and ast.unparse(node.targets[0]) == 'MODES']
  assert [key.value for key in table[0].value.keys] == list(modes_lib.MODES)
  assert sorted(p[:-3] for p in os.listdir(os.path.join(ROOT, 't2t_jax', 'modes'))
                if p.endswith('.py') and p != '__init__.py') == sorted(modes_lib.MODES)


@pytest.mark.e2e
def test_the_rules_import_no_other_module_of_the_project():
  """config → data → model: transformer.py imports the rules, so they must not import it
  (or anything that does); t2t_jax.platform.errors and the modes' names are their only
  project imports (in a new interpreter: this test process has imported everything)."""
  with open(os.path.join(ROOT, 't2t_jax', 'config', 'rules.py'), encoding='utf-8') as f:
    tree = ast.parse(f.read())
  imported = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      imported |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      imported |= {f'{node.module}.{alias.name}' for alias in node.names}
  assert {name for name in imported if name.startswith('t2t_jax')} == {
      't2t_jax.platform.errors', 't2t_jax.config.modes.MODES'}
  loaded = subprocess.run(
      [sys.executable, '-c', 'import sys, t2t_jax.config.rules; '
       'print(sorted(m for m in sys.modules if m.startswith("t2t_jax")))'],
      cwd=ROOT, capture_output=True, text=True, check=True).stdout
  assert ast.literal_eval(loaded) == ['t2t_jax', 't2t_jax.config', 't2t_jax.config.modes',
                                      't2t_jax.config.rules', 't2t_jax.platform',
                                      't2t_jax.platform.errors']


def test_check_model_wants_the_resolved_dtype():
  fields = dataclasses.asdict(ModelConfig(vocab_size=10))
  rules.check_model(fields)
  with pytest.raises(errors.UserError, match=r"^config\.model\.dtype: must be one of "
                                             r".*'auto' is resolved by "
                                             r"ModelConfig\.from_config.*got 'auto'$"):
    rules.check_model({**fields, 'dtype': 'auto'})
  with pytest.raises(errors.UserError, match=r'^config\.vocab_size: must be a positive '
                                             r'integer, got 0$'):
    rules.check_model({**fields, 'vocab_size': 0})


def recorded_demo() -> dict:
  """What DIR/config.json holds after a demo run started with restore_step and restart."""
  config = demo.get_config()
  config.restore_step, config.restart = 7, True
  return config.to_dict()


def test_a_run_recorded_before_model_kernels_existed_reads_as_auto():
  """config.json of an older run has no transformer.kernels: it means 'auto', and may be set
  (hardware forms compute the same model)."""
  recorded = recorded_demo()
  del recorded['model']['kernels']
  config = recorded_lib.from_recorded(recorded, [], 'DIR/config.json')
  assert config.model.kernels == 'auto'
  rules.validate(config, 'eval')
  config = recorded_lib.from_recorded(recorded, ['config.model.kernels=xla'], 'DIR/config.json')
  assert ModelConfig.from_config(config).kernels == 'xla'
  assert ModelConfig.from_config(config, platform='cpu').forms.name == 'xla'
  config.model.kernels = 'auto'
  assert ModelConfig.from_config(config, platform='cpu').kernels == 'cpu'
  assert ModelConfig.from_config(config, platform='cuda').kernels == 'xla'
  assert ModelConfig.from_config(config, platform='tpu').dtype == 'bfloat16'


def test_a_run_recorded_before_packing_reads_as_bucketed():
  """config.json of a run older than config.batching: it was batched in §5.1's buckets."""
  recorded = recorded_demo()
  for key in recorded_lib.ADDED_BATCHING:
    del recorded[key]
  config = recorded_lib.from_recorded(recorded, [], 'DIR/config.json')
  assert (config.batching, rules.batching_of(config, 'cuda')) == ('buckets', 'buckets')
  rules.validate(config, 'eval')


def test_a_run_recorded_before_sampling_and_ensembles_decodes_as_before():
  """config.json of an older run has no decode_method, sample_* or ensemble: they read as
  beam search of the run alone, and may be set as any decoding key."""
  recorded = recorded_demo()
  for key in recorded_lib.ADDED_KEYS:
    del recorded[key]
  config = recorded_lib.from_recorded(recorded, [], 'DIR/config.json')
  assert {key: config[key] for key in recorded_lib.ADDED_KEYS} == {
      key: demo.get_config()[key] for key in recorded_lib.ADDED_KEYS}
  rules.validate(config, 'translate')
  config = recorded_lib.from_recorded(recorded, [
      'config.decode_method=sample', 'config.sample_temperature=0.7', 'config.sample_seed=9',
      'config.ensemble=runs/a:3,runs/b'], 'DIR/config.json')
  assert (config.decode_method, config.sample_temperature, config.sample_seed,
          config.ensemble) == ('sample', 0.7, 9, 'runs/a:3,runs/b')


def test_a_recorded_config_comes_back_with_its_types_and_overrides():
  recorded = recorded_demo()
  config = recorded_lib.from_recorded(
      recorded, ['config.beam_size=8', 'config.beam_alpha=1', 'config.average_allow_fewer=true',
                 'config.eval_split=dev', 'config.model.dtype=float32'], 'DIR/config.json')
  assert (config.beam_size, config.beam_alpha, config.eval_split) == (8, 1.0, 'dev')
  assert config.average_allow_fewer is True and isinstance(config.beam_alpha, float)
  assert config.model.dtype == 'float32'  # precision only: may differ from the run's 'auto'
  # restore_step and restart act on the invocation that had them, not on later ones.
  assert (config.restore_step, config.restart) == (0, False)

  rules.validate(config, 'eval')
  assert ModelConfig.from_config(config) == ModelConfig.from_config(demo.get_config()).replace(
      dtype='float32')


@pytest.mark.parametrize('override,message', [
    ('config.model.num_heads=8', 'config.model.num_heads=8 contradicts the trained run recorded '
                                 'in DIR/config.json (4)'),
    ('config.target_lang=fr', "config.target_lang='fr' contradicts"),
    ('config.beam_size=4.5', '--config.beam_size=4.5: expected type int'),
    ('config.model.d_q=3', '--config.model.d_q: no such key in DIR/config.json'),
    ('config.beam_size.x=3', '--config.beam_size.x: no such key'),
    ('config.restart=maybe', '--config.restart=maybe: expected type bool'),
])
def test_a_recorded_config_refuses_contradictions_and_unknown_keys(override, message):
  with pytest.raises(errors.UserError, match=re.escape(message)):
    recorded_lib.from_recorded(recorded_demo(), [override], 'DIR/config.json')


def test_check_against_recorded_lets_decoding_keys_change():
  config = demo.get_config()
  config.beam_size, config.decode_extra_length, config.test_files = 12, 3, '/elsewhere/test'
  recorded_lib.check_against_recorded(config, recorded_demo(), 'DIR/config.json')  # no error
  config.model.d_ff = 256
  with pytest.raises(errors.UserError, match=r'config\.model\.d_ff=256 contradicts'):
    recorded_lib.check_against_recorded(config, recorded_demo(), 'DIR/config.json')


@pytest.mark.e2e
def test_configs_build_on_each_other_by_path_from_any_directory(tmp_path):
  """experiments/ is no installed package: a config loads the one it builds on by path
  (loading.load_sibling), so `--config=/abs/path/experiments/X.py` works from any directory
  without the repository on sys.path, and gives the config the tests import."""
  wanted = [('wmt_ende_big', [], wmt_ende_big.get_config()),
            ('wmt_enfr_big', [], wmt_enfr_big.get_config()),
            ('demo', [], demo.get_config()), ('wmt_sample', [], wmt_sample.get_config()),
            ('table3', ['big'], table3.get_config('big')),
            ('table3', ['C_N2'], table3.get_config('C_N2'))]
  loads = [(os.path.join(ROOT, 'experiments', f'{name}.py'), args) for name, args, _ in wanted]
  script = ('import sys\nfrom t2t_jax.config import loading\n'
            "print([loading.load_module(path, 'config').get_config(*args).to_json()\n"
            f'       for path, args in {loads!r}])\n'
            "print('experiments' in sys.modules)\n")
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}  # sys.path[0]: tmp_path
  result = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  configs, imported = result.stdout.strip().splitlines()[-2:]
  assert imported == 'False'  # by path, not `from experiments import ...`
  assert ast.literal_eval(configs) == [config.to_json() for *_, config in wanted]


# experiments/wmt_ende_base_colab.py: the base model on one 16 GiB accelerator (Colab's TPU v5e
# chip, a single GPU), loaded by path as --config loads it.
wmt_ende_base_colab = loading.load_sibling(os.path.join(ROOT, 'experiments', 'x.py'),
                                           'wmt_ende_base_colab')
FREE_DRIVE_BYTES = 15e9  # a free Google Drive


def leaves(tree, prefix=''):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


@pytest.mark.parametrize('mode', rules.MODES)
def test_colab_config_validates_in_every_mode(mode):
  assert rules.validate(wmt_ende_base_colab.get_config(), mode) is None


def test_colab_config_is_base_but_what_one_16gib_accelerator_needs():
  base = dict(leaves(wmt_ende_base.get_config().to_dict()))
  colab = dict(leaves(wmt_ende_base_colab.get_config().to_dict()))
  assert {key for key in base if base[key] != colab[key]} == {
      'model.dtype', 'grad_accum_steps', 'keep_checkpoints', 'checkpoint_every_minutes'}
  assert set(base) == set(colab)
  config = wmt_ende_base_colab.get_config()
  assert config.model.dtype == 'bfloat16'
  assert ModelConfig.from_config(config).dtype == 'bfloat16'  # also on this CPU
  # The update is §5.1's ~25k tokens a side: tokens_per_batch is the global batch, which
  # grad_accum_steps cuts into micro-batches (batching.py, train_step.py).
  assert config.tokens_per_batch == wmt_ende_base.get_config().tokens_per_batch == 27000
  assert config.grad_accum_steps == 8  # ~3125 tokens a micro-batch, as each of §5.2's 8 GPUs
  assert config.average_last == 5 <= config.keep_checkpoints  # §6.1


def test_colab_config_checkpoints_fit_a_free_drive():
  config = wmt_ende_base_colab.get_config()
  params = transformer.closed_form_param_count(ModelConfig.from_config(config))
  assert params == 63_045_632
  checkpoint = params * 4 * 3  # float32 params and Adam's two moments: the bound (orbax: less)
  averaged = params * 4
  # keep_checkpoints, one more while the next is written, and the averaged parameters: within
  # a third of the Drive, the rest for data_cache/, tfds' WMT14 and whatever else is there.
  assert (config.keep_checkpoints + 1) * checkpoint + averaged < FREE_DRIVE_BYTES / 3
  # The base config's 20 would not fit: the reason the Colab config keeps fewer.
  assert (wmt_ende_base.get_config().keep_checkpoints + 1) * checkpoint > FREE_DRIVE_BYTES


@pytest.mark.e2e
def test_colab_config_loads_by_path_and_counts_its_parameters(tmp_path):
  """`--mode=params` as the notebook's commands load it: by path, from another directory,
  in a process without the repository on its path."""
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  result = subprocess.run(
      [sys.executable, '-m', 't2t_jax.main',
       f'--config={os.path.join(ROOT, "experiments", "wmt_ende_base_colab.py")}',
       '--mode=params'], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().splitlines()[-1] == 'params: 63045632'


# ------------------------------------------------------------ overrides a command would ignore


def experiment_configs() -> dict[str, ml_collections.ConfigDict]:
  """Every config of experiments/ (Table 3's study file: its base row)."""
  found = {}
  for path in sorted(glob.glob(os.path.join(ROOT, 'experiments', '*.py'))):
    name = os.path.basename(path)[:-3]
    if name == '__init__':
      continue
    module = loading.load_module(path, f'experiments_for_uses_{name}')
    found[name] = module.get_config('base') if name == 'table3' else module.get_config()
  return found


def flat_keys(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
  keys = []
  for key, value in config.items():
    keys += (flat_keys(value, f'{prefix}{key}.') if isinstance(value, ml_collections.ConfigDict)
             else [f'{prefix}{key}'])
  return keys


def test_every_key_of_every_experiment_config_has_a_use():
  configs = experiment_configs()
  assert len(configs) >= 8
  for name, config in configs.items():
    assert set(flat_keys(config)) <= set(uses.USES), name


def use_context(use: uses.Use) -> tuple[ml_collections.ConfigDict, str, str]:
  """A config, mode and batching in which `use`'s key is read."""
  config = demo.get_config()
  if use.datasets:
    config.dataset = sorted(use.datasets)[0]
  if use.methods:
    config.decode_method = sorted(use.methods)[0]
  return config, sorted(use.modes)[0], sorted(use.batchings or {'buckets'})[0]


@pytest.mark.parametrize('key', sorted(uses.USES))
def test_an_override_the_command_would_ignore_is_an_error(key):
  """`--config.pack_length=128` with §5.1's buckets, `--config.demo_num_train=10` with
  dataset='files', `--config.warmup_steps=8000` with --mode=eval were accepted and ignored."""
  use = uses.USES[key]
  config, mode, batching = use_context(use)
  uses.check_overrides_used(config, mode, [key], batching)  # read there: no error
  ignored = re.escape(f'--config.{key}: this command would ignore it; it is read with ')
  other_modes = sorted(set(uses.EVERY_MODE) - use.modes)
  if other_modes:
    with pytest.raises(errors.UserError, match=ignored + '--mode='):
      uses.check_overrides_used(config, other_modes[0], [key], batching)
  if use.datasets:
    other = config.copy_and_resolve_references()
    other.dataset = sorted(set(rules.DATASETS) - use.datasets)[0]
    with pytest.raises(errors.UserError, match=ignored + 'config.dataset='):
      uses.check_overrides_used(other, mode, [key], batching)
  if use.batchings:
    other_batching = sorted(set(rules.BATCHINGS) - use.batchings)[0]
    with pytest.raises(errors.UserError, match=ignored + 'config.batching='):
      uses.check_overrides_used(config, mode, [key], other_batching)
  if use.methods:
    other = config.copy_and_resolve_references()
    other.decode_method = 'beam'
    with pytest.raises(errors.UserError, match=ignored + 'config.decode_method='):
      uses.check_overrides_used(other, mode, [key], batching)


def test_an_ignored_override_is_one_line_on_the_command_line(cli, tmp_path, tiny_workdir):
  done = cli('--config=experiments/demo.py', f'--workdir={tmp_path}', '--mode=params',
             '--config.dataset=files', '--config.demo_num_train=10')
  assert done.returncode == 1
  # With --config the command line may be reused for every mode: the mode is not checked.
  assert done.stderr.strip().splitlines()[-1] == (
      't2t_jax: error: --config.demo_num_train: this command would ignore it; it is read with '
      "config.dataset=demo (this is --mode=params, dataset 'files', batching 'buckets', "
      "decode_method 'beam'); drop it")
  on_cpu = cli('--config=experiments/demo.py', f'--workdir={tmp_path}',
               '--config.pack_length=128')
  assert on_cpu.stderr.strip().splitlines()[-1].startswith(
      "t2t_jax: error: --config.pack_length: this command would ignore it; it is read with "
      "config.batching=packed ('auto' is 'buckets' here)")
  reused = cli('--config=experiments/demo.py', '--mode=params', '--config.warmup_steps=10')
  assert reused.returncode == 0, reused.stderr[-2000:]
  # A trained run's own command: the mode too.
  eval_ = cli(f'--workdir={tiny_workdir}', '--mode=eval', '--config.warmup_steps=10')
  assert eval_.stderr.strip().splitlines()[-1] == (
      "t2t_jax: error: --config.warmup_steps: this command would ignore it; it is read with "
      "--mode=train|study (this is --mode=eval, dataset 'synthetic', batching 'buckets', "
      "decode_method 'beam'); drop it")
