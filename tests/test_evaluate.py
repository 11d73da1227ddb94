"""Translation and evaluation modes: batching, input order, awkward inputs, output files.

The tiny trained run (`tiny_workdir`, conftest.py) is shared with test_translator.py."""
import hashlib
import json
import logging
import os
import re

import jax
import numpy as np
import pytest

from helpers import REORDERED_F32, TINY_CLI, CompileLog, run_process, tiny_config
from t2t_jax.apps import evaluate
from t2t_jax.apps.translator import Translator
from t2t_jax.decoding import bleu
from t2t_jax.decoding.batch_plan import decoding_batches
from t2t_jax.modes import eval as eval_mode
from t2t_jax.modes import train as trainer
from t2t_jax.platform import errors
from t2t_jax.run import averaging
from test_bleu import assert_equals_the_command_line


@pytest.fixture
def workdir(tiny_workdir):
  return tiny_workdir


@pytest.mark.parametrize('num_devices', [1, 8])
def test_decoding_batches_cover_every_sentence_once(num_devices):
  lengths = np.random.default_rng(0).integers(1, 60, size=203)
  seen = []
  rows_of_length = {}
  for indices, rows, length in decoding_batches(
      lengths, tokens_per_batch=256, num_devices=num_devices, bucket_growth=1.1):
    assert rows % num_devices == 0 and len(indices) <= rows
    assert all(lengths[i] <= length for i in indices)
    assert rows_of_length.setdefault(length, rows) == rows  # one shape per bucket
    seen += list(indices)
  assert sorted(seen) == list(range(len(lengths)))


def test_translation_keeps_input_order_and_handles_awkward_lines(workdir, caplog):
  translator = Translator(tiny_config(), workdir)
  sentences = ['5 6 7', '', '9 9 9 9 9 9 9 9', '   ', '3', '11 12']
  together = translator(sentences)
  one_by_one = [translator([s])[0] for s in sentences]
  assert together == one_by_one
  assert together[1] == '' and together[3] == ''
  assert all(t == '' or all(tok.isdigit() for tok in t.split()) for t in together)
  # Too long: truncated (with a warning), never a crash.
  translator.config.max_decode_input_length = 4
  out = translator(['5 6 7 8 9 10 11'])
  assert len(out) == 1 and 'decoding its first 4' in caplog.text


@pytest.mark.e2e
def test_translate_splits_a_cpu_into_a_device_per_core(workdir):
  """Without a device count of the user's, --mode=translate decodes on xla.decoding_devices()
  CPU devices (one per core, at most MAX_DECODING_DEVICES), each its own rows, and writes
  what one device writes. A process's device count is set when it starts: two processes."""
  from t2t_jax.platform import xla
  lines = '5 6 7\n8 9 10 11 12\n13\n6 6 6 6\n7 8\n'
  args = [*TINY_CLI, f'--workdir={workdir}', '--mode=translate', '--input=-']
  split = run_process(*args, input=lines, devices=None)
  one = run_process(*args, input=lines, devices=1)
  assert split.returncode == 0 and one.returncode == 0, (split.stderr + one.stderr)[-3000:]
  assert f'on {xla.decoding_devices()} devices' in split.stderr and 'on 1 device ' in one.stderr
  assert split.stdout == one.stdout and len(split.stdout.split('\n')) == 6


def test_translate_and_eval_modes(cli, workdir, tmp_path):
  result = cli(*TINY_CLI, f'--workdir={workdir}', '--mode=translate', '--input=-',
               input='5 6 7\n\n8 9\n')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.split('\n')
  assert len(lines) == 4 and lines[1] == '' and lines[3] == ''  # 3 lines, in order
  result = cli(*TINY_CLI, f'--workdir={workdir}', '--mode=eval')
  assert result.returncode == 0, result.stderr[-3000:]
  out_dir = eval_folder(workdir, 'test-checkpoint-6-beam4-alpha0.6-extra5')
  hyps = open(os.path.join(out_dir, 'hypotheses.txt')).read().splitlines()
  refs = open(os.path.join(out_dir, 'references.txt')).read().splitlines()
  scores = json.load(open(os.path.join(out_dir, 'scores.json')))
  assert len(hyps) == len(refs) == scores['sentences'] > 0
  # Every metric of config.eval_metrics (by default all three), as bleu.py computes them
  # (a float survives JSON exactly).
  expected = bleu.bleu_scores(hyps, refs, target_lang='de', metrics=bleu.METRICS)
  assert {k: scores[k] for k in expected} == expected
  assert scores['sacrebleu_signature'].startswith('nrefs:1|case:mixed')
  assert scores['params'] == 'checkpoints/6'
  # The evaluated split, named: the synthetic task has no file, so its name and the hash of
  # the file its sentences would make (references.txt, for the reference side).
  reference = scores['eval_set']['reference']
  assert (reference['path'], reference['lang'], reference['lines']) == (
      'synthetic:test', 'de', len(refs))
  with open(os.path.join(out_dir, 'references.txt'), 'rb') as f:
    assert reference['sha256'] == hashlib.sha256(f.read()).hexdigest()
  assert scores['eval_set']['source']['lines'] == len(refs)
  # The last line names each figure; the log has them in full, and the split's sides.
  figures = (f"test BLEU {scores['sacrebleu']:.2f} (chrF2 {scores['chrf']['score']:.1f}, TER "
             f"{scores['ter']['score']:.1f}), tokenized BLEU {scores['tok_bleu']:.2f}, "
             f"perplexity {scores['perplexity']:.2f} of checkpoints/6: ")
  assert result.stdout.startswith(figures) and result.stdout.endswith('/scores.json\n')
  for line in evaluate.report_lines(scores):
    assert line in result.stderr
  assert f"test reference: synthetic:test ({len(refs)} lines, sha256 " in result.stderr
  # The split's perplexity per piece, from the scored parameters: what the training loop
  # measured on the same held-out set at step 6 (in its own batches: another order of sums).
  records = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  dev = [r for r in records if r.get('step') == 6 and 'dev_perplexity' in r][-1]
  assert scores['perplexity'] == pytest.approx(dev['dev_perplexity'], rel=REORDERED_F32)
  assert scores['loss'] == pytest.approx(dev['dev_loss'], rel=REORDERED_F32)


@pytest.mark.e2e
def test_eval_scores_are_sacrebleus_command_line_on_its_files(run):
  """scores.json's every figure is sacreBLEU's command line's on the folder's
  references.txt and hypotheses.txt (test_bleu.assert_equals_the_command_line)."""
  scores = evaluate.evaluate(tiny_config(), run)
  with open(os.path.join(scores['folder'], 'scores.json')) as f:
    assert json.load(f) == {k: v for k, v in scores.items() if k != 'folder'}
  assert_equals_the_command_line(scores, os.path.join(scores['folder'], 'references.txt'),
                                 os.path.join(scores['folder'], 'hypotheses.txt'))


@pytest.mark.slow
def test_eval_metrics_bleu_leaves_out_chrf_and_ter(run):
  config = tiny_config()
  config.eval_metrics = 'bleu'
  line = eval_mode.run(config, run)
  assert re.match(r'test BLEU \d+\.\d\d, tokenized BLEU \d+\.\d\d, perplexity ', line), line
  with open(line.rsplit(': ', 1)[1]) as f:
    scores = json.load(f)
  assert {'bleu', 'sacrebleu', 'tok_bleu'} <= set(scores) and not {'chrf', 'ter'} & set(scores)


@pytest.mark.parametrize('given', ['bleu,meteor', ' , '])
def test_a_bad_eval_metrics_is_one_line_naming_it(cli, workdir, given):
  result = cli(*TINY_CLI, f'--workdir={workdir}', '--mode=eval', f'--config.eval_metrics={given}')
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f't2t_jax: error: config.eval_metrics={given!r}: name one or more of '
                         'bleu, chrf, ter'), last
  config = tiny_config()
  config.eval_metrics = given
  with pytest.raises(errors.UserError, match='config.eval_metrics='):
    evaluate.evaluate(config, workdir)  # called directly: before any decoding too


def test_the_evaluated_split_is_named_by_path_lines_and_hash(tmp_path):
  """Files by absolute path and the SHA-256 of their bytes (a last line without its newline
  counted); the demo's in the workdir; tfds, which has no file, by name and the hash of the
  file its sentences would make."""
  source, reference = b'a b\nc\n', 'Ä b\nc'.encode()  # no newline at the end
  (tmp_path / 'test.en').write_bytes(source)
  (tmp_path / 'test.de').write_bytes(reference)
  config = tiny_config()
  config.update(dataset='files', test_files=str(tmp_path / 'test'), eval_split='test')
  found = evaluate.eval_set(config, 'unused', ['a b', 'c'], ['Ä b', 'c'])
  assert found == {
      'source': {'path': str(tmp_path / 'test.en'), 'lang': 'en', 'lines': 2,
                 'sha256': hashlib.sha256(source).hexdigest()},
      'reference': {'path': str(tmp_path / 'test.de'), 'lang': 'de', 'lines': 2,
                    'sha256': hashlib.sha256(reference).hexdigest()}}
  config.update(dataset='demo', demo_num_train=10, demo_num_eval=3, eval_split='dev')
  found = evaluate.eval_set(config, str(tmp_path / 'run'), [], [])
  path = tmp_path / 'run' / 'demo_corpus' / 'dev.de'
  assert found['reference'] == {'path': str(path), 'lang': 'de', 'lines': 3,
                                'sha256': hashlib.sha256(path.read_bytes()).hexdigest()}
  config.update(dataset='tfds', eval_split='test')
  found = evaluate.eval_set(config, 'unused', ['a b', 'c'], ['Ä b', 'c'])
  assert found['reference'] == {'path': 'tfds:wmt14_translate/de-en/test', 'lang': 'de',
                                'lines': 2, 'sha256': hashlib.sha256(reference + b'\n').hexdigest()}


def test_translate_prefers_the_averaged_checkpoint(workdir):
  averaging.average_checkpoints(workdir, 2)
  assert Translator(tiny_config(), workdir).source == 'averaged/6'


def test_attention_mode_writes_one_png_per_layer_and_kind(cli, workdir, tmp_path):
  result = cli(*TINY_CLI, f'--workdir={workdir}', '--mode=attention', '--input=5 6 7 8',
               f'--output={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  names = sorted(os.listdir(tmp_path))
  assert names == ['decoder_cross_attention_layer0.png', 'decoder_self_attention_layer0.png',
                   'encoder_self_attention_layer0.png']
  for name in names:
    assert open(tmp_path / name, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_attention_weights_are_distributions(workdir):
  from t2t_jax.apps import attention_maps
  translator = Translator(tiny_config(), workdir)
  weights = attention_maps.attention_weights(translator.params, translator.model_config,
                                             [5, 6, 7, 1], [8, 9, 1])
  assert set(weights) == {('encoder_self_attention', 0), ('decoder_self_attention', 0),
                          ('decoder_cross_attention', 0)}
  assert weights[('encoder_self_attention', 0)].shape == (4, 4, 4)  # [heads, q, k]
  assert weights[('decoder_cross_attention', 0)].shape == (4, 3, 4)
  for w in weights.values():
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
  # Causal: no decoder position attends to a later one.
  assert np.all(np.triu(weights[('decoder_self_attention', 0)], k=1) == 0)


@pytest.mark.slow
def test_dev_bleu_during_training_matches_eval_mode(tmp_path):
  config = tiny_config()
  config.eval_bleu_every_steps = 3
  trainer.train_and_evaluate(config, str(tmp_path))
  records = [json.loads(line) for line in open(tmp_path / 'metrics.jsonl')]
  bleu_steps = [r['step'] for r in records if 'dev_bleu' in r]
  assert bleu_steps == [3, 6]
  config.eval_split = 'dev'
  scores = evaluate.evaluate(config, str(tmp_path))
  assert scores['params'] == 'checkpoints/6'
  assert [r['dev_bleu'] for r in records if 'dev_bleu' in r][-1] == pytest.approx(
      scores['sacrebleu'])


def test_stdin_is_split_on_newlines_only_like_a_file(cli, workdir, tmp_path):
  """U+2028, NEL, form feed and a lone CR are characters inside a line, not line ends:
  4 lines in, 4 lines out, the same as from a file of the same bytes."""
  raw = '5\u20286\n7\x0c8\n9\r10\n\x85\n'.encode('utf-8')
  (tmp_path / 'in.txt').write_bytes(raw)
  args = [*TINY_CLI, f'--workdir={workdir}', '--mode=translate']
  from_stdin = cli(*args, '--input=-', input=raw)
  assert from_stdin.returncode == 0, from_stdin.stderr[-3000:]
  from_file = cli(*args, f'--input={tmp_path / "in.txt"}')
  assert from_stdin.stdout == from_file.stdout
  assert from_stdin.stdout.count('\n') == 4 and from_stdin.stdout.endswith('\n\n')
  # A stream translates as lines arrive: the line before a bad one is answered, not lost.
  bad = cli(*args, '--input=-', input=b'5 6\n7 \xff\n8\n')
  assert bad.returncode != 0 and bad.stdout.count('\n') == 1
  assert bad.stderr.strip().splitlines()[-1].startswith(
      't2t_jax: error: <stdin>, line 2: invalid UTF-8')


def test_a_hypothesis_never_holds_a_line_break(workdir, monkeypatch):
  translator = Translator(tiny_config(), workdir)
  # Byte-fallback pieces can decode to any character, line breaks included.
  monkeypatch.setattr(translator.tokenizer, 'decode', lambda ids: 'a\nb\rc\u2028d\x85e')
  assert translator(['5 6', '', '7']) == ['a b c d e', '', 'a b c d e']


@pytest.mark.slow
def test_evaluations_of_other_splits_params_or_settings_do_not_overwrite(workdir):
  averaging.average_checkpoints(workdir, 2)
  runs = [('dev', 'averaged', 0, 4), ('test', 'averaged', 0, 4), ('test', 'checkpoint', 0, 4),
          ('test', 'checkpoint', 3, 4), ('test', 'checkpoint', 0, 1)]
  for split, which, step, beam in runs:
    config = tiny_config()
    config.eval_split, config.decode_params, config.restore_step = split, which, step
    config.beam_size = beam
    scores = evaluate.evaluate(config, workdir)
    expected = f'{"averaged" if which == "averaged" else "checkpoints"}/{step or 6}'
    assert (scores['split'], scores['params'], scores['beam_size']) == (split, expected, beam)
  names = {f'{split}-{which}-{step or 6}-beam{beam}-alpha0.6-extra5'
           for split, which, step, beam in runs}
  for name in names:
    scores = json.load(open(os.path.join(eval_folder(workdir, name), 'scores.json')))
    assert name.startswith(f'{scores["split"]}-') and f'-beam{scores["beam_size"]}-' in name


@pytest.mark.slow
def test_evaluations_by_sampling_or_an_ensemble_name_their_search(workdir):
  """Sampling and an ensemble evaluate into folders of their own and record their settings
  (beam search of one run records none, so its folders keep their names); an ensemble of
  the run with itself translates as the run does."""
  runs = {'beam': ({}, 'beam4-alpha0.6-extra5'),
          'ensemble': ({'ensemble': workdir}, 'beam4-alpha0.6-ensemble2-extra5'),
          'sample': ({'decode_method': 'sample', 'sample_seed': 2}, 'sample-T1-top0-seed2-extra5')}
  scores, hypotheses = {}, {}
  for name, (changes, readable) in runs.items():
    config = tiny_config()
    config.update(changes)
    scores[name] = evaluate.evaluate(config, workdir)
    kind, step = scores[name]['params'].split('/')  # averaged if an earlier test averaged
    folder = eval_folder(workdir, f'test-{kind.rstrip("s")}-{step}-{readable}')
    hypotheses[name] = open(os.path.join(folder, 'hypotheses.txt')).read()
  assert hypotheses['ensemble'] == hypotheses['beam'] != hypotheses['sample']
  assert [(m['workdir'], m['params']) for m in scores['ensemble']['ensemble']] == [
      (workdir, scores['beam']['params'])]
  assert (scores['sample']['decode_method'], scores['sample']['sample_seed']) == ('sample', 2)
  assert not {'decode_method', 'ensemble'} & set(scores['beam'])
  # Weights make another mean: a folder of its own, beside the unweighted one.
  config = tiny_config()
  config.update(ensemble=workdir, ensemble_weights='3,1')
  assert evaluate.evaluate(config, workdir)['ensemble_weights'] == [0.75, 0.25]
  kind, step = scores['ensemble']['params'].split('/')
  readable = f'test-{kind.rstrip("s")}-{step}-beam4-alpha0.6-ensemble2-extra5'
  assert len([n for n in os.listdir(os.path.join(workdir, 'eval'))
              if n.rsplit('-', 1)[0] == readable]) == 2


def test_eval_compiles_its_search_and_loss_ahead_where_cores_allow(workdir, monkeypatch):
  """With background threads (ahead.default_threads: 4 cores or more), --mode=eval compiles
  the search for every decoding batch shape and the loss's eval step for every batch shape
  on them while it decodes, and scores as it does compiling each when met."""
  from t2t_jax.platform import ahead
  config = tiny_config()
  config.decode_params = 'checkpoint'  # an earlier test may have averaged
  # A held-out set of 48 pairs (synthetic.eval_set: one batch's rows): over INTERACTIVE_ROWS,
  # so decoded in batches of its own length buckets.
  config.tokens_per_batch = 48 * config.max_length
  expected = evaluate.evaluate(config, workdir)
  monkeypatch.setattr(ahead, 'default_threads', lambda: 2)
  handler = CompileLog()
  logging.getLogger('jax').addHandler(handler)
  jax.config.update('jax_log_compiles', True)
  try:
    got = evaluate.evaluate(config, workdir)
  finally:
    jax.config.update('jax_log_compiles', False)
    logging.getLogger('jax').removeHandler(handler)
  threads = {name: [thread for thread, function in handler.records if name in function]
             for name in ('search', 'eval_step')}
  assert len(threads['search']) > 1 and len(threads['eval_step']) == 1, threads
  for name, where in threads.items():
    # The first search shape may be compiled by the call itself, which needs it at once.
    assert sum(not t.startswith('compile_ahead') for t in where) <= 1, (name, where)
  assert [t.startswith('compile_ahead') for t in threads['eval_step']] == [True]
  assert got == expected


def eval_folder(workdir, readable):
  """eval/<readable>-<fingerprint>: the one evaluation folder of that readable name."""
  found = [n for n in os.listdir(os.path.join(workdir, 'eval'))
           if n.rsplit('-', 1)[0] == readable]
  assert len(found) == 1, (readable, os.listdir(os.path.join(workdir, 'eval')))
  return os.path.join(workdir, 'eval', found[0])


def test_the_recorded_run_drives_eval_without_config(cli, workdir):
  """No --config and no training override repeated; a decoding key may still change."""
  result = cli(f'--workdir={workdir}', '--mode=eval', '--config.beam_size=2',
               '--config.eval_split=dev', '--config.decode_params=checkpoint')
  assert result.returncode == 0, result.stderr[-3000:]
  out_dir = eval_folder(workdir, 'dev-checkpoint-6-beam2-alpha0.6-extra5')
  scores = json.load(open(os.path.join(out_dir, 'scores.json')))
  assert scores['beam_size'] == 2 and scores['sentences'] == 16  # tokens_per_batch // 12
  records = [json.loads(line) for line in open(os.path.join(workdir, 'provenance.jsonl'))]
  assert records[0]['first_step'] == 1 and records[0]['versions']['jax']
  assert 'revision' in records[0]['code'] or records[0]['code'] == {}


@pytest.mark.parametrize('args,named', [
    (['--config.model.num_layers=2'], "config.model.num_layers=2 contradicts the trained run"),
    (['--config.vocab_size=41'], 'config.vocab_size=41 contradicts'),
    (['--config=experiments/demo.py'], 'config.vocab_size=2000 contradicts'),
    ([a for a in TINY_CLI if a != '--config.model.d_ff=64'],
     'config.model.d_ff=512 contradicts the trained run recorded in'),
    (['--config.beam_size=two'], '--config.beam_size=two: expected type int (the recorded value '
                                 'is 4)'),
    (['--config.beam_sise=2'], '--config.beam_sise: no such key in'),
    (['--config.beam_sise=2'], 'config.json; did you mean --config.beam_size?'),
    (['--config.model.d_modle=2'], 'did you mean --config.model.d_model?'),
])
def test_an_override_contradicting_the_recorded_model_is_refused(cli, workdir, args, named):
  result = cli(f'--workdir={workdir}', '--mode=translate', '--input=-', *args)
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('t2t_jax: error: ') and named in last, last
