"""Calibrating auto's cost model on this machine, and keeping the result on disk.

Timing real decodes of growing batch sizes takes a fraction of a second for small targets and
up to BUDGET_S on a 2-core CPU with a 1.5B target; the result depends only on the
machine, the llama.cpp build, the two files and how they run, so it is stored under the user
cache folder (``$LOCALSPEC_CACHE_DIR`` or platformdirs' user cache dir) keyed by exactly those,
and a later process with the same key starts without re-timing. A stale (older than
``MAX_AGE_S``), corrupt or foreign file is ignored and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from time import perf_counter
from typing import Any

import numpy as np

from .clocks import Clock
from .costmodel import CALIBRATION_REPS as REPS
from .costmodel import MAX_DEPTH, CostModel, ReadyCosts, VerifyCurve
from .drafter import Drafter
from .options import RuntimeOptions
from .target import Target

FORMAT = 4  # 4: SIZES gained 17
MAX_AGE_S = 7 * 24 * 3600.0
# 17 (a chain of 16 and the root, the deepest auto planned before chains of up to MAX_DEPTH)
# and MAX_DEPTH + 1 (33): sizes auto runs often. Interpolated, a size's price is a guess that
# no step corrects (a size auto never runs is never observed), and on a GPU t(n) moves in
# steps as kernels change with the batch size.
SIZES = tuple(sorted({1, 2, 3, 4, 5, 6, 8, 12, 16, 17, 20, 24, 28, 33, 48, 64, MAX_DEPTH + 1}))
BUDGET_S = 10.0  # stop timing larger batches once this much cost-clock time was spent (8 s
# before 17 rows were timed too: a compute-bound CPU still reaches the n-gram sizes, 28 and 33)
ALWAYS = 33  # sizes up to this are timed (n-gram drafts of up to 32 tokens, the root)
PAYS = 0.9  # past ALWAYS, a size is timed while its rows still cost less than PAYS x the
# average row of the last size: a longer draft accepted whole would gain no more


@dataclass
class Calibration:
    verify: dict[int, float]  # seconds per target decode of n tokens (logits on every row)
    expand: dict[int, float]  # seconds per drafter decode of a frontier of k rows
    flush: float  # seconds to encode and write the first pairs and read the first draft
    ready: ReadyCosts | None = None  # one-token decodes with taps on and off (a drafter's)
    measured: bool = True  # False when read from the disk cache

    def cost_model(self, max_nodes: int) -> CostModel:
        return CostModel(
            VerifyCurve(self.verify),
            self.expand,
            self.flush,
            ready=self.ready,
            max_nodes=max_nodes,
        )


def _best_time(fn: Callable[[], object], clock: Clock) -> float:
    """The fastest of REPS runs on the cost clock: other processes only ever add time, and a
    calibration that caught their noise would distort the curve's shape for a long while."""
    ts = []
    for _ in range(REPS):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return min(ts)


def measure(
    target: Target,
    drafter: Drafter | None,
    *,
    max_rows: int,
    top_ks: tuple[int, ...],
    clock: Clock = perf_counter,
) -> Calibration:
    """Time real target decodes of growing batch sizes up to max_rows and the drafter's
    decodes per frontier width, on the cost clock, within BUDGET_S; past ALWAYS rows only while
    a bigger batch's extra rows still cost less than an average row. Both caches are
    cleared."""
    tok = [t % target.n_vocab for t in range(1000, 1000 + max(max_rows, 8))]
    times: dict[int, float] = {}
    spent = clock()  # the budget is on the cost clock too: stalls must not cut the curve short
    target.clear()
    tapped = drafter is not None and bool(target.taps)
    target.set_taps_active(tapped)  # the curve as drafting runs it
    warm = min(8, max_rows)
    target.decode(tok[:warm], all_logits=True)  # warm up (first decodes allocate)
    for n in SIZES:
        if n > max_rows:
            break

        def run(n: int = n) -> None:
            target.keep(warm)
            target.decode(tok[:n], all_logits=True)

        times[n] = _best_time(run, clock)
        if n >= 2 and clock() - spent > BUDGET_S:
            break
        prev = max((m for m in times if m < n), default=0)
        if n > ALWAYS and (times[n] - times[prev]) / (n - prev) > PAYS * times[prev] / prev:
            break
    ready = _ready_costs(target, tok[:warm], clock) if tapped else None
    target.clear()
    if drafter is None:
        return Calibration(times, {}, 0.0)

    taps = np.zeros((2, drafter.tap_width), dtype=np.float32)
    g = drafter.encode(taps)

    def first_pair() -> None:
        drafter.restart(0)
        drafter.encode(taps)
        drafter.decode(tok[:2], g, 0)

    first_pair()  # warm up
    flush = _best_time(first_pair, clock)
    expand: dict[int, float] = {}
    for k in top_ks:
        embd = np.zeros((k, drafter.n_embd), dtype=np.float32)

        def width(k: int = k, embd: np.ndarray = embd) -> None:
            drafter.rewind(2)
            drafter.decode(tok[:k], embd, 2)

        expand[k] = _best_time(width, clock)
    drafter.restart(0)
    return Calibration(times, expand, flush, ready)


def _ready_costs(target: Target, context: list[int], clock: Clock) -> ReadyCosts:
    """One-token decodes with the taps on and off, and what the decode right after switching
    them costs beyond that (the best of REPS switches each way). Leaves the taps on."""
    t1: dict[bool, float] = {}
    after: dict[bool, list[float]] = {True: [], False: []}

    def one() -> None:
        target.keep(len(context))
        target.decode(context[:1], all_logits=True)

    for _ in range(REPS):
        for on in (False, True):
            target.set_taps_active(on)
            t0 = clock()
            one()
            after[on].append(clock() - t0)
    for on in (False, True):
        target.set_taps_active(on)
        t1[on] = _best_time(one, clock)
    # the best of each direction, averaged: sleeping and waking again pays one of each
    switch = sum(min(after[on]) - t1[on] for on in (False, True)) / 2
    return ReadyCosts(t1[True], t1[False], max(switch, 0.0))


# --- the disk cache ----------------------------------------------------------------------------


def cache_dir() -> str:
    env = os.environ.get("LOCALSPEC_CACHE_DIR")
    if env:
        return os.path.join(env, "calibration")
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("localspec", appauthor=False), "calibration")


def _file_identity(path: str) -> dict[str, Any]:
    st = os.stat(path)
    return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_key(
    target: Target,
    drafter: Drafter | None,
    rt: RuntimeOptions,
    max_rows: int,
    top_ks: tuple[int, ...],
) -> dict[str, Any]:
    """Everything a calibration depends on."""
    from ._native import INSTALLED_LLAMA_CPP_PYTHON

    return {
        "format": FORMAT,
        "machine": {
            "host": platform.node(),
            "cpu": _cpu_name(),
            "logical_cpus": os.cpu_count(),
            "arch": platform.machine(),
        },
        "llama_cpp_python": INSTALLED_LLAMA_CPP_PYTHON,
        "target": _file_identity(target.path),
        "drafter": _file_identity(drafter.spec.path) if drafter is not None else None,
        "runtime": asdict(rt),
        "max_rows": max_rows,
        "top_ks": list(top_ks),
    }


def _path_for(key: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"{digest}.json")


def load(key: dict[str, Any]) -> Calibration | None:
    """The stored calibration for this key, or None (missing, stale, corrupt or foreign)."""
    try:
        with open(_path_for(key), encoding="utf-8") as fh:
            data = json.load(fh)
        if data["key"] != key or time.time() - float(data["created"]) > MAX_AGE_S:
            return None
        ready = data["ready"]
        return Calibration(
            verify={int(n): float(t) for n, t in data["verify"].items()},
            expand={int(k): float(t) for k, t in data["expand"].items()},
            flush=float(data["flush"]),
            ready=ReadyCosts(**{k: float(v) for k, v in ready.items()}) if ready else None,
            measured=False,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(key: dict[str, Any], cal: Calibration) -> None:
    """Store a calibration atomically; a cache folder that cannot be written is not an error."""
    path = _path_for(key)
    data = {
        "key": key,
        "created": time.time(),
        "verify": cal.verify,
        "expand": cal.expand,
        "flush": cal.flush,
        "ready": asdict(cal.ready) if cal.ready is not None else None,
    }
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def calibrate(
    target: Target,
    drafter: Drafter | None,
    rt: RuntimeOptions,
    *,
    max_rows: int,
    top_ks: tuple[int, ...],
    clock: Clock = perf_counter,
    recalibrate: bool = False,
) -> Calibration:
    """The stored calibration for this set-up, or a new measurement (stored for next time)."""
    key = cache_key(target, drafter, rt, max_rows, top_ks)
    key["clock"] = getattr(clock, "__name__", "clock")
    if not recalibrate:
        cal = load(key)
        if cal is not None:
            return cal
    cal = measure(target, drafter, max_rows=max_rows, top_ks=top_ks, clock=clock)
    save(key, cal)
    return cal
