"""--mode=serve: the API against the Python API's own translations, dynamic batching, the
limits, a client that goes away, and the page in a real browser (Debian's chromium under
selenium). The command line's server, and SIGTERM in the middle of requests:
tests/test_readme.py (the README's "Put it to work")."""
import base64
import concurrent.futures
import json
import os
import shutil
import socket
import threading
import time
import types
import urllib.error
import urllib.request

import numpy as np
import pytest

from helpers import tiny_config
from t2t_jax.apps import server
from t2t_jax.apps.translator import Translator

uvicorn = pytest.importorskip('uvicorn', reason="the extra 'serve' (pip install -e '.[serve]')")
# Seconds each: a served run compiles its search's shapes before it answers.
pytestmark = pytest.mark.slow

SENTENCES = ['5 6 7', '9 9 9 9 9 9 9 9', '3', '11 12', '4 4 8']


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class Running:
  """The app of a Translator served by uvicorn in a thread of this process."""

  def __init__(self, translator, **kwargs):
    self.port = free_port()
    self.app = server.create_app(translator, **kwargs)
    self.server = uvicorn.Server(uvicorn.Config(self.app, host='127.0.0.1', port=self.port,
                                                log_level='warning'))
    self.thread = threading.Thread(target=self.server.run, daemon=True)
    self.thread.start()
    deadline = time.monotonic() + 300
    while not self.server.started:  # after the lifespan's compilations
      assert self.thread.is_alive() and time.monotonic() < deadline
      time.sleep(0.05)

  def url(self, path: str) -> str:
    return f'http://127.0.0.1:{self.port}{path}'

  def post(self, path: str, body, *, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(self.url(path), data=data,
                                     headers={'Content-Type': 'application/json'})
    try:
      with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
      return e.code, json.loads(e.read())

  def get(self, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(self.url(path), timeout=60) as response:
      return response.status, response.read()

  def stop(self) -> None:
    self.server.should_exit = True
    self.thread.join(timeout=60)


@pytest.fixture(scope='module')
def translator(tiny_workdir):
  return Translator(tiny_config(), tiny_workdir)


@pytest.fixture(scope='module')
def served(translator):
  running = Running(translator, limits=server.Limits(lines=8, line_chars=40, beam_size=6,
                                                     body_bytes=4096))
  yield running
  running.stop()


def test_translations_and_scores_are_the_python_apis(served, translator):
  status, answer = served.post('/translate', {'text': SENTENCES})
  assert status == 200
  expected = translator.translate(SENTENCES, n_best=1)
  assert [t['text'] for t in answer['translations']] == [h[0].text for h in expected]
  assert [t['score'] for t in answer['translations']] == [h[0].score for h in expected]
  assert 'n_best' not in answer['translations'][0]
  assert answer['params'] == {'model': translator.describe(), 'method': 'beam', 'n_best': 1,
                              'beam_size': 4, 'alpha': 0.6}


def test_per_request_settings_n_best_and_sampling(served, translator):
  status, answer = served.post('/translate', {'text': SENTENCES[:2], 'beam_size': 5,
                                              'n_best': 3, 'alpha': 1.0})
  assert status == 200 and answer['params']['beam_size'] == 5
  expected = translator.translate(SENTENCES[:2], beam_size=5, n_best=3, alpha=1.0)
  assert [[h['text'] for h in t['n_best']] for t in answer['translations']] == [
      [h.text for h in hs] for hs in expected]
  assert answer['translations'][0]['n_best'][0] == expected[0][0]._asdict()
  sample = {'text': SENTENCES[:2], 'method': 'sample', 'seed': 3, 'temperature': 0.7}
  first, second = served.post('/translate', sample), served.post('/translate', sample)
  assert first == second  # a seed gives the same samples, whatever they were batched with
  assert [t['text'] for t in first[1]['translations']] == translator.translate(
      SENTENCES[:2], method='sample', seed=3, temperature=0.7)


def test_requests_that_arrive_together_are_decoded_together(served, translator):
  lines = [f'{i % 13 + 1} {i % 7 + 2} 5' for i in range(24)]
  expected = translator.translate(lines)
  before = served.server.config.app  # the same app throughout
  with concurrent.futures.ThreadPoolExecutor(24) as pool:
    answers = list(pool.map(lambda line: served.post('/translate', {'text': [line]}), lines))
  assert served.server.config.app is before
  assert [a[1]['translations'][0]['text'] for a in answers] == expected
  _, health = served.get('/health')
  health = json.loads(health)
  assert health['requests'] > health['batches']  # some batches held several requests


@pytest.mark.parametrize('body,status,message', [
    ({'text': []}, 422, 'text: no sentence to translate'),
    ({'text': ['', '  ']}, 422, 'text: no sentence to translate'),
    ({'text': ['1'] * 9}, 413, 'text: at most 8 lines a request, got 9'),
    ({'text': ['1 ' * 21]}, 413, 'text[0]: at most 40 characters a line, got 42'),
    ({'text': '5 6 7'}, 422, 'text: Input should be a valid list'),
    ({'text': [5]}, 422, 'text[0]: Input should be a valid string'),
    ({'text': ['5'], 'beam': 4}, 422, 'beam: Extra inputs are not permitted'),
    ({'text': ['5'], 'beam_size': 7}, 422, 'beam_size: at most 6, got 7'),
    ({'text': ['5'], 'beam_size': 2, 'n_best': 3}, 422,
     'n_best=3: must be between 1 and the beam size (2; config.beam_size)'),
    ({'text': ['5'], 'seed': 3}, 422, "seed=3: only sampling (method='sample') has it"),
    ({'text': ['5'], 'method': 'nucleus'}, 422, "method: Input should be 'beam', 'greedy' or"),
    ({'text': ['5'], 'top_p': 1.5}, 422, 'top_p: Input should be less than or equal to 1'),
])
def test_bad_requests_are_4xx_with_one_line(served, body, status, message):
  got, answer = served.post('/translate', body)
  assert got == status and answer['error'].startswith(message), answer
  assert '\n' not in answer['error']


def test_malformed_json_and_a_large_body(served):
  assert served.post('/translate', None, raw=b'{"text": ["5"')[0] == 400
  status, answer = served.post('/translate', None, raw=b'{"text": ["5"')
  assert answer['error'].startswith('malformed JSON')
  status, answer = served.post('/translate', {'text': ['1'] * 3000})
  assert (status, answer) == (413, {'error': 'request body over 4096 bytes'})
  assert served.post('/translate', {'text': ['5 6']})[0] == 200  # and it serves on


def test_health_page_and_openapi(served, translator):
  status, health = served.get('/health')
  assert status == 200 and json.loads(health)['model'] == translator.describe()
  status, page = served.get('/')
  assert status == 200 and b'<textarea id="text"' in page
  status, spec = served.get('/openapi.json')
  assert {'/translate', '/attention', '/health'} <= set(json.loads(spec)['paths'])
  assert served.get('/docs')[0] == 200


def test_attention_is_a_png_per_layer(served, translator):
  status, answer = served.post('/attention', {'text': '5 6 7'})
  assert status == 200 and answer['translation'] == translator.translate('5 6 7')
  assert [layer['layer'] for layer in answer['layers']] == [0]  # the tiny model's one layer
  png = base64.b64decode(answer['layers'][0]['image'].removeprefix('data:image/png;base64,'))
  assert png.startswith(b'\x89PNG\r\n\x1a\n')


def test_batch_rows_per_platform():
  """A search batch's rows: Limits.rows if set; else 4 a device on a CPU, 32 (at least one a
  device) on an accelerator."""
  def on(platform, devices):
    mesh = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform=platform)]
                                                  * devices), size=devices)
    return types.SimpleNamespace(mesh=mesh)
  assert server.batch_rows(server.Limits(rows=6), on('cpu', 2)) == 6
  assert server.batch_rows(server.Limits(), on('cpu', 2)) == 8
  assert server.batch_rows(server.Limits(), on('gpu', 1)) == 32
  assert server.batch_rows(server.Limits(), on('tpu', 64)) == 64


def test_a_client_that_goes_away_does_not_stop_the_server(served):
  body = json.dumps({'text': SENTENCES}).encode()
  with socket.create_connection(('127.0.0.1', served.port)) as s:
    s.sendall(b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
              b'Content-Length: ' + str(len(body)).encode() + b'\r\n\r\n' + body)
  assert served.post('/translate', {'text': ['5 6']})[0] == 200


def _browser():
  """A headless chromium under selenium, or a skip naming what is missing."""
  webdriver = pytest.importorskip('selenium.webdriver')
  chromium = shutil.which('chromium') or shutil.which('chromium-browser')
  driver = shutil.which('chromedriver')
  if not chromium or not driver:
    missing = ('no chromium and chromedriver: .ci/run installs them (Debian: apt-get install '
               'chromium chromium-driver)')
    if os.environ.get('T2T_REQUIRE_BROWSER'):  # CI: the page's test must run, not skip
      pytest.fail(missing)
    pytest.skip(missing)
  options = webdriver.ChromeOptions()
  options.binary_location = chromium
  for argument in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'):
    options.add_argument(argument)
  service = webdriver.ChromeService(executable_path=driver)
  return webdriver.Chrome(options=options, service=service)


@pytest.mark.e2e
def test_the_page_in_a_browser(served, translator):
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support import expected_conditions
  from selenium.webdriver.support.ui import WebDriverWait

  browser = _browser()
  try:
    browser.get(served.url('/'))
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.ID, 'model').text)
    assert browser.find_element(By.ID, 'model').text == translator.describe()
    browser.find_element(By.ID, 'text').send_keys('5 6 7\n11 12')
    n_best = browser.find_element(By.ID, 'n_best')
    n_best.clear()
    n_best.send_keys('2')
    browser.find_element(By.ID, 'submit').click()
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, 'img.heatmap')))
    shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, '.translation')]
    assert shown == translator.translate(['5 6 7', '11 12'])
    rows = browser.find_elements(By.CSS_SELECTOR, 'table.nbest tr')
    assert len(rows) == 4  # two hypotheses of each sentence, with their scores
    image = browser.find_element(By.CSS_SELECTOR, 'img.heatmap')
    assert image.get_attribute('src').startswith('data:image/png;base64,')
    assert browser.execute_script('return arguments[0].naturalWidth', image) > 0
    assert browser.find_element(By.ID, 'error').text == ''
  finally:
    browser.quit()
