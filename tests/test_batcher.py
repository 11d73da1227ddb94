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


def _behind_a_held_batch(submissions, *, cancel=(), **batcher_kwargs):
  """Runs a batch of ['a'] that holds the worker while `submissions` ((key, items) each)
  arrive and those at the indices `cancel` are cancelled; then lets it go. Returns the first
  batch's results, the others' (None: cancelled) and the items of every batch run."""
  hold = threading.Event()
  ran, work = _recording(hold)

  async def scenario():
    batcher = Batcher(work, **batcher_kwargs)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit('k', ['a']))
    await asyncio.sleep(0.1)  # the first batch runs, holding the worker
    waiting = [asyncio.ensure_future(batcher.submit(key, list(items)))
               for key, items in submissions]
    await asyncio.sleep(0.05)
    for i in cancel:
      waiting[i].cancel()
    hold.set()
    results = await first, [None if i in cancel else await w for i, w in enumerate(waiting)]
    await batcher.stop()
    return results

  return (*asyncio.run(scenario()), ran)


def test_what_came_during_a_batch_starts_the_next_at_most_max_items():
  """Requests waiting when the worker frees go together, in their order, up to max_items
  items (a request is never split); the rest start the batch after."""
  first, results, ran = _behind_a_held_batch([('k', 'bc'), ('k', 'de'), ('k', 'f'), ('k', 'gh')],
                                             wait_s=0.0, full_items=4, max_items=4)
  assert first == ['A'] and results == [['B', 'C'], ['D', 'E'], ['F'], ['G', 'H']]
  assert ran == [['a'], ['b', 'c', 'd', 'e'], ['f', 'g', 'h']]


def test_requests_of_other_keys_run_apart():
  _, results, ran = _behind_a_held_batch([('k', 'b'), ('j', 'c'), ('k', 'd')], wait_s=0.0)
  assert results == [['B'], ['C'], ['D']]
  assert sorted(ran[1:]) == [['b', 'd'], ['c']]


def test_a_cancelled_request_is_dropped_before_its_batch():
  """The batcher drops the items of a request cancelled while another batch runs."""
  first, results, ran = _behind_a_held_batch([('k', 'b'), ('k', 'cd')], cancel=(0,),
                                             wait_s=0.0)
  assert first == ['A'] and results == [None, ['C', 'D']]
  assert ran == [['a'], ['c', 'd']]
