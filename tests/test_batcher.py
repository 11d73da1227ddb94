"""platform/batcher.py: which requests go together, without a server (its use: test_serve)."""
import asyncio
import threading

from t2t_jax.platform.batcher import Batcher


def _recording(hold: threading.Event | None = None):
  """work that records each batch's items (the first waits for `hold`) and upper-cases them."""
  ran = []

  def work(key, items):
    ran.append(list(items))
    if hold is not None and len(ran) == 1:
      hold.wait(10)
    return [item.upper() for item in items]
  return ran, work


def test_requests_that_keep_arriving_join_until_the_batch_is_full():
  """While requests keep coming within wait_s of each other they join the batch; it starts
  when it holds full_items, and the rest go to the next."""
  ran, work = _recording()

  async def scenario(full_items):
    batcher = Batcher(work, wait_s=1.0, full_items=full_items, max_wait_s=30)
    batcher.start()
    futures = []
    for item in 'abcde':
      futures.append(asyncio.ensure_future(batcher.submit('k', [item])))
      await asyncio.sleep(0.02)
    results = [await f for f in futures]
    await batcher.stop()
    return results

  assert asyncio.run(scenario(full_items=8)) == [['A'], ['B'], ['C'], ['D'], ['E']]
  assert ran == [['a', 'b', 'c', 'd', 'e']]  # the last one, then wait_s without another
  ran.clear()
  asyncio.run(scenario(full_items=3))
  assert ran == [['a', 'b', 'c'], ['d', 'e']]


def test_a_batch_waits_at_most_max_wait_s():
  """Requests that never stop coming do not hold a batch back past max_wait_s."""
  ran, work = _recording()

  async def scenario():
    batcher = Batcher(work, wait_s=1.0, full_items=100, max_wait_s=0.3)
    batcher.start()
    futures = []
    for i in range(20):  # one every 0.05 s for 1 s
      futures.append(asyncio.ensure_future(batcher.submit('k', [str(i)])))
      await asyncio.sleep(0.05)
    await asyncio.gather(*futures)
    await batcher.stop()

  asyncio.run(scenario())
  assert 1 < len(ran[0]) < 20
  assert [item for batch in ran for item in batch] == [str(i) for i in range(20)]


def test_what_came_during_a_batch_starts_the_next_at_most_max_items():
  """Requests waiting when the worker frees go together, in their order, up to max_items
  items (a request is never split); the rest start the batch after."""
  hold = threading.Event()
  ran, work = _recording(hold)

  async def scenario():
    batcher = Batcher(work, wait_s=0.0, full_items=4, max_items=4)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit('k', ['a']))
    await asyncio.sleep(0.1)  # the first batch holds the worker
    waiting = [asyncio.ensure_future(batcher.submit('k', list(pair)))
               for pair in ('bc', 'de', 'f', 'gh')]
    await asyncio.sleep(0.05)
    hold.set()
    results = await first, [await w for w in waiting]
    await batcher.stop()
    return results

  assert asyncio.run(scenario()) == (['A'], [['B', 'C'], ['D', 'E'], ['F'], ['G', 'H']])
  assert ran == [['a'], ['b', 'c', 'd', 'e'], ['f', 'g', 'h']]


def test_requests_of_other_keys_run_apart():
  hold = threading.Event()
  ran, work = _recording(hold)

  async def scenario():
    batcher = Batcher(work, wait_s=0.0)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit('k', ['a']))
    await asyncio.sleep(0.1)
    waiting = [asyncio.ensure_future(batcher.submit(key, [item]))
               for key, item in (('k', 'b'), ('j', 'c'), ('k', 'd'))]
    await asyncio.sleep(0.05)
    hold.set()
    results = await first, [await w for w in waiting]
    await batcher.stop()
    return results

  assert asyncio.run(scenario()) == (['A'], [['B'], ['C'], ['D']])
  assert sorted(ran[1:]) == [['b', 'd'], ['c']]


def test_a_cancelled_request_is_dropped_before_its_batch():
  """The batcher drops the items of a request cancelled while another batch runs."""
  hold = threading.Event()
  ran, work = _recording(hold)

  async def scenario():
    batcher = Batcher(work, wait_s=0.0)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit('k', ['a']))
    await asyncio.sleep(0.1)  # the first batch runs, holding the worker
    gone = asyncio.ensure_future(batcher.submit('k', ['b']))
    kept = asyncio.ensure_future(batcher.submit('k', ['c', 'd']))
    await asyncio.sleep(0.05)
    gone.cancel()
    hold.set()
    results = await first, await kept
    await batcher.stop()
    return results

  assert asyncio.run(scenario()) == (['A'], ['C', 'D'])
  assert ran == [['a'], ['c', 'd']]
