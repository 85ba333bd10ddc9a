"""The input pipeline (jobs/data/pipeline.py): the feature cache keeps to its bound and drops the least
recently used first, gives back exactly what it was given, and costs no more memory than its
bound; the prefetcher hands over everything in order, raises its source's error where it happened
and stops when closed, waiting a bounded time for a stalled source; a learner's batches are the
same with and without prefetch and with a cache far smaller than the corpus's features."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from jobs.data import pipeline
from jobs.data.pipeline import FeatureCache, Prefetcher
from jobs.sections import WorkloadConfig
from jobs.workload import AsrWorkload

pytestmark = pytest.mark.unit


def _tensor(kib: int) -> torch.Tensor:
    return torch.zeros(kib * 256)  # float32: 1 KiB per 256 values


def test_the_cache_keeps_to_its_bound_and_drops_the_least_recently_used():
    cache = FeatureCache(max_bytes=3 * 1024)
    for key in "abc":
        cache.put(key, _tensor(1))
    assert cache.nbytes == 3 * 1024 and len(cache) == 3
    assert cache.get("a") is not None  # a is now the most recently used: b goes first
    cache.put("d", _tensor(1))
    assert "b" not in cache and {"a", "c", "d"} <= {k for k in "abcd" if k in cache}
    cache.put("e", _tensor(2))  # needs two slots: c and a go
    assert [k for k in "abcde" if k in cache] == ["d", "e"] and cache.nbytes == 3 * 1024
    assert cache.evictions == 3
    cache.put("huge", _tensor(4))  # over the bound on its own: not kept, nothing dropped for it
    assert "huge" not in cache and [k for k in "de" if k in cache] == ["d", "e"]
    assert (cache.hits, cache.misses) == (1, 0)
    assert cache.get("b") is None and cache.misses == 1


def test_the_cache_gives_back_each_tensor_as_it_was_put_and_a_copy_of_it():
    cache = FeatureCache(max_bytes=64 * 1024)
    torch.manual_seed(0)
    given = {"half": torch.randn(37, 80).half(), "odd": torch.randn(3, 5, 7), "strided": torch.randn(80, 41).t(),
             "empty": torch.zeros(0, 80), "ints": torch.arange(999, dtype=torch.int64)}
    for key, tensor in given.items():
        cache.put(key, tensor)
    for key, tensor in given.items():
        got = cache.get(key)
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and torch.equal(got, tensor), key
    cache.get("odd").fill_(1.0)  # what a caller does to its copy does not reach the cache
    assert torch.equal(cache.get("odd"), given["odd"])
    small, kept = FeatureCache(max_bytes=40 * 1024), {}  # pages freed by evictions, written again
    for i in range(30):
        kept[i] = torch.randn(int(torch.randint(10, 2000, (1,))))
        small.put(i, kept[i])
    assert small.evictions > 0 and all(torch.equal(small.get(i), kept[i]) for i in range(30) if i in small)


CHURN = """
import ctypes, json, random, sys, torch
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: the resident set counted in pages, not 2 MB steps
from jobs.data.pipeline import FeatureCache
def rss():
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS"))) / 1024
torch.manual_seed(0)
rnd, start = random.Random(0), rss()
cache, peak = FeatureCache(float(sys.argv[1]) * 2**20), 0.0
for i in range(1500):  # features of 1-9 s of speech, each a miss, and a hit on a recent one every other time
    x = torch.randn(80, rnd.randrange(100, 900)).t()
    cache.put(i, (x - x.mean(0)) / 2)
    if rnd.random() < 0.5:
        cache.get(rnd.randrange(max(0, i - 300), i + 1))
    peak = max(peak, rss() - start)
print(json.dumps({"peak_mb": peak, "cached_mb": cache.nbytes / 2**20}))
"""


def _churn_peak_mb(*cache_mb: float) -> list[dict]:
    """The churn's peak through each cache size, each in a process of its own (run side by side:
    each measures only its own memory)."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    runs = [subprocess.Popen([sys.executable, "-c", CHURN, str(mb)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=root) for mb in cache_mb]
    peaks = []
    for run in runs:
        out, err = run.communicate()
        assert run.returncode == 0, err[-2000:]
        peaks.append(json.loads(out))
    return peaks


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status and sets glibc's malloc arenas")
def test_a_full_cache_costs_the_process_no_more_memory_than_its_bound():
    """Features of every size cached and evicted in turn (as a learner's epochs do): the cache's share
    of the process's peak (against the same churn through a 1 MB cache) stays within its bound. As
    separate tensors, entries left the allocator's heap fragmented: 32 MB cost 39-40 MB (1,500
    churns, ~7 turns of the full cache, show it as 6,000 did: 40.5 MB, and 31.6 MB in pages)."""
    small, full = _churn_peak_mb(1, 32)
    assert full["cached_mb"] > 32 * 0.9  # full (its entries' last pages are half empty on average)
    assert full["peak_mb"] - small["peak_mb"] <= 32 * 1.05, (small, full)


def test_the_prefetcher_hands_over_everything_in_order_and_raises_where_its_source_failed():
    assert list(Prefetcher(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise ValueError("unreadable")

    got = []
    with pytest.raises(ValueError, match="unreadable"):
        for item in Prefetcher(failing(), depth=2):
            got.append(item)
    assert got == [1, 2]


def test_a_closed_prefetcher_stops_without_draining_its_source():
    produced = []

    def source():
        for i in range(1000):
            produced.append(i)
            yield i

    prefetcher = Prefetcher(source(), depth=2)
    assert next(prefetcher) == 0
    prefetcher.close()
    assert not prefetcher.running
    assert len(produced) <= 1 + 2 + 1  # the one handed over, the queue's two, one waiting to go in


def test_closing_a_prefetcher_whose_source_is_stalled_returns_within_its_bound(monkeypatch, caplog):
    """close() joined without a timeout: a read that hangs (an S3 request) held up the learner's exit."""
    monkeypatch.setattr(pipeline, "CLOSE_WAIT_S", 0.3)  # (10 s in a job: a test need not wait that long)
    release, started = threading.Event(), threading.Event()

    def stalled():
        yield 0
        started.set()
        release.wait(30)  # a read that does not come back
        yield 1

    prefetcher = Prefetcher(stalled(), depth=2)
    assert next(prefetcher) == 0 and started.wait(5)
    began = time.monotonic()
    prefetcher.close()
    assert time.monotonic() - began < 0.3 + 0.5 and prefetcher.running  # left to end on its own
    assert any("still inside its source after 0.3 s" in r.getMessage() for r in caplog.records)
    release.set()  # the read comes back: the thread sees the stop and ends
    prefetcher._thread.join(5)
    assert not prefetcher.running


def _workload(corpus, **data) -> AsrWorkload:
    return AsrWorkload(WorkloadConfig(data={"train": corpus / "train.jsonl", "max_batch_seconds": 10, **data}), seed=0)


def test_batches_are_the_same_with_prefetch_and_with_a_small_cache(corpus):
    reference = _workload(corpus, prefetch_batches=0)
    small = _workload(corpus, prefetch_batches=3, cache_mb=0.5)  # a few dozen utterances' features
    for epoch in range(2):
        expected = list(reference.batches(0, 2, epoch))
        got = list(small.batches(0, 2, epoch))
        assert [b.ids for b in got] == [b.ids for b in expected]
        assert all(torch.equal(g.feats, e.feats) for g, e in zip(got, expected, strict=True))
        assert small.cache.nbytes <= 0.5 * 2**20
    assert small.cache.evictions > 0 and reference.cache.evictions == 0
    # a resumed learner starts at its position with prefetch too
    resumed = list(small.batches(0, 2, 1, start=3))
    assert [b.ids for b in resumed] == [b.ids for b in expected[3:]]


def test_a_shard_left_early_stops_its_prefetch_thread(corpus):
    batches = _workload(corpus, prefetch_batches=2).batches(0, 1, 0)
    iterator = iter(batches)
    next(iterator)
    assert any(t.name == "chorus-prefetch" for t in threading.enumerate())
    iterator.close()  # what a learner's loop does when it leaves the epoch (a drain, a stop)
    assert not any(t.name == "chorus-prefetch" for t in threading.enumerate())
    assert batches.position == 1
