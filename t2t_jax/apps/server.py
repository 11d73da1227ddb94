"""`--mode=serve`: a trained run behind HTTP (FastAPI under uvicorn; the extra `serve`).

  POST /translate   {"text": ["A sentence.", ...], "beam_size": 4, "n_best": 2, ...}
                    -> {"translations": [{"text", "score", "n_best": [...]}, ...], "params": {...}}
  POST /attention   {"text": "A sentence."} -> the translation and, per layer, a PNG of the
                    encoder-decoder attention (the paper's Figures 3-5; attention_maps.py)
  GET  /health      {"status": "ok", ...} once the model is loaded and its search compiled
  GET  /            a page to try it; /docs: FastAPI's OpenAPI page

Requests that arrive together are decoded together (platform/batcher.py): the lines of every
request waiting with the same search settings go to one Translator.translate call, which cuts
them into the decoding plan's small fixed shapes (batch_plan.interactive_shapes, at most
batch_rows rows), compiled before the server says it is ready; a sampled request is decoded
alone, so that its samples do not depend on what it was batched with. Limits (Limits) bound
what one request may ask for; past them, and for malformed JSON or wrong types, the answer is
a 4xx with a one-line reason. Nothing in a request names a file.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import os
from collections.abc import AsyncIterator
from typing import Any, Literal

import fastapi
import pydantic
from absl import logging
from fastapi import responses

from t2t_jax.apps import attention_maps
from t2t_jax.apps.translator import Translator
from t2t_jax.platform import errors
from t2t_jax.platform.batcher import Batcher

PAGE = os.path.join(os.path.dirname(__file__), 'server_page.html')


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may ask for."""
  body_bytes: int = 256 * 1024
  lines: int = 64
  line_chars: int = 2000
  beam_size: int = 16
  # A decoding batch's most rows (the compiled shapes', batch_plan's max_rows); 0: per
  # platform (batch_rows).
  rows: int = 0


# A CPU device searches 4 rows of a server's batch fastest: it gains nothing from more rows,
# and a batch of several lengths runs as long as its longest output (docs/performance.md,
# Serving); an accelerator's step costs about the same for many rows as for a few.
ROWS_PER_DEVICE = {'cpu': 4}
ACCELERATOR_ROWS = 32


def batch_rows(limits: Limits, translator: Translator) -> int:
  """limits.rows, with 0 (per platform) resolved for the translator's devices."""
  if limits.rows:
    return limits.rows
  platform = translator.mesh.devices.flat[0].platform
  if platform in ROWS_PER_DEVICE:
    return ROWS_PER_DEVICE[platform] * translator.mesh.size
  return max(ACCELERATOR_ROWS, translator.mesh.size)


class TranslateRequest(pydantic.BaseModel):
  """A request's sentences and the search settings a user may set per request (None: the
  run's config)."""
  model_config = pydantic.ConfigDict(extra='forbid')
  text: list[str] = pydantic.Field(description='the sentences, one translation each')
  method: Literal['beam', 'greedy', 'sample'] | None = None
  beam_size: int | None = pydantic.Field(None, ge=1)
  alpha: float | None = pydantic.Field(None, ge=0, allow_inf_nan=False)
  n_best: int | None = pydantic.Field(None, ge=1)
  temperature: float | None = pydantic.Field(None, gt=0, allow_inf_nan=False)
  top_k: int | None = pydantic.Field(None, ge=0)
  top_p: float | None = pydantic.Field(None, gt=0, le=1, allow_inf_nan=False)
  seed: int | None = pydantic.Field(None, ge=0, lt=2 ** 32)


class AttentionRequest(pydantic.BaseModel):
  model_config = pydantic.ConfigDict(extra='forbid')
  text: str = pydantic.Field(description='one sentence')


class BadRequest(Exception):
  """A request past a limit or with settings that do not go together: 4xx, one line."""

  def __init__(self, message: str, status: int = 422):
    super().__init__(message)
    self.status = status


def _check(request: TranslateRequest, translator: Translator, limits: Limits) -> None:
  if not request.text or not any(line.strip() for line in request.text):
    raise BadRequest('text: no sentence to translate')
  if len(request.text) > limits.lines:
    raise BadRequest(f'text: at most {limits.lines} lines a request, got {len(request.text)}',
                     413)
  for i, line in enumerate(request.text):
    if len(line) > limits.line_chars:
      raise BadRequest(f'text[{i}]: at most {limits.line_chars} characters a line, got '
                       f'{len(line)}', 413)
  if request.beam_size is not None and request.beam_size > limits.beam_size:
    raise BadRequest(f'beam_size: at most {limits.beam_size}, got {request.beam_size}')
  try:  # as the Python API checks them
    translator.check_settings(**_settings(request))
  except errors.UserError as e:
    raise BadRequest(str(e)) from None


def _settings(request: TranslateRequest) -> dict[str, Any]:
  """translate()'s keyword arguments of a request (those it set)."""
  settings = request.model_dump(exclude={'text'}, exclude_none=True)
  settings.setdefault('n_best', 1)  # a score for every translation
  return settings


_ALONE = itertools.count()  # a sampled request's own batch key


def _key(settings: dict[str, Any]) -> tuple:
  """Requests of equal keys share a batch: (the search's settings, a number of its own for
  a sampled request, which shares none)."""
  alone = next(_ALONE) if settings.get('method') == 'sample' else 0
  return tuple(sorted(settings.items())), alone


def create_app(translator: Translator, *, limits: Limits = Limits(), wait_s: float = 0.005,
               warm: bool = True) -> fastapi.FastAPI:
  """The app serving `translator`; `warm` compiles its default search for every shape a
  batch of at most batch_rows can meet before the server is ready (lifespan)."""
  rows = batch_rows(limits, translator)

  def work(key: tuple, lines: list[str]) -> list[Any]:
    settings = dict(key[0])
    return translator.translate(lines, max_rows=rows, show_progress=False, **settings)

  # A batch waits for a full search batch of lines, and takes up to 4: sorted by length, the
  # lines of a busy server's batch make searches of like lengths (batch_plan).
  batcher = Batcher(work, wait_s=wait_s, full_items=rows, max_items=4 * rows)

  @contextlib.asynccontextmanager
  async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
    batcher.start()
    if warm:
      await batcher.run_alone(lambda: translator.compile_ahead(max_rows=rows, n_best=1))
    logging.info('Serving %s: ready.', translator.describe())
    yield
    await batcher.stop()

  app = fastapi.FastAPI(title='t2t_jax', lifespan=lifespan,
                        description='The Transformer of "Attention Is All You Need" (Vaswani '
                        f'et al., 2017): {translator.describe()}')
  app.add_middleware(_BodyLimit, limit=limits.body_bytes)

  @app.exception_handler(fastapi.exceptions.RequestValidationError)
  async def invalid(_: fastapi.Request, error: fastapi.exceptions.RequestValidationError):
    found = error.errors()
    return _error(_one_line(found), 400 if _malformed(found) else 422)

  @app.exception_handler(BadRequest)
  async def bad(_: fastapi.Request, error: BadRequest):
    return _error(str(error), error.status)

  @app.get('/health')
  async def health() -> dict[str, Any]:
    return {'status': 'ok', 'model': translator.describe(), 'batches': batcher.batches,
            'requests': batcher.requests}

  @app.post('/translate')
  async def translate(body: TranslateRequest, request: fastapi.Request) -> dict[str, Any]:
    _check(body, translator, limits)
    settings = _settings(body)
    results = await _unless_gone(request, batcher.submit(_key(settings), list(body.text)))
    if results is GONE:
      return GONE_RESPONSE
    return {'translations': [_translation(hypotheses, 'n_best' in body.model_fields_set)
                             for hypotheses in results],
            'params': {'model': translator.describe(), **translator.search_settings(settings)}}

  @app.post('/attention')
  async def attention(body: AttentionRequest, request: fastapi.Request) -> dict[str, Any]:
    if not body.text.strip():
      raise BadRequest('text: no sentence to translate')
    if len(body.text) > limits.line_chars:
      raise BadRequest(f'text: at most {limits.line_chars} characters, got {len(body.text)}',
                       413)
    found = await _unless_gone(request, batcher.run_alone(
        lambda: _attention(translator, body.text)))
    return GONE_RESPONSE if found is GONE else found

  @app.get('/', response_class=responses.HTMLResponse, include_in_schema=False)
  async def page() -> str:
    with open(PAGE, encoding='utf-8') as f:
      return f.read()

  return app


def _translation(hypotheses: list[Any], with_n_best: bool) -> dict[str, Any]:
  best = hypotheses[0]
  out: dict[str, Any] = {'text': best.text, 'score': best.score}
  if with_n_best:
    out['n_best'] = [h._asdict() for h in hypotheses]
  return out


def _attention(translator: Translator, sentence: str) -> dict[str, Any]:
  """The translation of `sentence` and each layer's encoder-decoder attention as a PNG."""
  found = attention_maps.translate_and_attend(translator, sentence)
  title, queries, keys = attention_maps.KINDS['decoder_cross_attention']
  layers = []
  for (kind, layer), weights in sorted(found.weights.items()):
    if kind == 'decoder_cross_attention':
      png = attention_maps.figure_png(weights, found.labels[queries], found.labels[keys],
                                      f'{title}, layer {layer}')
      layers.append({'layer': layer,
                     'image': 'data:image/png;base64,' + base64.b64encode(png).decode()})
  return {'text': sentence, 'translation': found.translation, 'layers': layers}


GONE = object()  # _unless_gone's answer when the client went away
# What the server logs for a client that went away (nginx's code): nobody reads it.
GONE_RESPONSE = responses.Response(status_code=499)


async def _unless_gone(request: fastapi.Request, work: Any) -> Any:
  """`work`'s result, or GONE if the client disconnects first: its work is cancelled (a batch
  not yet started drops it)."""
  task = asyncio.ensure_future(work)
  gone = asyncio.ensure_future(_disconnected(request))
  try:
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
  finally:
    gone.cancel()
  if not task.done():
    task.cancel()
    return GONE
  return task.result()


async def _disconnected(request: fastapi.Request) -> None:
  while (await request.receive())['type'] != 'http.disconnect':
    pass


def _error(message: str, status: int) -> responses.JSONResponse:
  return responses.JSONResponse({'error': message}, status_code=status)


def _malformed(found: list[dict[str, Any]]) -> bool:
  return any(e.get('type') == 'json_invalid' for e in found)


def _one_line(found: list[dict[str, Any]]) -> str:
  """Pydantic's first error as 'text[2]: Input should be a valid string' (and how many more)."""
  first = found[0]
  where = ''.join(f'[{p}]' if isinstance(p, int) else f'.{p}' for p in first.get('loc', ())[1:])
  where = where.lstrip('.') or 'body'
  if first.get('type') == 'json_invalid':
    message = f'malformed JSON ({first.get("ctx", {}).get("error", "invalid")})'
  else:
    message = f'{where}: {first.get("msg", "invalid")}'
  more = f' (and {len(found) - 1} more)' if len(found) > 1 else ''
  return message + more


class _BodyLimit:
  """Refuses a request body over `limit` bytes with a 413, by its Content-Length or as it
  arrives (chunked), before anything reads it whole."""

  def __init__(self, app: Any, limit: int):
    self.app, self.limit = app, limit

  async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
    if scope['type'] != 'http':
      await self.app(scope, receive, send)
      return
    length = dict(scope.get('headers') or []).get(b'content-length')
    if length is not None and length.isdigit() and int(length) > self.limit:
      await self._refuse(send)
      return
    seen = 0

    async def counted() -> dict:
      nonlocal seen
      message = await receive()
      seen += len(message.get('body', b''))
      if seen > self.limit:
        raise _TooLarge
      return message

    try:
      await self.app(scope, counted, send)
    except _TooLarge:
      await self._refuse(send)

  async def _refuse(self, send: Any) -> None:
    body = json.dumps({'error': f'request body over {self.limit} bytes'}).encode()
    await send({'type': 'http.response.start', 'status': 413,
                'headers': [(b'content-type', b'application/json'),
                            (b'content-length', str(len(body)).encode())]})
    await send({'type': 'http.response.body', 'body': body})


class _TooLarge(Exception):
  pass
