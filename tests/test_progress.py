"""Progress of the long steps: the pace and wording of its lines, the terminal bar, and the
lines a decode and an encode really log."""
import io
import re

import jax
import numpy as np
import pytest

from helpers import make_config, tiny_config
from t2t_jax.data import pipeline, sources, synthetic
from t2t_jax.decoding import batch_plan
from t2t_jax.model.transformer import ModelConfig, Transformer
from t2t_jax.platform import progress
from t2t_jax.platform.mesh import make_mesh, replicated


class Clock:
  """A clock the test moves by hand."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    return self.now


class Terminal(io.StringIO):
  def isatty(self) -> bool:
    return True


@pytest.fixture
def log(caplog):
  """The messages absl logs at INFO and above, as a function returning them so far."""
  with caplog.at_level('INFO'):
    yield lambda: list(caplog.messages)


def test_lines_come_at_a_pace_with_count_rate_and_eta(log):
  clock = Clock()
  with progress.Progress('Encoding the train split', 1000, 'pairs', clock=clock,
                         stream=io.StringIO()) as bar:
    for seconds in (1, 2, progress.FIRST_LINE_S - 1):
      clock.now = 1000 + seconds
      bar.update(50)
    assert log() == []  # nothing before FIRST_LINE_S
    clock.now = 1000 + progress.FIRST_LINE_S  # 10 s, 200 pairs: 20/s, 800 left: 40 s
    bar.update(50)
    assert log() == ['Encoding the train split: 200/1,000 pairs (20%), 20.0 pairs/s, ETA 0:40']
    clock.now += progress.EVERY_S - 1
    bar.update(100)
    assert len(log()) == 1  # at most one line every EVERY_S
    clock.now += 1  # 40 s, 300 pairs
    bar.update(0)
    assert log()[-1] == 'Encoding the train split: 300/1,000 pairs (30%), 7.50 pairs/s, ETA 1:33'
    bar.update(700)
    clock.now = 1000 + 3725
  assert log()[-1] == 'Encoding the train split: 1,000 pairs in 1:02:05 (0.27 pairs/s)'
  assert len(log()) == 3


def test_a_quick_step_logs_only_its_final_line(log):
  clock = Clock()
  with progress.Progress('Translating', 30, 'sentences', clock=clock,
                         stream=io.StringIO()) as bar:
    for i in range(30):
      clock.now = 1000 + 0.1 * (i + 1)
      bar.update(1)
  assert log() == ['Translating: 30 sentences in 0:03 (10.0 sentences/s)']


def test_unknown_totals_uneven_work_and_nothing_to_do(log):
  clock = Clock()
  with progress.Progress('Reading', None, 'sentences', clock=clock,
                         stream=io.StringIO()) as bar:
    clock.now += 20
    bar.update(5000)
  assert log() == ['Reading: 5,000 sentences, 250 sentences/s',
                   'Reading: 5,000 sentences in 0:20 (250 sentences/s)']
  # Half the sentences but a tenth of the work in 10 s: the ETA follows the work.
  bar = progress.Progress('Translating', 10, 'sentences', work=100, clock=clock,
                          stream=io.StringIO())
  clock.now += 10
  bar.update(5, work=10)
  assert log()[-1] == 'Translating: 5/10 sentences (50%), 0.50 sentences/s, ETA 1:30'
  with progress.Progress('Translating', 0, 'sentences', stream=io.StringIO()):
    pass
  assert len(log()) == 3  # 0 of 0: nothing to tell


def test_a_terminal_gets_a_live_bar_and_a_file_gets_none(log, monkeypatch):
  monkeypatch.setenv('COLUMNS', '200')
  clock, terminal, file = Clock(), Terminal(), io.StringIO()
  with progress.Progress('Encoding', 100, 'pairs', clock=clock, stream=terminal) as bar, \
       progress.Progress('Encoding', 100, 'pairs', clock=clock, stream=file) as other:
    for _ in range(100):
      clock.now += 0.01  # 100 updates in 1 s: the bar is redrawn every BAR_EVERY_S
      bar.update(1)
      other.update(1)
  shown = terminal.getvalue()
  assert file.getvalue() == ''
  frames = shown.split('\r')
  drawn = [frame.rstrip() for frame in frames if frame.strip()]
  assert 3 <= len(drawn) <= 1 / progress.BAR_EVERY_S + 1
  assert drawn[0].startswith('Encoding [........................] 1/100 pairs (1%)')
  assert re.fullmatch(r'Encoding \[#{19,20}\.{4,5}\] [78]\d/100 pairs \([78]\d%\), '
                      r'[\d.]+ pairs/s, ETA 0:00', drawn[-1])
  assert frames[-1] == '' and not frames[-2].strip()  # erased at the end
  assert len(log()) == 2  # the final line of each


def test_the_bar_fits_the_terminal_and_an_error_erases_it(log, monkeypatch):
  monkeypatch.setenv('COLUMNS', '40')
  terminal = Terminal()
  with pytest.raises(KeyError), progress.Progress('Encoding', 100, 'pairs',
                                                  stream=terminal) as bar:
    bar.update(3)
    raise KeyError('boom')
  frames = terminal.getvalue().split('\r')
  assert max(map(len, frames)) == 39 and not frames[-2].strip() and frames[-1] == ''
  assert log() == []  # the error speaks for itself


def test_a_disabled_progress_says_nothing(log):
  terminal = Terminal()
  with progress.Progress('Translating', 10, 'sentences', enabled=False, stream=terminal) as bar:
    assert list(bar.iterate(range(2500), block=1000)) == list(range(2500))
  assert bar.done == 2500 and terminal.getvalue() == '' and log() == []


@pytest.mark.parametrize('seconds,text', [(0, '0:00'), (59.6, '1:00'), (61, '1:01'),
                                          (3725, '1:02:05')])
def test_format_duration(seconds, text):
  assert progress.format_duration(seconds) == text


@pytest.fixture
def every_update(monkeypatch):
  """Progress lines on every update, as a long step would log them over minutes."""
  monkeypatch.setattr(progress, 'FIRST_LINE_S', 0.0)
  monkeypatch.setattr(progress, 'EVERY_S', 0.0)


def test_progress_lines_appear_during_a_long_eval(log, every_update):
  config = tiny_config()
  model_config = ModelConfig.from_config(config)
  mesh = make_mesh()
  dummy = np.ones((1, 1), np.int32)
  params = Transformer(model_config).init(jax.random.PRNGKey(0), dummy, dummy)['params']
  decoder = batch_plan.make_sharded_decoder(model_config, config, mesh)
  sentences = ['5 6 7'] * 100  # one length: one compilation, several batches
  batch_plan.translate(decoder, jax.device_put(params, replicated(mesh)), sentences,
                       synthetic.IdTokenizer(config.vocab_size), config, mesh,
                       max_input_length=20)
  during = [m for m in log() if re.fullmatch(
      r'Translating: [\d,]+/100 sentences \(\d+%\), [\d.,]+ sentences/s, ETA \d+:\d\d', m)]
  done = [int(m.split(': ')[1].split('/')[0]) for m in during]
  assert len(done) >= 3 and done == sorted(done) and done[0] < 100 and done[-1] == 100
  final = [m for m in log() if m.startswith('Translating: 100 sentences in')]
  assert len(final) == 1 and re.fullmatch(r'.* in \d+:\d\d \([\d.,]+ sentences/s\)', final[0])


def test_reading_and_encoding_a_files_corpus_log_progress(log, every_update, tmp_path,
                                                          monkeypatch):
  monkeypatch.setattr(sources, 'CHUNK_PAIRS', 100)  # 600 pairs in 6 chunks
  config = make_config(tmp_path, n_train=600)
  pipeline.get_datasets(config, str(tmp_path / 'workdir'), num_devices=1)
  reading = [m for m in log() if m.startswith('Reading the training text for the vocabulary: ')]
  assert len(reading) == 3  # blocks of 1024 sentences of both sides, then the final line
  assert re.fullmatch(r'.*: 1,024/1,200 sentences \(85%\), [\d.,]+ sentences/s, ETA \d+:\d\d',
                      reading[0])
  assert re.fullmatch(r'.*: 1,200 sentences in \d+:\d\d \([\d.,]+ sentences/s\)', reading[-1])
  encoding = [m for m in log() if m.startswith('Encoding the train split: ')]
  assert [m.split(': ')[1].split(' pairs')[0] for m in encoding] == [
      '100/600', '200/600', '300/600', '400/600', '500/600', '600/600', '600']
  assert re.search(r'\(50%\), [\d.,]+ pairs/s, ETA \d+:\d\d$', encoding[2])


def test_lines_go_to_the_stream_where_the_log_drops_them(caplog):
  """A Python session that uses the Translator without setting up logging drops INFO lines:
  there the progress lines are written to the stream, so a long step is never silent."""
  clock, stream = Clock(), io.StringIO()
  with caplog.at_level('WARNING', logger='absl'):
    with progress.Progress('Compiling', 2, 'shapes', clock=clock, stream=stream) as bar:
      clock.now += progress.FIRST_LINE_S
      bar.update(1)
      clock.now += 5
      bar.update(1)
  assert stream.getvalue().splitlines() == [
      'Compiling: 1/2 shapes (50%), 0.10 shapes/s, ETA 0:10',
      'Compiling: 2 shapes in 0:15 (0.13 shapes/s)']
  assert caplog.messages == []
