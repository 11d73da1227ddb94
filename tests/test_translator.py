"""The Python API (README's example), n-best lists scored like the model, streaming input.

The tiny trained run (`tiny_workdir`, conftest.py) is the one of test_evaluate.py: a
synthetic task whose text is its ids ('5 6 7').
"""
import io
import json
import logging
import os
import re
import subprocess
import threading
import time

import jax
import numpy as np
import pytest

from helpers import (
  COMMAND,
  REORDERED_F32,
  ROOT,
  TINY_CLI,
  CompileLog,
  assert_printed,
  cpu_env,
  run_process,
  tiny_config,
)
from t2t_jax import Hypothesis, Translator
from t2t_jax.data import batching
from t2t_jax.decoding import batch_plan
from t2t_jax.decoding.decode import length_penalty
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.modes import translate as translate_command
from t2t_jax.platform import ahead, errors

SENTENCES = ['5 6 7', '', '9 9 9 9 9 9 9 9', '3', '11 12']


@pytest.fixture(scope='module')
def loaded(tiny_workdir):
  return Translator(tiny_config(), tiny_workdir)


def test_from_workdir_reads_the_recorded_config(tiny_workdir, loaded):
  recorded = Translator.from_workdir(tiny_workdir)
  assert recorded.model_config == loaded.model_config
  assert recorded.translate(SENTENCES) == loaded.translate(SENTENCES) == loaded(SENTENCES)
  assert recorded.translate('5 6 7') == loaded(['5 6 7'])[0]
  changed = Translator.from_workdir(tiny_workdir, {'beam_size': 1, 'decode_params': 'checkpoint',
                                                   'restore_step': 3})
  assert (changed.config.beam_size, changed.source) == (1, 'checkpoints/3')
  with pytest.raises(errors.UserError, match=r'config\.model\.num_layers=2 contradicts'):
    Translator.from_workdir(tiny_workdir, {'model.num_layers': 2})


def teacher_forced_score(tr: Translator, source: str, text: str, alpha: float) -> float:
  """log P(Y|X) / lp(Y) of `text` (its EOS included), from one teacher-forced pass of the
  model and a float64 log-softmax: the beam search's score, recomputed independently."""
  src = np.array([tr.tokenizer.encode(source)], np.int32)
  target = np.array([tr.tokenizer.encode(text)], np.int32)
  model = Transformer(tr.model_config.replace(deterministic=True))
  logits = np.asarray(model.apply({'params': tr.params}, src, target), np.float64)[0]
  logits -= logits.max(axis=-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
  total = logp[np.arange(target.shape[1]), target[0]].sum()
  return float(total / ((5 + target.shape[1]) / 6) ** alpha)


# One length (one decoding batch shape, so one compilation per decoder), an empty line.
SAME_LENGTH = ['5 6 7', '', '9 8 7', '3 4 5', '11 12 13']


@pytest.mark.slow
@pytest.mark.parametrize('alpha', [0.6, 0.0])
def test_n_best_lists_are_sorted_distinct_and_scored_like_the_model(loaded, alpha):
  best = loaded.translate(SAME_LENGTH, alpha=alpha)
  lists = loaded.translate(SAME_LENGTH, alpha=alpha, n_best=4)
  assert len(lists) == len(SAME_LENGTH) and lists[1] == [Hypothesis('', 0.0)]
  for sentence, single, hypotheses in zip(SAME_LENGTH, best, lists, strict=True):
    if not sentence:
      continue
    assert 1 <= len(hypotheses) <= 4 and hypotheses[0].text == single
    scores = [h.score for h in hypotheses]
    assert scores == sorted(scores, reverse=True)
    assert len({h.text for h in hypotheses}) == len(hypotheses)
    for h in hypotheses:
      assert h.score == pytest.approx(teacher_forced_score(loaded, sentence, h.text, alpha),
                                      abs=2e-4)


def test_the_length_penalty_of_the_oracle_is_the_papers():
  # (5 + |Y|)^α / (5 + 1)^α (Wu et al., 2016, as §6.1 uses it), |Y| counting the EOS.
  assert float(length_penalty(np.int32(7), 0.6)) == pytest.approx((12 / 6) ** 0.6)


def test_beam_size_and_n_best_are_checked(loaded):
  assert loaded.translate(SENTENCES, beam_size=1) == [
      loaded.translate(s, beam_size=1) for s in SENTENCES]
  with pytest.raises(errors.UserError, match=r'n_best=5: must be between 1 and the beam size '
                                             r'\(4; config\.beam_size\)'):
    loaded.translate(SENTENCES, n_best=5)
  with pytest.raises(errors.UserError, match='n_best=0'):
    loaded.translate(SENTENCES, n_best=0)


def readme_example() -> str:
  text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
  section = text[text.index('## Python API'):]
  return re.search(r'```python\n(.*?)```', section, re.S).group(1)


def test_the_readme_example_runs(tiny_workdir, loaded, capsys):
  code = readme_example()
  # The demo's English sentences become the synthetic task's; the workdir is the tiny run.
  swaps = {"'runs/demo'": repr(tiny_workdir), "'A queen cries.'": "'5 6 7'",
           "'The happy young daughters think of the brother.'": "'11 12'"}
  for old, new in swaps.items():
    assert old in code, old
    code = code.replace(old, new)
  exec(compile(code, 'README.md', 'exec'), {})
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == repr(loaded.translate(['11 12', '5 6 7']))
  hypotheses = loaded.translate('5 6 7', beam_size=8, n_best=3)
  assert printed[1:] == [f'{h.score:8.4f}  {h.text}' for h in hypotheses]


class SlowPipe(io.RawIOBase):
  """A stream whose lines arrive at given times (seconds after the first read), like a pipe."""

  def __init__(self, chunks: list[tuple[float, bytes]]):
    self.chunks, self.start = list(chunks), None

  def readable(self) -> bool:
    return True

  def readline(self, size: int = -1) -> bytes:
    self.start = self.start or time.monotonic()
    if not self.chunks:
      return b''
    at, line = self.chunks.pop(0)
    time.sleep(max(self.start + at - time.monotonic(), 0))
    return line


def test_stream_batches_take_what_has_arrived():
  """A batch is its first line and those arriving within wait_s of it (at most max_lines);
  the end of the input is told before the last batch is given."""
  arrivals = [(0, b'a\n'), (0, b'b\n'), (0, b'c\n'), (1.5, b'd\r\n'), (1.5, b'e')]
  ended = []
  batches = translate_command.arriving_batches(SlowPipe(arrivals), '<stdin>', wait_s=0.5,
                                               on_end=lambda: ended.append(True))
  assert (next(batches), ended) == (['a', 'b', 'c'], [])
  assert (next(batches), ended) == (['d', 'e'], [True])
  assert list(batches) == []
  capped = translate_command.arriving_batches(SlowPipe(arrivals), '<stdin>', wait_s=0.5,
                                              max_lines=2)
  assert list(capped) == [['a', 'b'], ['c'], ['d', 'e']]


class Recorder:
  """A translator that echoes each batch, recording its size, max_rows and progress."""

  def __init__(self):
    self.calls = []

  def translate(self, batch, **kwargs):
    self.calls.append((len(batch), kwargs['max_rows'], kwargs['show_progress']))
    return batch


def test_a_pipe_is_decoded_as_a_file_and_typed_lines_one_by_one():
  """Lines arriving together (a pipe, a file on stdin) go in one batch, length-sorted by
  the plan of a file (max_rows 0); lines arriving apart each get a small batch of the shapes
  compiled ahead (max_rows = small_lines)."""
  lines = [f'line {i}' for i in range(20)]
  piped, out = Recorder(), io.BytesIO()
  piped_lines = io.BytesIO(''.join(f'{x}\n' for x in lines).encode())
  assert translate_command.stream(piped, piped_lines, out, small_lines=16) == 20
  assert piped.calls == [(20, 0, True)]  # a file's plan, its progress in the log
  assert out.getvalue().decode().split('\n')[:-1] == lines
  typed = Recorder()
  translate_command.stream(typed, SlowPipe([(0, b'one\n'), (1.0, b'two\n')]), io.BytesIO(),
                           small_lines=16, wait_s=0.1)
  assert typed.calls == [(1, 16, False), (1, 16, False)]


def test_a_bad_stream_line_ends_the_stream_after_the_lines_before_it():
  pipe = SlowPipe([(0, b'a\n'), (0, b'b \xff\n'), (0, b'c\n')])
  batches = translate_command.arriving_batches(pipe, '<stdin>', max_lines=8, wait_s=0.5)
  assert next(batches) == ['a']
  with pytest.raises(errors.UserError, match=r'<stdin>, line 2: invalid UTF-8'):
    next(batches)


def test_format_results_single_and_n_best():
  assert translate_command.format_results(['x y', '']) == 'x y\n\n'
  text = translate_command.format_results(
      [[Hypothesis('x y', -0.25, -0.3, 1.2), Hypothesis('x', -1.5, -1.65, 1.1)],
       [Hypothesis('', 0.0)]], first_index=7)
  # Moses' four fields, as Marian writes them: a reranker reads them unchanged.
  assert text == ('7 ||| x y ||| logP= -0.300000 lp= 1.200000 ||| -0.250000\n'
                  '7 ||| x ||| logP= -1.650000 lp= 1.100000 ||| -1.500000\n'
                  '8 |||  ||| logP= 0.000000 lp= 1.000000 ||| 0.000000\n')


@pytest.mark.e2e
def test_streaming_translation_answers_before_the_input_ends(tiny_workdir, loaded):
  """A process reading a pipe (Marian's and fairseq-interactive's use) answers each line as
  it comes, while its input is still open."""
  process = subprocess.Popen([*COMMAND, *TINY_CLI, f'--workdir={tiny_workdir}',
                              '--mode=translate', '--input=-'], cwd=ROOT, env=cpu_env(2),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
  answers = []
  reader = threading.Thread(target=lambda: answers.append(process.stdout.readline()))
  try:
    process.stdin.write(b'5 6 7\n')
    process.stdin.flush()
    reader.start()
    reader.join(timeout=300)  # loading and compiling take a while; the input stays open
    assert answers, 'no answer to the first line while the input is open'
    assert process.poll() is None  # still waiting for more input
    process.stdin.write(b'\n11 12\n')
    rest, stderr = process.communicate(timeout=300)  # closes stdin: the input ends
  finally:
    process.kill()
  assert process.returncode == 0, stderr.decode()[-3000:]
  assert (answers[0] + rest).decode().split('\n') == [*loaded.translate(['5 6 7', '', '11 12']),
                                                      '']
  # The stream's small batch shapes are queued for compiling from the start, where the
  # host has cores to spare.
  expected = (r'Compiling the beam search for \d+ shapes ahead' if ahead.default_threads()
              else r'Compiling as shapes are met \(fewer than 4 cores')
  assert re.search(expected, stderr.decode())


def test_n_best_on_the_command_line(cli, tiny_workdir, loaded, tmp_path):
  (tmp_path / 'in.txt').write_text('5 6 7\n\n11 12\n')
  args = [*TINY_CLI, f'--workdir={tiny_workdir}', '--mode=translate',
          f'--input={tmp_path / "in.txt"}']
  done = cli(*args, f'--output={tmp_path / "out.txt"}', '--n_best=3')
  assert done.returncode == 0, done.stderr[-3000:]
  expected = loaded.translate(['5 6 7', '', '11 12'], n_best=3)
  lines = (tmp_path / 'out.txt').read_text().splitlines()
  assert len(lines) == len(expected[0]) + 1 + len(expected[2])
  parsed = [line.split(' ||| ') for line in lines]
  assert [(int(i), text) for i, text, _, _ in parsed] == [
      (i, h.text) for i, hs in enumerate(expected) for h in hs]
  # Printed with 6 decimals, decoded in batches of other rows than the Python API's.
  assert_printed([s for *_, s in parsed], [h.score for hs in expected for h in hs], 6,
                 rtol=REORDERED_F32)
  # The features: log P(Y|X) as forced scoring computes it, and lp(Y) = ((5 + |Y|) / 6)^0.6
  # of the output's length with EOS (§6.1), score = logP / lp.
  features = [re.fullmatch(r'logP= (\S+) lp= (\S+)', f).groups() for _, _, f, _ in parsed]
  hypotheses = [(i, h) for i, hs in enumerate(expected) for h in hs]
  forced = loaded.score([['5 6 7', '', '11 12'][i] for i, _ in hypotheses],
                        [h.text for _, h in hypotheses])
  assert_printed([lp for _, lp in features],
                 [((5 + len(f.tokens)) / 6) ** 0.6 if f.tokens else 1.0 for f in forced], 6,
                 rtol=REORDERED_F32)
  assert_printed([logp for logp, _ in features], [f.logprob for f in forced], 6,
                 rtol=REORDERED_F32)
  too_many = cli(*args, '--n_best=5')
  assert too_many.returncode != 0
  assert too_many.stderr.strip().splitlines()[-1] == (
      't2t_jax: error: --n_best=5: must be between 1 and the beam size (4; config.beam_size)')



def test_the_input_limit_keeps_learned_positions_in_range():
  """Input (EOS included) + decode_extra_length outputs must fit a learned table of max_len:
  eval, translate and dev BLEU during training truncate inputs to this one limit."""
  config = tiny_config()
  config.max_decode_input_length, config.decode_extra_length = 30, 5
  model_config = ModelConfig.from_config(config)
  assert batch_plan.max_input_length(model_config, config) == 30  # sinusoids: any length
  learned = model_config.replace(positional='learned', max_len=20)
  assert batch_plan.max_input_length(learned, config) == 15
  assert batch_plan.max_input_length(learned.replace(max_len=64), config) == 30


def test_a_failed_stream_never_replaces_an_earlier_output_file(tmp_path):
  path = tmp_path / 'out.txt'
  path.write_text('an earlier result\n')
  with pytest.raises(errors.UserError), translate_command.stream_output(str(path)) as out:
    out.write(b'first translation\n')
    raise errors.UserError('<stdin>, line 2: invalid UTF-8')
  assert path.read_text() == 'an earlier result\n'
  assert (tmp_path / 'out.txt.partial').read_text() == 'first translation\n'
  # The next stream keeps what the failed one translated (it was emptied without a word).
  with translate_command.stream_output(str(path)) as out:
    out.write(b'complete\n')
  assert path.read_text() == 'complete\n' and not (tmp_path / 'out.txt.partial').exists()
  [kept] = [p for p in os.listdir(tmp_path) if p.startswith('out.txt.partial.')]
  assert (tmp_path / kept).read_text() == 'first translation\n'



def test_loading_a_run_warns_of_nothing(tiny_workdir, caplog):
  """orbax warned at every load that a checkpoint item has no metadata file of its own
  (the step directory has it): noise in every Python API session."""
  caplog.set_level(logging.WARNING)
  Translator.from_workdir(tiny_workdir, {'decode_params': 'checkpoint'})
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# Sampling (config.decode_method='sample') and ensembles (config.ensemble).

LINES = ['5 6 7', '', '9 9 9 9 9 9 9 9', '3', '11 12', '8 8 8 8 8 8 8 8 8 8', '4 4']
SAMPLED = dict(method='sample', seed=3, temperature=1.5)


@pytest.mark.slow
def test_samples_are_keyed_by_line_not_by_batch(loaded):
  """A line's sample is the same in batches of other sizes and alone (with its line
  number); another seed gives others; top_k=1 is greedy decoding, which is beam search
  with one beam; n samples are scored log P(Y|X) by the model, without lp."""
  sampled = loaded.translate(LINES, **SAMPLED)
  assert sampled[1] == '' and loaded.translate(LINES, max_rows=2, **SAMPLED) == sampled
  assert loaded.translate(LINES[5], first_line=6, **SAMPLED) == sampled[5]
  assert loaded.translate(LINES, method='sample', seed=4, temperature=1.5) != sampled
  greedy = loaded.translate(LINES, method='greedy')
  assert loaded.translate(LINES, method='sample', top_k=1) == greedy
  assert loaded.translate(LINES, beam_size=1) == greedy
  lists = loaded.translate(LINES[:1], n_best=3, **SAMPLED)[0]
  assert len(lists) == 3 and [h.score for h in lists] == sorted((h.score for h in lists),
                                                                reverse=True)
  for h in lists:
    assert h.score == pytest.approx(teacher_forced_score(loaded, LINES[0], h.text, 0.0),
                                    abs=2e-4)


@pytest.mark.parametrize('kwargs,message', [
    (dict(method='beam', n_best=5), r'n_best=5: must be between 1 and the beam size \(4'),
    (dict(method='greedy', n_best=2), r'n_best=2: must be 1: greedy decoding keeps one '
                                      'hypothesis'),
    (dict(method='greedy', beam_size=4), 'beam_size=4: greedy decoding is beam search with '
                                         'one beam'),
    (dict(method='top_p'), r"method='top_p': must be one of \('beam', 'greedy', 'sample'\)"),
    (dict(method='sample', temperature=0.0), r'temperature=0.0: must be a finite number > 0 \(as '
                                             r'config\.sample_temperature\)'),
    (dict(method='sample', top_k=41), r'top_k=41: must be ≤ config\.vocab_size \(40\)'),
    (dict(method='sample', seed=-1), r'seed=-1: must be an integer in \[0, 2\*\*32\)'),
    (dict(method='sample', temperature=float('inf')), r'temperature=inf: must be a finite'),
    (dict(method='sample', n_best=batch_plan.MAX_SAMPLES + 1),
     rf'n_best={batch_plan.MAX_SAMPLES + 1}: must be between 1 and {batch_plan.MAX_SAMPLES} '
     'samples a sentence'),
    (dict(beam_size=-2), r'beam_size=-2: must be a positive integer'),
    (dict(alpha=-1), r'alpha=-1: must be a finite number ≥ 0 \(as config\.beam_alpha\)'),
    (dict(temperature=0.7), r"temperature=0.7: only sampling \(method='sample'\) has it; "
                            r"method='beam' would ignore it"),
    (dict(method='greedy', top_k=5), r"top_k=5: only sampling .*method='greedy' would ignore"),
    (dict(top_p=0.9), r"top_p=0.9: only sampling .*method='beam' would ignore"),
    (dict(method='sample', top_p=1.5), r'top_p=1.5: must be a number in \(0, 1\]'),
    (dict(max_rows=-1), r'max_rows=-1: must be an integer ≥ 0'),
    (dict(sentences=None), r'sentences: a str or a list of str, got NoneType'),
    (dict(sentences=5), r'sentences: a str or a list of str, got int'),
    (dict(sentences=b'5 6'), r'sentences: a str or a list of str, got bytes'),
    (dict(sentences=['5 6', None]), r'sentences\[1\]: a str, got NoneType'),
])
def test_decoding_arguments_are_checked(loaded, kwargs, message):
  """A wrong argument of the Python API is an errors.UserError naming it (a TypeError, a
  silently ignored setting or an unbounded allocation once), raised before any decoding."""
  kwargs = dict(kwargs)
  with pytest.raises(errors.UserError, match=message):
    loaded.translate(kwargs.pop('sentences', LINES), **kwargs)


def test_compile_ahead_checks_its_arguments_before_compiling(loaded, monkeypatch):
  """compile_ahead(method='bogus') compiled for minutes before failing."""
  monkeypatch.setattr(batch_plan, 'interactive_shapes', None)  # nothing may be compiled
  with pytest.raises(errors.UserError, match=r"method='bogus': must be one of"):
    loaded.compile_ahead(method='bogus')
  with pytest.raises(errors.UserError, match=r'max_rows=0: must be a positive integer'):
    loaded.compile_ahead(max_rows=0)


def test_from_workdir_takes_nested_overrides(tiny_workdir):
  nested = Translator.from_workdir(tiny_workdir, {'model': {'dtype': 'bfloat16'},
                                                  'beam_size': 2})
  assert (nested.model_config.dtype, nested.config.beam_size) == ('bfloat16', 2)
  with pytest.raises(errors.UserError, match=r'overrides: a dict of config keys, got list'):
    Translator.from_workdir(tiny_workdir, [('beam_size', 2)])


def test_a_stream_samples_as_the_whole_input_does(tiny_workdir):
  """A stream's batches number their lines from the stream's start: each line gets the
  sample of its line number, as in a file."""
  sampler = Translator.from_workdir(tiny_workdir, {'decode_method': 'sample', 'sample_seed': 3,
                                                   'sample_temperature': 1.5})
  text = ''.join(line + '\n' for line in LINES).encode()
  out = io.BytesIO()
  translate_command.stream(sampler, io.BytesIO(text), out, max_lines=2, wait_s=5)
  assert out.getvalue().decode().split('\n')[:-1] == sampler.translate(LINES)


def _changed_run(tmp_path, workdir, **changes):
  """A folder whose config.json is the run's with `changes` (enough to be refused)."""
  recorded = json.load(open(os.path.join(workdir, 'config.json')))
  recorded.update(changes)
  folder = tmp_path / '_'.join(changes)
  folder.mkdir()
  (folder / 'config.json').write_text(json.dumps(recorded))
  return str(folder)


def test_an_ensemble_refuses_other_vocabularies_languages_and_specs(tiny_workdir, tmp_path):
  config = tiny_config()
  cases = [(_changed_run(tmp_path, tiny_workdir, target_lang='fr'), 'translates en→fr, '),
           (str(tmp_path / 'nothing'), 'no recorded run there'),
           (f'{tiny_workdir}:x', r"expected DIR or DIR:STEP"),
           (f'{tiny_workdir}:5', 'has no averaged or checkpoint at step 5')]
  for spec, message in cases:
    config.ensemble = spec
    with pytest.raises(errors.UserError, match=message):
      Translator(config, tiny_workdir)


SAMPLE_CLI = ['--config.decode_method=sample', '--config.sample_seed=3',
              '--config.sample_temperature=1.5']  # SAMPLED on the command line


@pytest.mark.slow
def test_sampling_and_an_ensemble_on_the_command_line(cli, tiny_workdir, loaded, tmp_path):
  """Samples with one seed are the Python API's, and the same again; an ensemble of the
  run with itself is the run, n-best and scores included; one of another vocabulary is an
  error of one line naming it."""
  (tmp_path / 'in.txt').write_text(''.join(line + '\n' for line in LINES))
  args = [*TINY_CLI, f'--workdir={tiny_workdir}', '--mode=translate',
          f'--input={tmp_path / "in.txt"}']
  outputs = []
  for name, extra in (('a', SAMPLE_CLI), ('b', SAMPLE_CLI),
                      ('self', [f'--config.ensemble={tiny_workdir}', '--n_best=3'])):
    done = cli(*args, *extra, f'--output={tmp_path / name}')
    assert done.returncode == 0, done.stderr[-3000:]
    outputs.append((tmp_path / name).read_text())
  assert outputs[0] == outputs[1] == ''.join(t + '\n' for t in loaded.translate(LINES,
                                                                                **SAMPLED))
  # Two printed scores, each rounded to 6 decimals from a search in its own batches.
  alone = [line.split(' ||| ') for line in translate_command.format_results(
      loaded.translate(LINES, n_best=3)).splitlines()]
  ensemble = [line.split(' ||| ') for line in outputs[2].splitlines()]
  assert [line[:2] for line in ensemble] == [line[:2] for line in alone]
  assert_printed([line[3] for line in ensemble], [float(line[3]) for line in alone], 6,
                 rtol=REORDERED_F32)
  other = _changed_run(tmp_path, tiny_workdir, vocab_size=41)
  refused = cli(*args, f'--config.ensemble={other}')
  assert refused.returncode != 0
  stderr = refused.stderr
  assert 'Traceback' not in stderr and stderr.strip().splitlines()[-1] == (  # after logs
      f't2t_jax: error: config.ensemble: {other} has another vocabulary than {tiny_workdir} '
      '(fingerprint ids-41, not ids-40); the runs of an ensemble share one vocabulary')


@pytest.mark.e2e
def test_samples_are_the_same_in_a_process_of_two_devices(tiny_workdir, loaded, tmp_path):
  """A line's sample depends on the seed and its line number, not on the device count: a
  process of 2 CPU devices samples what this one of 8 does."""
  (tmp_path / 'in.txt').write_text(''.join(line + '\n' for line in LINES))
  done = run_process(*TINY_CLI, f'--workdir={tiny_workdir}', '--mode=translate',
                     f'--input={tmp_path / "in.txt"}', *SAMPLE_CLI, devices=2)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'on 2 devices' in done.stderr
  assert done.stdout == ''.join(t + '\n' for t in loaded.translate(LINES, **SAMPLED))


def test_small_calls_meet_only_the_interactive_shapes():
  """With max_rows and max_length, any call of at most max_rows sentences decodes in
  batches of the shapes interactive_shapes lists (what compile_ahead compiles), one
  sentence in one row a device."""
  rng = np.random.default_rng(0)
  config = tiny_config()
  for num_devices in (1, 2, 8):
    for max_rows in (1, 4, 16):
      small = dict(tokens_per_batch=config.decode_tokens_per_batch, num_devices=num_devices,
                   bucket_growth=config.decode_bucket_growth, max_rows=max_rows, max_length=40)
      listed = batch_plan.interactive_shapes(config, num_devices, max_rows=max_rows,
                                             max_length=40)
      assert len(listed) == len(set(listed))
      for _ in range(100):
        lengths = rng.integers(1, 41, size=rng.integers(1, max_rows + 1))
        met = {(rows, s) for _, rows, s in batch_plan.decoding_batches(lengths, **small)}
        assert met <= set(listed), (num_devices, max_rows, sorted(lengths))
      [(_, rows, _)] = batch_plan.decoding_batches([7], **small)
      assert rows == num_devices


def test_small_calls_decode_the_longest_together():
  """With max_rows, a call's sentences go into as few searches as the rows allow: the
  longest left first, together at their longest's bucket; each sentence once."""
  rng = np.random.default_rng(1)
  config = tiny_config()
  grid = batching.bucket_lengths(40, config.decode_bucket_growth)
  for num_devices in (1, 2, 8):
    for max_rows in (1, 4, 16):
      small = dict(tokens_per_batch=config.decode_tokens_per_batch, num_devices=num_devices,
                   bucket_growth=config.decode_bucket_growth, max_rows=max_rows, max_length=40)
      for _ in range(100):
        lengths = rng.integers(1, 41, size=rng.integers(1, 3 * max_rows + 1))
        batches = list(batch_plan.decoding_batches(lengths, **small))
        decoded = np.concatenate([indices for indices, _, _ in batches])
        assert sorted(decoded) == list(range(len(lengths)))
        longest_before = np.inf
        for indices, rows, length in batches:
          assert 0 < len(indices) <= rows and rows % num_devices == 0
          assert length == grid[np.searchsorted(grid, lengths[indices].max())]
          assert lengths[indices].max() <= longest_before
          longest_before = lengths[indices].min()
          if len(indices) < rows:  # room left only in the last: nothing was left for it
            assert indices is batches[-1][0]
        first_rows = batches[0][1]
        if len(lengths) <= first_rows:
          assert len(batches) == 1


@pytest.mark.slow
def test_after_compile_ahead_small_calls_compile_nothing(tiny_workdir):
  """Translator.compile_ahead compiles every interactive shape: single lines, a few lines
  and a stream's batches then compile nothing, for beam search and for sampling, and
  translate as a translator compiling when it meets a shape does."""
  config = tiny_config()
  config.max_decode_input_length = 12  # buckets up to 12 sub-words: few shapes to compile
  lines = ['5 6 7', '9 9 9 9 9 9 9 9', '3', '11 12', '8 8 8 8 8 8 8 8 8 8 8 8 8 8']
  reference = Translator(config, tiny_workdir)
  many = [f'{i} {i + 1} {i + 2}' for i in range(3, 19)]  # one bucket, over a row a device
  calls = [*([line] for line in lines), lines, lines[:2], many]
  expected = [reference.translate(call) for call in calls]
  expected_samples = [reference.translate(call, **SAMPLED) for call in calls]
  with Translator(config, tiny_workdir) as ready:
    search = ready.compile_ahead(threads=2)
    sampler = ready.compile_ahead(threads=2, method='sample')
    handler = CompileLog()
    logging.getLogger('jax').addHandler(handler)
    jax.config.update('jax_log_compiles', True)
    try:
      got = [ready.translate(call) for call in calls]
      got_samples = [ready.translate(call, **SAMPLED) for call in calls]
      out = io.BytesIO()
      translate_command.stream(ready, io.BytesIO('\n'.join(lines).encode()), out, max_lines=2,
                               wait_s=5)
    finally:
      jax.config.update('jax_log_compiles', False)
      logging.getLogger('jax').removeHandler(handler)
  assert [name for _, name in handler.records if 'search' in name or 'draw' in name] == []
  assert search.compiled_on_call == sampler.compiled_on_call == 0
  assert search.waits == sampler.waits == 0
  assert got == expected and got_samples == expected_samples
  assert out.getvalue().decode().splitlines() == reference.translate(lines)


def test_a_large_call_samples_alike_with_its_shapes_compiled_ahead(tiny_workdir, loaded,
                                                                   monkeypatch):
  """With background threads (ahead.default_threads: 4 cores or more), a call of many
  sentences compiles its batches' shapes on them (test_evaluate: beam search), here with
  sampling's settings, and samples as a call that compiles each shape when met."""
  from t2t_jax.platform import ahead
  # Two length buckets, over INTERACTIVE_ROWS sentences: two shapes of translate_ids' own.
  sentences = ['5 6', '7 8 9 10 11 12 13 14 15'] * (batch_plan.INTERACTIVE_ROWS // 2 + 1)
  inputs = batch_plan.encode_inputs(sentences, loaded.tokenizer, loaded.max_input_length)[1]
  assert len(set(batch_plan.batch_shapes(inputs, loaded.config, loaded.mesh.size))) == 2
  expected = loaded.translate(sentences, **SAMPLED)
  monkeypatch.setattr(ahead, 'default_threads', lambda: 2)
  handler = CompileLog()
  logging.getLogger('jax').addHandler(handler)
  jax.config.update('jax_log_compiles', True)
  try:
    got = Translator(loaded.config, tiny_workdir).translate(sentences, **SAMPLED)
  finally:
    jax.config.update('jax_log_compiles', False)
    logging.getLogger('jax').removeHandler(handler)
  draws = [thread for thread, name in handler.records if 'draw' in name]
  # The first shape may be compiled by the call itself, which needs it at once.
  assert len(draws) == 2 and any(t.startswith('compile_ahead') for t in draws), draws
  assert got == expected


# Forced scoring (scoring.py): Translator.score and --mode=score.


@pytest.mark.slow
def test_a_searched_output_scores_what_the_search_said(loaded):
  """Scoring the beam search's own n-best hypotheses gives their search scores; each is
  log P(Y|X) / lp(Y), recomputed independently (teacher_forced_score, float64)."""
  lists = loaded.translate(SAME_LENGTH, n_best=3)
  pairs = [(s, h) for s, hs in zip(SAME_LENGTH, lists, strict=True) if s for h in hs]
  scored = loaded.score([s for s, _ in pairs], [h.text for _, h in pairs])
  for (source, hypothesis), s in zip(pairs, scored, strict=True):
    # Teacher-forced against the search's cached steps: another order of float32 sums.
    assert s.score == pytest.approx(hypothesis.score, rel=REORDERED_F32, abs=1e-5)
    assert s.score == pytest.approx(teacher_forced_score(loaded, source, hypothesis.text, 0.6),
                                    abs=2e-4)
    assert s.logprob == pytest.approx(sum(s.tokens), abs=1e-9)
    assert len(s.tokens) == len(hypothesis.text.split()) + 1  # and the EOS
  alpha_0 = loaded.score([pairs[0][0]], [pairs[0][1].text], alpha=0.0)[0]
  assert alpha_0.score == pytest.approx(alpha_0.logprob)


def test_an_ensemble_of_the_run_with_itself_scores_as_the_run(tiny_workdir, loaded):
  itself = Translator.from_workdir(tiny_workdir, {'ensemble': tiny_workdir})
  pairs = (['5 6 7', '11 12', ''], ['8 9', '3', '4 4'])
  assert [s.score for s in itself.score(*pairs)] == pytest.approx(
      [s.score for s in loaded.score(*pairs)], rel=REORDERED_F32)
  with pytest.raises(errors.UserError, match='sources and targets: 3 and 2 sentences'):
    loaded.score(pairs[0], pairs[1][:2])


@pytest.mark.slow
def test_ensemble_weights_weigh_each_models_log_probabilities(tiny_workdir, loaded):
  """config.ensemble_weights: each target token's log-probability is the weighted mean of
  the models' (each model scored alone), and beam search over the run with itself under
  any weights is the run's search."""
  weighted = Translator.from_workdir(tiny_workdir, {'ensemble': f'{tiny_workdir}:3',
                                                    'ensemble_weights': '3,1'})
  at_3 = Translator.from_workdir(tiny_workdir, {'decode_params': 'checkpoint',
                                                'restore_step': 3})
  pairs = (['5 6 7', '11 12'], ['8 9', '3 4 4'])
  for ours, a, b in zip(weighted.score(*pairs), loaded.score(*pairs), at_3.score(*pairs),
                        strict=True):
    assert ours.tokens == pytest.approx([0.75 * x + 0.25 * y
                                         for x, y in zip(a.tokens, b.tokens, strict=True)],
                                        rel=REORDERED_F32)
  itself = Translator.from_workdir(tiny_workdir, {'ensemble': tiny_workdir,
                                                  'ensemble_weights': '2,1'})
  assert itself.translate(LINES) == loaded.translate(LINES)
  with pytest.raises(errors.UserError, match=r"config.ensemble_weights='1': 1 weight\(s\) for "
                                             r'2 model\(s\)'):
    Translator.from_workdir(tiny_workdir, {'ensemble': tiny_workdir, 'ensemble_weights': '1'})


def test_score_mode_writes_a_score_a_line(cli, tiny_workdir, loaded, tmp_path):
  (tmp_path / 'src').write_text('5 6 7\n11 12\n\n')
  (tmp_path / 'ref').write_text('8 9 10\n3\n4\n')
  args = [*TINY_CLI, f'--workdir={tiny_workdir}', '--mode=score',
          f'--input={tmp_path / "src"}', f'--reference={tmp_path / "ref"}']
  done = cli(*args)
  assert done.returncode == 0, done.stderr[-3000:]
  expected = loaded.score(['5 6 7', '11 12', ''], ['8 9 10', '3', '4'])
  assert_printed(done.stdout.splitlines(), [s.score for s in expected], 6, rtol=REORDERED_F32)
  detailed = cli(*args, '--per_token', f'--output={tmp_path / "out"}')
  assert detailed.returncode == 0, detailed.stderr[-3000:]
  assert detailed.stdout == f'scored 3 pairs of {tmp_path / "src"} into {tmp_path / "out"}\n'
  fields = [line.split(' ||| ') for line in (tmp_path / 'out').read_text().splitlines()]
  assert [len(f[2].split()) for f in fields] == [4, 2, 2]  # tokens and EOS
  assert_printed([f[1] for f in fields], [s.logprob for s in expected], 6, rtol=REORDERED_F32)
  (tmp_path / 'short').write_text('8 9\n')
  short = cli(*args[:-1], f'--reference={tmp_path / "short"}')
  assert short.stderr.strip().splitlines()[-1] == (
      f't2t_jax: error: --input={tmp_path / "src"} has 3 lines, --reference='
      f'{tmp_path / "short"} 1: give a reference line for each input line')
  none = cli(*args[:-1])
  assert none.stderr.strip().splitlines()[-1].startswith(
      't2t_jax: error: --mode=score needs --input=FILE (the sources) and --reference=FILE')


def test_an_empty_pair_scores_as_translate_gives_it(loaded):
  """An empty source with an empty target scored the model's -6.25; translate gives an empty
  line 0.0, undecoded."""
  [translated] = loaded.translate([' '], n_best=1)
  empty, spaces, other = loaded.score(['', ' ', ''], ['', '  ', '8 9'])
  assert translated[0].score == empty.score == spaces.score == 0.0
  assert empty.tokens == spaces.tokens == [] and empty.logprob == 0.0
  assert other.score < 0 and len(other.tokens) == 3  # an empty source, a real target: scored


class Planned(Exception):
  """Stops compile_ahead where it would start compiling, with the shapes it planned."""


def test_compile_ahead_prepares_only_lengths_the_model_can_meet(tiny_workdir, monkeypatch):
  """Inputs up to the longest pair training kept plus the search's margin (max_length +
  decode_extra_length): the buckets up to the one holding it, not every bucket up to
  max_decode_input_length; a longer max_length= goes further."""
  tr = Translator.from_workdir(tiny_workdir, {'max_decode_input_length': 1024})
  assert tr.ahead_length == tr.config.max_length + tr.config.decode_extra_length == 17

  def planned(*args, **kwargs):
    raise Planned(args[2])
  monkeypatch.setattr(ahead, 'searches', planned)
  for max_length, longest in ((None, 32), (40, 64), (5000, 1024)):
    with pytest.raises(Planned) as shapes:
      tr.compile_ahead(max_length=max_length)
    assert max(s for _, s in shapes.value.args[0]) == longest
  with pytest.raises(errors.UserError, match=r'max_length=0: must be a positive integer'):
    tr.compile_ahead(max_length=0)


@pytest.mark.parametrize('compile_ahead', [True, False])
def test_a_stream_compiles_ahead_what_it_can_meet_and_stops_at_the_end(
    cli, tiny_workdir, loaded, monkeypatch, compile_ahead):
  """With cores to spare, a stream queues its small batch shapes up to ahead_length from
  the start, and drops what is still queued when the input ends; compile_ahead=False (or a
  host of fewer than 4 cores) compiles shapes as they are met. The output is the same."""
  monkeypatch.setattr(ahead, 'default_threads', lambda: 1)
  shutdowns = []
  real_pool = ahead.make_pool

  def pool(threads):
    made = real_pool(threads)
    shutdown = made.shutdown
    made.shutdown = lambda **kw: (shutdowns.append(kw), shutdown(**kw))
    return made
  monkeypatch.setattr(ahead, 'make_pool', pool)
  done = cli(*TINY_CLI, f'--workdir={tiny_workdir}', '--mode=translate', '--input=-',
             f'--config.compile_ahead={compile_ahead}', input='5 6 7\n\n11 12\n')
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split('\n')[:-1] == loaded.translate(['5 6 7', '', '11 12'])
  shapes = batch_plan.interactive_shapes(loaded.config, loaded.mesh.size, max_rows=16,
                                         max_length=loaded.max_input_length,
                                         up_to=loaded.ahead_length)
  if compile_ahead:
    assert f'Compiling the beam search for {len(shapes)} shapes ahead' in done.stderr
    assert {'wait': False, 'cancel_futures': True} in shutdowns
  else:
    assert 'Compiling as shapes are met (config.compile_ahead=False)' in done.stderr
    assert shutdowns == []


def test_the_translator_keeps_its_compilations_in_the_configs_cache(tiny_workdir, tmp_path):
  """The Python API compiles into config.compilation_cache_dir as the command line does, so
  that the next process loads what this one compiled."""
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  cache = tmp_path / 'cache'
  try:
    tr = Translator.from_workdir(tiny_workdir, {'compilation_cache_dir': str(cache)})
    assert jax.config.jax_compilation_cache_dir == str(cache)
    tr.translate(['5 6 7'])
  finally:
    jax.config.update('jax_persistent_cache_min_compile_time_secs',
                      float(os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))
  assert any(entry.name.startswith('jit_search') for entry in cache.iterdir()), \
      sorted(entry.name for entry in cache.iterdir())
