"""Serve a trained run over HTTP (--port, --host): POST /translate batches what arrives
together, a page to try it at /, /docs (the extra `serve`: pip install -e '.[serve]')."""
from __future__ import annotations

import signal

import ml_collections
from absl import logging

from t2t_jax import cli
from t2t_jax.apps.translator import Translator
from t2t_jax.platform import errors


def run(config: ml_collections.ConfigDict, workdir: str) -> str:
  try:  # the extra `serve`: the rest of t2t_jax never needs a web stack
    import uvicorn  # noqa: PLC0415 (optional extra)

    from t2t_jax.apps import server  # noqa: PLC0415 (imports FastAPI, the optional extra)
  except ImportError as e:
    raise errors.UserError(f"--mode=serve needs the extra 'serve' ({e.name} is missing): "
                           "pip install -e '.[serve]'") from None
  flags = cli.FLAGS
  with Translator(config, workdir, mode='serve') as translator:
    app = server.create_app(translator)
    logging.info('Listening on http://%s:%d/ (--host, --port); SIGTERM or Ctrl-C stops it.',
                 flags.host, flags.port)
    # uvicorn's own handlers serve SIGTERM and SIGINT: it stops accepting, lets the requests
    # in flight finish, returns, and then hands the signal to the handler it found, this one:
    # a server stopped so has done its work (exit 0).
    stopped: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _: stopped.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
      uvicorn.run(app, host=flags.host, port=flags.port, log_level='warning',
                  timeout_graceful_shutdown=60)
    finally:
      for sig, handler in handlers.items():
        signal.signal(sig, handler)
  how = f' until {signal.Signals(stopped[0]).name}' if stopped else ''
  return f'served {workdir} on http://{flags.host}:{flags.port}/{how}'
