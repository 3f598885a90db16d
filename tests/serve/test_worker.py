"""The worker alone: batching by key, per-image seeds, a bad job failing alone, the request resolved once on the
worker's thread, cancelled and expired jobs dropped."""

import threading
import time

import numpy as np
import pytest
from PIL import Image

from sdaccel.errors import UsageError
from sdaccel.pipeline.request import MAX_SEED
from sdaccel.serve.jobs import CancelledJobError, DeadlineExceededError, Job, QueueFullError
from sdaccel.serve.worker import Worker
from sdaccel.serve.worker_api import WorkerBase, WorkerEvents


@pytest.fixture(scope="module")
def worker():
    w = Worker({"tiny": "synthetic:sd15-tiny"}, engine="eager", device="cpu", max_batch=4, batch_window_ms=300,
               max_queue=8)
    w.start()
    assert w.wait_ready(300)
    yield w
    w.stop()


def job(prompt="a cat", seed=0, n=1, **settings):
    return Job("tiny", prompt, n=n, seed=seed, settings=dict(dict(steps=2, scheduler="ddim", height=32, width=32),
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


def _pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)


def test_a_jobs_images_take_seed_seed_plus_1_and_match_alone_or_batched(worker):
    alone = worker.submit(job("a cat", seed=5, n=2)).result(120)
    assert [p["seed"] for p in alone.params] == [5, 6] and alone.batch_images == 2
    assert all("seeds" not in p and p["batch_size"] == 2 for p in alone.params)
    second = worker.submit(job("a cat", seed=6)).result(120)  # image 1 is seed 6's image
    assert np.abs(_pixels(alone.images[1]) - _pixels(second.images[0])).max() <= 1
    futures = [worker.submit(j) for j in (job("a dog", seed=1), job("a cat", seed=5, n=2), job("a cow", seed=9))]
    batched = [f.result(120) for f in futures]
    assert [r.batch_images for r in batched] == [4, 4, 4]
    assert [[p["seed"] for p in r.params] for r in batched] == [[1], [5, 6], [9]]
    for a, b in zip(alone.images, batched[1].images):  # the same job batched: the same images
        assert np.abs(_pixels(a) - _pixels(b)).max() <= 1


def test_submit_makes_only_cheap_checks_and_the_call_resolves_the_request_once(worker, monkeypatch):
    import sdaccel.pipeline.core as core

    resolved = []

    def spy(*args, **kwargs):
        resolved.append(threading.current_thread().name)
        return resolve(*args, **kwargs)

    resolve = core.resolve_request
    monkeypatch.setattr(core, "resolve_request", spy)
    mask = Image.new("L", (32, 32), 0)
    mask.paste(255, (0, 0, 16, 32))
    inpaint = Job("tiny", "a cat", seed=3, settings=dict(steps=2, scheduler="ddim", image=Image.new("RGB", (32, 32)),
                                                         mask=mask, mask_blur=8, strength=0.5))
    assert worker.submit(inpaint).result(120).params[0]["workload"] == "inpaint"
    assert worker.submit(job(seed=4)).result(120).images
    assert resolved == ["sdaccel-worker"] * 2  # once per call, on the worker's thread, never in submit
    for bad, words in ((job(seed=MAX_SEED, n=2), "for 2 images"), (job(steps=0), "steps"),
                       (job(height=36), "height"), (job(guidance=-1), "guidance"),
                       (job(timestep_spacing="odd"), "timestep_spacing"), (job(preset="nope"), "preset"),
                       (job(stepz=2), "unknown setting")):
        with pytest.raises(UsageError, match=words):
            worker.submit(bad)  # refused at once: nothing queued
    assert resolved == ["sdaccel-worker"] * 2


def test_the_worker_interface_and_its_events_are_fixed_at_construction():
    events = WorkerEvents()
    w = Worker({"tiny": "synthetic:sd15-tiny"}, events=events)
    assert isinstance(w, WorkerBase) and w.events is events
    assert isinstance(Worker({"tiny": "synthetic:sd15-tiny"}).events, WorkerEvents)
    with pytest.raises(UsageError, match="no model"):
        Worker({})


def test_stochastic_schedulers_run_alone(worker):
    futures = [worker.submit(job(f"a cat {i}", seed=i, scheduler="euler_a")) for i in range(2)]
    assert [f.result(120).batch_images for f in futures] == [1, 1]


def test_a_bad_job_fails_alone_and_the_worker_goes_on(worker):
    bad = Job("tiny", "a cat", settings=dict(scheduler="no-such-sampler", steps=2, height=32, width=32))
    with pytest.raises(UsageError, match="unknown scheduler"):
        worker.submit(bad)
    with pytest.raises(UsageError, match="unknown model"):
        worker.submit(Job("other", "a cat"))
    # What only the call's resolution finds fails the job's future with the pipeline's UsageError; a job queued
    # beside it runs.
    wrong = Job("tiny", "a cat", settings=dict(steps=2, image=Image.new("RGB", (32, 32)), width=64))
    wrong_future, good = worker.submit(wrong), worker.submit(job())
    with pytest.raises(UsageError, match="differs from the image"):
        wrong_future.result(120)
    assert good.result(120).images


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


def test_a_call_that_fails_for_one_job_fails_only_that_job(worker, monkeypatch):
    """A batched call that one job's input breaks runs its jobs one at a time: only the culprit fails."""
    real = worker.pipes["tiny"]

    class Poisoned:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, prompts, *args, **kwargs):
            if "poison" in prompts:
                raise ValueError("this prompt breaks the call")
            return real(prompts, *args, **kwargs)

    monkeypatch.setitem(worker.pipes, "tiny", Poisoned())
    futures = [worker.submit(j) for j in (job("a cat", seed=1), job("poison", seed=2), job("a dog", seed=3))]
    with pytest.raises(ValueError, match="this prompt breaks the call"):
        futures[1].result(120)
    good = [futures[0].result(120), futures[2].result(120)]
    assert [r.batch_images for r in good] == [1, 1]  # run again alone
    monkeypatch.setitem(worker.pipes, "tiny", real)
    alone = worker.submit(job("a dog", seed=3)).result(120)
    assert np.abs(_pixels(alone.images[0]) - _pixels(good[1].images[0])).max() <= 1


@pytest.mark.parametrize("prompt, words", [("a \ud800 cat", "prompt is not valid text: surrogates not allowed"),
                                           (5, "prompt must be a string")])
def test_text_the_tokenizer_cannot_read_is_refused_at_submit(worker, prompt, words):
    with pytest.raises(UsageError, match=words):
        worker.submit(Job("tiny", prompt, settings=dict(steps=2)))


@pytest.mark.parametrize("guidance", [1e308, 101.0])
def test_guidance_beyond_its_range_is_refused_at_submit(worker, guidance):
    with pytest.raises(UsageError, match="guidance must be a finite number >= 0, got .*at most 100"):
        worker.submit(job(guidance=guidance))
