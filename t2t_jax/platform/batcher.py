"""Dynamic batching for a server: the items of requests that arrive while the previous batch
runs, or after it while they keep coming, run together, one batch at a time, in a worker
thread.

When the worker is free, a batch takes the requests waiting, then waits for more as long as
they keep arriving (each within `wait_s` of the last), until it holds `full_items` items or
`max_wait_s` has passed. A lone request waits `wait_s`. Under load the answers of one batch
bring their clients' next requests back within milliseconds of each other: waiting for them
makes one full batch where starting at once would split the clients into two half-full
batches taking turns (each as costly as a full one in the search's fixed shapes).

Items carry a key (the search's settings): only items of one key share a batch. A batch
holds whole requests, up to `max_items` items (the work cuts them into its own fixed
shapes); the requests past that start the next, in their order. A request whose future was
cancelled (its client went away) before its batch started is dropped: it costs nothing.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

# key, the items of every request in the batch -> one result per item, in order
Work = Callable[[Hashable, list[Any]], Sequence[Any]]


@dataclasses.dataclass
class _Request:
  key: Hashable
  items: list[Any]
  future: asyncio.Future


class Batcher:
  """submit(key, items) -> their results, computed by `work` in batches (see the module).

  `wait_s`, `full_items`, `max_wait_s`: how long a batch waits for another request, the
  items that start it at once, and the longest it waits (see the module); `max_items`: the
  most items a batch holds (one request may hold more: it runs alone). Start it inside the
  event loop (`start`), and `stop` it when the server shuts down; `run_alone` runs other
  work (one call) in the same worker thread, between batches.
  """

  def __init__(self, work: Work, *, wait_s: float = 0.005, full_items: int = 32,
               max_wait_s: float = 0.05, max_items: int = 64):
    self._work, self._wait_s, self._max_items = work, wait_s, max_items
    self._full_items, self._max_wait_s = min(full_items, max_items), max_wait_s
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='batcher')
    self._queue: asyncio.Queue[_Request] | None = None
    self._task: asyncio.Task | None = None
    self.batches = 0  # batches run so far, and the requests in them: for tests and logs
    self.requests = 0

  def start(self) -> None:
    self._queue = asyncio.Queue()
    self._task = asyncio.get_running_loop().create_task(self._loop())

  async def stop(self) -> None:
    if self._task is not None:
      self._task.cancel()
      await asyncio.gather(self._task, return_exceptions=True)
    self._executor.shutdown(wait=True)

  async def submit(self, key: Hashable, items: list[Any]) -> list[Any]:
    """The results of `items`, once a batch ran them; cancelling the caller (a client gone)
    drops them from any batch not yet started."""
    future = asyncio.get_running_loop().create_future()
    self._queue.put_nowait(_Request(key, items, future))
    return await future

  async def run_alone(self, call: Callable[[], Any]) -> Any:
    """`call()` in the worker thread, so that it never runs beside a batch."""
    return await asyncio.get_running_loop().run_in_executor(self._executor, call)

  async def _loop(self) -> None:
    loop = asyncio.get_running_loop()
    while True:
      waiting = [await self._queue.get()]
      while not self._queue.empty():  # what came while the last batch ran
        waiting.append(self._queue.get_nowait())
      count, last_by = sum(len(r.items) for r in waiting), loop.time() + self._max_wait_s
      while count < self._full_items:
        try:
          timeout = min(self._wait_s, last_by - loop.time())
          waiting.append(await asyncio.wait_for(self._queue.get(), max(timeout, 0)))
        except TimeoutError:
          break
        count += len(waiting[-1].items)
      batch, items = [], 0  # at most max_items; the rest start the next batch
      for request in waiting:
        if batch and items + len(request.items) > self._max_items:
          self._queue.put_nowait(request)
        else:
          batch.append(request)
          items += len(request.items)
      for key, group in itertools.groupby(sorted(batch, key=lambda r: str(r.key)),
                                          key=lambda r: r.key):
        await self._run(key, [r for r in group if not r.future.done()])

  async def _run(self, key: Hashable, requests: list[_Request]) -> None:
    if not requests:
      return
    items = [item for r in requests for item in r.items]
    try:
      results = await asyncio.get_running_loop().run_in_executor(
          self._executor, self._work, key, items)
    except Exception as e:  # each request of the batch gets the error
      for r in requests:
        if not r.future.done():
          r.future.set_exception(e)
      return
    self.batches, self.requests = self.batches + 1, self.requests + len(requests)
    start = 0
    for r in requests:
      if not r.future.done():
        r.future.set_result(list(results[start:start + len(r.items)]))
      start += len(r.items)
