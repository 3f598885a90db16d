"""The worker alone: batching by key, a bad job failing alone, cancelled and expired jobs dropped."""

import time

import numpy as np
import pytest

from sdaccel.errors import UsageError
from sdaccel.serve.jobs import CancelledJobError, DeadlineExceededError, Job, QueueFullError
from sdaccel.serve.worker import Worker


@pytest.fixture(scope="module")
def worker():
    w = Worker({"tiny": "synthetic:sd15-tiny"}, engine="eager", device="cpu", max_batch=4, batch_window_ms=300,
               max_queue=8)
    w.start()
    assert w.wait_ready(300)
    yield w
    w.stop()


def job(prompt="a cat", seed=0, **settings):
    return Job("tiny", prompt, seed=seed, settings=dict(dict(steps=2, scheduler="ddim", height=32, width=32),
                                                         **settings))


def test_same_settings_share_a_call_and_each_gets_its_own_image(worker):
    jobs = [job(f"a cat {i}", seed=i) for i in range(3)] + [job("a dog", seed=9, steps=3)]
    futures = [worker.submit(j) for j in jobs]
    results = [f.result(120) for f in futures]
    assert [r.batch_images for r in results] == [3, 3, 3, 1]  # other steps: another call
    assert [r.params[0]["seed"] for r in results] == [0, 1, 2, 9]
    alone = worker.submit(job("a cat 1", seed=1)).result(120)
    a, b = (np.asarray(r.images[0], dtype=np.int16) for r in (alone, results[1]))
    assert np.abs(a - b).max() <= 1


def test_stochastic_schedulers_run_alone(worker):
    futures = [worker.submit(job(f"a cat {i}", seed=i, scheduler="euler_a")) for i in range(2)]
    assert [f.result(120).batch_images for f in futures] == [1, 1]


def test_a_bad_job_fails_alone_and_the_worker_goes_on(worker):
    bad = Job("tiny", "a cat", settings=dict(scheduler="no-such-sampler", steps=2, height=32, width=32))
    with pytest.raises(UsageError, match="unknown scheduler"):
        worker.submit(bad).result(120)
    with pytest.raises(UsageError, match="unknown model"):
        worker.submit(Job("other", "a cat"))
    assert worker.submit(job()).result(120).images


def test_cancelled_and_expired_jobs_are_dropped_and_a_full_queue_refuses(worker):
    slow = worker.submit(job(steps=30))
    gone, late = job(seed=1, steps=4), job(seed=2, steps=5)
    gone_future, late_future = worker.submit(gone), worker.submit(late)
    gone.cancel()
    late.deadline = time.monotonic()  # already past when the worker reaches it
    cancelled = worker.submit(job(seed=3, steps=6))
    cancelled.cancel()  # the waiter cancels the future itself: the worker must not trip over it
    fillers = []
    with pytest.raises(QueueFullError):
        for i in range(20):
            fillers.append(worker.submit(job(seed=10 + i, steps=7)))
    assert slow.result(120).images
    with pytest.raises(CancelledJobError):
        gone_future.result(120)
    with pytest.raises(DeadlineExceededError):
        late_future.result(120)
    for future in fillers:
        assert future.result(120).images
    assert worker.submit(job()).result(120).images  # still serving


def test_batches_keep_to_the_counts_warmed_for_their_size():
    w = Worker({"tiny": "synthetic:sd15-tiny"}, engine="eager", device="cpu", max_batch=4, batch_window_ms=300,
               max_queue=8, warm=((32, 32, 1), (32, 32, 2)))
    w.start()
    try:
        assert w.wait_ready(300)
        futures = [w.submit(job(f"a cat {i}", seed=i)) for i in range(3)]
        # Three gathered: two run together (a warmed count), the third waits for the next call rather than a
        # call of three capturing a new shape on the request path.
        assert [f.result(120).batch_images for f in futures] == [2, 2, 1]
        other = [w.submit(job(f"a dog {i}", seed=i, height=40, width=40)) for i in range(3)]
        assert [f.result(120).batch_images for f in other] == [3, 3, 3]  # nothing warmed at 40x40: one call
    finally:
        w.stop()
