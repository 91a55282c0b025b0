"""Calibrating auto's cost model on this machine, and keeping the result on disk.

Timing real decodes of growing batch sizes takes a fraction of a second for small targets and
up to BUDGET_S on a 2-core CPU with a 1.5B target; the result depends only on the
machine, the llama.cpp build, the two files and how they run, so it is stored under the user
cache folder (``$LOCALSPEC_CACHE_DIR`` or platformdirs' user cache dir) keyed by exactly those,
and a later process with the same key starts without re-timing. A stale (older than
``MAX_AGE_S``), corrupt or foreign file is ignored and replaced.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from time import perf_counter
from typing import Any

import numpy as np

from ..errors import LocalspecError
from ..options import RuntimeOptions
from ..runtime.clocks import Clock
from ..runtime.drafter import Drafter
from ..runtime.rollback import (
    TAX_FORMAT,
    Rollback,
    SnapshotTax,
    measure_snapshot_tax,
    with_checkpoints,
)
from ..runtime.target import Target
from .costmodel import CALIBRATION_REPS as REPS
from .costmodel import MAX_DEPTH, CostModel, ReadyCosts, VerifyCurve

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
    # the machine was quiet while it was timed (other programs' CPU use, and repetitions that
    # agree): only such a calibration is stored, and a noisy one is timed again later
    quiet: bool = True
    busy_cores: float | None = None  # other programs' CPU use meanwhile, in cores (None: unknown)
    threads: int | None = None  # the threads llama.cpp decoded on

    def cost_model(self, max_nodes: int) -> CostModel:
        return CostModel(
            VerifyCurve(self.verify),
            self.expand,
            self.flush,
            ready=self.ready,
            max_nodes=max_nodes,
        )


BLOCK_REPS = 2  # decodes of one size in a row (a block)
BUSY_CHECK, BUSY_MAX_ROWS = 8, 17  # see measure
# Other programs' CPU use above this share of a core while calibrating marks the machine busy.
BUSY_CORES = 0.1
MIN_INTERVAL_S = 0.3  # OtherLoad tells nothing over a shorter interval
# Two measurements of one decode agree when the lower is at least this share of the higher:
# interference only adds time, so a quiet machine repeats itself closely.
AGREE = 0.7


class OtherLoad:
    """Other programs' CPU use since the last reading, in cores: the machine's busy time
    (/proc/stat) less this process's own CPU time. None where the kernel does not say (no
    /proc/stat: macOS, Windows). ``busy`` compares it with the cores llama.cpp leaves free:
    on a 16-core desktop decoding on 8 threads, a browser's work on the other 8 takes
    nothing from it."""

    def __init__(self, threads: int | None = None) -> None:
        self._last = self._read()
        cpus = os.cpu_count() or 1
        self.free = max(0, cpus - threads) if threads else 0

    def busy(self) -> bool | None:
        """Whether other programs took cores llama.cpp decodes on since the last reading
        (None: the kernel does not say, or the interval was too short to tell)."""
        cores = self.cores()
        return None if cores is None else cores >= self.free + BUSY_CORES

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                fields = fh.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu" or len(fields) < 5:
            return None
        ticks = [int(x) for x in fields[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        busy = sum(ticks[:8]) - idle  # user nice system idle iowait irq softirq steal
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        t = os.times()
        return busy / hz, t.user + t.system, time.monotonic()

    @classmethod
    def available(cls) -> bool:
        return cls._read() is not None

    def cores(self) -> float | None:
        """Other programs' cores in use since the last reading that told (and starts a new
        interval); None where the kernel does not say or the interval is too short."""
        now, last = self._read(), self._last
        if now is None or last is None:
            return None
        wall = now[2] - last[2]
        if wall < MIN_INTERVAL_S:  # the kernel counts in ticks (10 ms): too coarse to tell
            return None
        self._last = now
        others = (now[0] - last[0]) - (now[1] - last[1])
        return max(0.0, others / wall)


def _best_time(
    fn: Callable[[], object],
    clock: Clock,
    reps: int = REPS,
    setup: Callable[[], object] | None = None,
) -> float:
    """The fastest of reps runs on the cost clock: other processes only ever add time, and a
    calibration that caught their noise would distort the curve's shape for a long while.
    setup runs before each, untimed."""
    ts = []
    for _ in range(reps):
        if setup is not None:
            setup()
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
    progress: Callable[[float], None] | None = None,
    threads: int | None = None,
    cut_when_busy: bool = False,
) -> Calibration:
    """Time real target decodes of growing batch sizes up to max_rows and the drafter's
    decodes per frontier width, on the cost clock, within BUDGET_S; past ALWAYS rows only while
    a bigger batch's extra rows still cost less than an average row. Both caches are
    cleared. progress(fraction) follows the work; the result says whether the machine was
    quiet meanwhile (other programs' CPU use, repetitions that agree). threads: the threads
    llama.cpp decodes on (other programs on the cores it leaves free do not count);
    cut_when_busy: stop the curve at BUSY_MAX_ROWS when the machine is busy (CPU decodes)."""
    load = OtherLoad(threads)
    agree: list[float] = []
    sizes = [n for n in SIZES if n <= max_rows]
    # the share of the work each phase takes (the big batches weigh most)
    weight = {n: float(n) for n in sizes}
    total = sum(weight.values()) * 1.15 + (4.0 if drafter is not None else 0.0)
    done = 0.0

    def tell(step: float) -> None:
        nonlocal done
        done += step
        if progress is not None:
            progress(min(done / total, 1.0))

    tok = [t % target.n_vocab for t in range(1000, 1000 + max(max_rows, 8))]
    times: dict[int, float] = {}
    spent = clock()  # the budget is on the cost clock too: stalls must not cut the curve short
    target.clear()
    tapped = drafter is not None and bool(target.taps)
    target.set_taps_active(tapped)  # the curve as drafting runs it
    warm = min(8, max_rows)
    target.decode(tok[:warm], all_logits=True)  # warm up (first decodes allocate)

    def run(n: int) -> None:
        target.keep(warm)
        target.decode(tok[:n], all_logits=True)

    def timed(n: int) -> float:
        if not target.recurrent:
            return _best_time(functools.partial(run, n), clock, BLOCK_REPS)
        # a recurrent state that its snapshots cannot cut back so far is rebuilt: untimed
        return _best_time(
            functools.partial(target.decode, tok[:n], all_logits=True),
            clock,
            BLOCK_REPS,
            setup=functools.partial(target.keep, warm),
        )

    # Each size is timed in blocks of BLOCK_REPS decodes (the first of a block follows another
    # size, llama.cpp builds the graph again; the best is a settled one), one block per pass
    # over the sizes. On a quiet machine one pass is enough. Where other programs used the CPU
    # meanwhile (or the kernel does not say), a second pass times every size again: a burst of
    # their work long enough to hit a whole block rarely lasts until the next pass. A size
    # whose two blocks disagree by more than AGREE gets a third, and two agreeing ones decide.
    # Found busy by the time BUSY_CHECK rows were timed, the curve stops at BUSY_MAX_ROWS: it
    # is not stored and is timed again once the machine is quiet, so it need not reach the
    # long n-gram drafts, and the user waits less (a 2-core CPU with one core busy took 23 s
    # to time every size twice; drafts past 16 tokens do not pay there anyway).
    blocks: dict[int, list[float]] = {}
    first = OtherLoad(threads)
    early = OtherLoad(threads)
    cut: bool | None = None if cut_when_busy else False  # decided once the load tells
    for n in sizes:
        blocks[n] = [timed(n)]
        times[n] = blocks[n][0]
        tell(weight[n] / 2)
        if cut is None and n < BUSY_MAX_ROWS:
            cut = early.busy()  # None until the interval is long enough to tell
            if cut:
                sizes = [m for m in sizes if m <= BUSY_MAX_ROWS]
                total = sum(weight[m] for m in sizes) * 1.15 + (4.0 if drafter else 0.0)
        if n >= sizes[-1]:
            break
        if n >= 2 and clock() - spent > BUDGET_S:
            break
        prev = max((m for m in times if m < n), default=0)
        if n > ALWAYS and (times[n] - times[prev]) / (n - prev) > PAYS * times[prev] / prev:
            break
    busy_first = first.busy()
    if busy_first is None or busy_first:
        for n in list(times):
            blocks[n].append(timed(n))
            tell(weight[n] / 2)
        for n, bs in blocks.items():
            agree.append(min(bs) / max(bs) if max(bs) > 0 else 1.0)
            if min(bs) < AGREE * max(bs):  # one block was hit: a third one decides
                bs.append(timed(n))
            times[n] = sorted(bs)[1] if len(bs) > 2 else min(bs)
    done = sum(weight[m] for m in sizes)
    ready = _ready_costs(target, tok[:warm], clock) if tapped else None
    tell(0.15 * done)
    target.clear()
    expand: dict[int, float] = {}
    flush = 0.0
    if drafter is not None:
        taps = np.zeros((2, drafter.tap_width), dtype=np.float32)
        g = drafter.encode(taps)

        def first_pair() -> None:
            drafter.restart(0)
            drafter.encode(taps)
            drafter.decode(tok[:2], g, 0)

        first_pair()  # warm up
        flush = _best_time(first_pair, clock)
        for k in top_ks:
            embd = np.zeros((k, drafter.n_embd), dtype=np.float32)

            def width(k: int = k, embd: np.ndarray = embd) -> None:
                drafter.rewind(2)
                drafter.decode(tok[:k], embd, 2)

            expand[k] = _best_time(width, clock)
        drafter.restart(0)
    others = load.cores()
    busy = None if others is None else others >= load.free + BUSY_CORES
    # where the kernel tells, by other programs' CPU use; elsewhere by repetitions that agree;
    # a curve cut short is never the quiet machine's
    quiet = (not busy if busy is not None else not agree or min(agree) >= AGREE) and not cut
    tell(total)
    return Calibration(times, expand, flush, ready, quiet=quiet, busy_cores=others, threads=threads)


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
    # two blocks each way, interleaved, so that one burst of another program's work cannot
    # make either look dear (a one-token decode with the taps off, timed at 2.2x the taps-on
    # one on a busy machine, made plain decoding look dear and every draft cheap)
    for on in (False, True, False, True):
        target.set_taps_active(on)
        t = _best_time(one, clock)
        t1[on] = min(t, t1.get(on, t))
    # taps off never cost more than taps on: a measurement saying so was hit by noise
    t1[False] = min(t1[False], t1[True])
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


def _machine() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cpu": _cpu_name(),
        "logical_cpus": os.cpu_count(),
        "arch": platform.machine(),
    }


def cache_key(
    target: Target,
    drafter: Drafter | None,
    rt: RuntimeOptions,
    max_rows: int,
    top_ks: tuple[int, ...],
) -> dict[str, Any]:
    """Everything a calibration depends on."""
    from ..native import INSTALLED_LLAMA_CPP_PYTHON

    return {
        "format": FORMAT,
        "machine": _machine(),
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
            quiet=bool(data.get("quiet", True)),
            threads=data.get("threads"),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(key: dict[str, Any], cal: Calibration) -> None:
    """Store a calibration atomically; a cache folder that cannot be written is not an error."""
    _save_json(
        key,
        {
            "verify": cal.verify,
            "expand": cal.expand,
            "flush": cal.flush,
            "ready": asdict(cal.ready) if cal.ready is not None else None,
            # timed on a busy machine: provisional, used until the machine is quiet to time
            # again
            "quiet": cal.quiet,
            "threads": cal.threads,
        },
    )


def _save_json(key: dict[str, Any], fields: dict[str, Any]) -> None:
    """key and fields (and the time) in the key's file, atomically; a cache folder that
    cannot be written is not an error."""
    path = _path_for(key)
    data = {"key": key, "created": time.time(), **fields}
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


def _key(
    target: Target,
    drafter: Drafter | None,
    rt: RuntimeOptions,
    max_rows: int,
    top_ks: tuple[int, ...],
    clock: Clock,
) -> dict[str, Any]:
    key = cache_key(target, drafter, rt, max_rows, top_ks)
    key["clock"] = getattr(clock, "__name__", "clock")
    return key


def stored(
    target: Target,
    drafter: Drafter | None,
    rt: RuntimeOptions,
    *,
    max_rows: int,
    top_ks: tuple[int, ...],
    clock: Clock = perf_counter,
) -> bool:
    """Whether a calibration for this set-up is stored that ``calibrate`` would use."""
    cal = load(_key(target, drafter, rt, max_rows, top_ks, clock))
    return cal is not None and (cal.quiet or OtherLoad.available())


def calibrate(
    target: Target,
    drafter: Drafter | None,
    rt: RuntimeOptions,
    *,
    max_rows: int,
    top_ks: tuple[int, ...],
    clock: Clock = perf_counter,
    recalibrate: bool = False,
    progress: Callable[[float], None] | None = None,
) -> Calibration:
    """The stored calibration for this set-up, or a new measurement (stored for next time)."""
    key = _key(target, drafter, rt, max_rows, top_ks, clock)
    if not recalibrate:
        cal = load(key)
        # a provisional one (timed on a busy machine) stands in until the machine is quiet,
        # where the kernel can say when that is; elsewhere it is timed again
        if cal is not None and (cal.quiet or OtherLoad.available()):
            return cal
    cal = measure(
        target,
        drafter,
        max_rows=max_rows,
        top_ks=top_ks,
        clock=clock,
        progress=progress,
        threads=rt.threads,
        cut_when_busy=clock is time.thread_time,  # CPU decodes (on a GPU: the wall clock)
    )
    # stored either way: a busy machine's curve marked provisional, so that a later process
    # does not time the machine again while it is still busy
    save(key, cal)
    return cal


# --- snapshots or checkpoints for a hybrid target ----------------------------------------------


def snapshot_policy(
    path: str, rt: RuntimeOptions, *, recalibrate: bool = False
) -> Callable[[Any, Rollback], Rollback]:
    """For Target(snapshot_policy=...): what n_rs_seq snapshots cost this target here (timed
    once and stored like a calibration, keyed by the file, the machine, the llama.cpp build and
    what the timing depends on), and auto's choice between them and a checkpoint per drafting
    step (rollback.with_checkpoints). A timing that fails (no room for its two short contexts)
    keeps the snapshots planned."""

    def choose(model: Any, plan: Rollback) -> Rollback:
        from ..native import INSTALLED_LLAMA_CPP_PYTHON

        key = {
            "format": TAX_FORMAT,
            "kind": "snapshot-tax",
            "machine": _machine(),
            "llama_cpp_python": INSTALLED_LLAMA_CPP_PYTHON,
            "target": _file_identity(path),
            "runtime": {
                k: getattr(rt, k) for k in ("threads", "n_gpu_layers", "kv_type", "flash_attn")
            },
            "n_rs_seq": plan.n_rs_seq,
        }
        tax = None if recalibrate else _load_tax(key)
        if tax is None:
            load = OtherLoad(rt.threads)
            try:
                tax = measure_snapshot_tax(
                    model,
                    plan.n_rs_seq,
                    n_threads=rt.threads,
                    kv_type=rt.kv_type,
                    flash_attn=rt.flash_attn,
                )
            except LocalspecError as e:
                return replace(plan, lowered=f"{plan.lowered}; not timed ({e})".lstrip("; "))
            # stored where the machine was quiet, or where that cannot be told and the
            # rounds agree; else it serves this load only and the next one times again
            busy = load.busy()
            if busy is False or (busy is None and tax.settled):
                _save_json(key, {"tax": asdict(tax)})
        return with_checkpoints(plan, tax)

    return choose


def _load_tax(key: dict[str, Any]) -> SnapshotTax | None:
    try:
        with open(_path_for(key), encoding="utf-8") as fh:
            data = json.load(fh)
        if data["key"] != key or time.time() - float(data["created"]) > MAX_AGE_S:
            return None
        return SnapshotTax(**data["tax"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
