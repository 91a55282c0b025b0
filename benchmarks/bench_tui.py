"""The terminal chat's speed against the engine's, side by side in one run.

Drives the real app (`localspec chat`'s LocalspecApp, headless under Textual's Pilot) on the
default SmolLM2 pair and, in the same process, the engine alone
(`localspec.load(...).complete(...)` on the same chat prompt). Greedy decoding, so both produce
the same tokens. Prints, per mode (plain `n_draft=0`, auto) and reply length:

- decode tok/s: generated / decoding time, as the engine's Stats count it (what the app's panel
  shows); the app's figure includes every stall the UI thread causes the generation thread;
- wall tok/s: generated / (request to reply finished: on screen, for the app);
- app / engine for both (medians over interleaved rounds; engine and app alternate first).

With --ui-cost N it first measures the UI's own cost: a real N-token plain reply is generated,
then replayed through the app at --replay-rate tok/s (steps spaced by sleeps, which release the
interpreter lock as native decodes do), and the UI (main) thread's CPU time per token is
printed, overall and by quarter of the reply (a cost growing along the reply is quadratic).

    python benchmarks/bench_tui.py [--rounds 3] [--lengths 150,1000] [--modes plain,auto]
                                   [--threads 2] [--ui-cost 2000] [--size 130x42] [--prompt P]

The default prompt makes SmolLM2-135M write one long code block, the costliest thing to stream
(Textual re-lays out and re-renders the whole growing block at every redraw). The load average
is printed before and after: on a shared machine, only ratios measured side by side mean much.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any

import localspec
from localspec import EngineConfig, RuntimeOptions
from localspec.tui.app import ChatOptions, LocalspecApp
from localspec.tui.store import ChatStore

PROMPT = "Write a long, detailed guide to Python, with many sections, code examples and lists."


def engine_run(eng: Any, n: int, user: str) -> dict[str, Any]:
    prompt, stops = eng.format_chat([{"role": "user", "content": user}])  # as chat() does
    t0 = time.perf_counter()
    c = eng.complete(prompt, stop=stops, add_special=False, parse_special=True, max_tokens=n)
    wall = time.perf_counter() - t0
    s = c.stats
    return {"text": c.text, "generated": s.generated, "decode": s.tokens_per_s,
            "wall": s.generated / wall}  # fmt: skip


async def app_run(
    app: Any, pilot: Any, n: int, user: str, trace: list | None = None
) -> dict[str, Any]:
    """One reply in a fresh conversation; returns what the app measured and the wall time."""
    await pilot.press("ctrl+n")
    await pilot.pause()
    app.options.max_tokens = n
    app.chat.query_one("#prompt").value = user
    cpu0, t0 = time.thread_time(), time.perf_counter()
    await pilot.press("enter")
    panel = app.chat.query_one("#stats")
    while app.generating:
        await asyncio.sleep(0.02)
        if trace is not None:
            trace.append((panel.snapshot.get("generated", 0), time.thread_time() - cpu0))
    wall = time.perf_counter() - t0
    cpu = time.thread_time() - cpu0
    await pilot.pause()
    s = panel.snapshot
    text = app.last_reply
    return {"text": text, "generated": s["generated"], "decode": s["tokens_per_s"],
            "wall": s["generated"] / wall, "ui_cpu": cpu}  # fmt: skip


def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


async def compare(mode: str, args: argparse.Namespace, store_dir: str) -> None:
    k: int | str = 0 if mode == "plain" else "auto"
    eng = localspec.load(n_draft=k, n_threads=args.threads)
    opts = ChatOptions(
        config=EngineConfig(n_draft=k, runtime=RuntimeOptions(n_threads=args.threads)),
        max_tokens=32,
        temperature=0.0,  # greedy, as engine_run: the same text both ways
    )
    app = LocalspecApp(opts, store=ChatStore(f"{store_dir}/{mode}.sqlite"))
    w, h = (int(v) for v in args.size.split("x"))
    async with app.run_test(size=(w, h)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        engine_run(eng, 32, args.prompt)  # warm-up (auto: calibration) on both
        await app_run(app, pilot, 32, args.prompt)
        for n in args.lengths:
            e_rows, a_rows = [], []
            for r in range(args.rounds):
                if r % 2 == 0:
                    e_rows.append(engine_run(eng, n, args.prompt))
                    a_rows.append(await app_run(app, pilot, n, args.prompt))
                else:
                    a_rows.append(await app_run(app, pilot, n, args.prompt))
                    e_rows.append(engine_run(eng, n, args.prompt))
            same = all(a["text"] == e["text"] for a, e in zip(a_rows, e_rows, strict=True))
            print(
                f"{mode:5s} {n:5d} | tokens {med(e_rows, 'generated'):5.0f} "
                f"{med(a_rows, 'generated'):5.0f} | decode tok/s engine "
                f"{med(e_rows, 'decode'):6.1f} app {med(a_rows, 'decode'):6.1f} "
                f"= {med(a_rows, 'decode') / med(e_rows, 'decode'):.2f}x | wall tok/s engine "
                f"{med(e_rows, 'wall'):6.1f} app {med(a_rows, 'wall'):6.1f} "
                f"= {med(a_rows, 'wall') / med(e_rows, 'wall'):.2f}x | same text: {same}",
                flush=True,
            )
    eng.close()


class ReplayEngine:
    """Stands in for the engine in the UI-cost run: replays a real reply's steps at a fixed
    rate, sleeping (interpreter lock released, as in a native decode) between them, so the
    UI's own cost is measured without the model's CPU use and at a known speed."""

    def __init__(self, steps: list[tuple[str, list[int]]], rate: float) -> None:
        self.steps, self.rate = steps, rate
        self.last_stats = localspec.Stats()
        self.target_path, self.draft_path, self.draft_variant = "replay.gguf", None, None
        self.drafter, self.chat_template_note = None, ""

    def chat(self, messages: Any, **kw: Any) -> Any:
        stats = self.last_stats = localspec.Stats(prompt_tokens=10, generations=1, mode="plain")
        t0 = time.perf_counter()
        for i, (text, tokens) in enumerate(self.steps[: kw.get("max_tokens")]):
            time.sleep(max(0.0, t0 + (i + 1) / self.rate - time.perf_counter()))
            stats.generated += len(tokens)
            stats.steps += 1
            stats.t_target = time.perf_counter() - t0
            last = i + 1 == min(len(self.steps), kw.get("max_tokens") or len(self.steps))
            yield localspec.Event(text, tokens, [False] * len(tokens), "length" if last else None)

    def detokenize(self, tokens: Any) -> str:
        return ""

    def close(self) -> None:
        pass


async def ui_cost(n: int, args: argparse.Namespace, store_dir: str) -> None:
    eng = localspec.load(n_draft=0, n_threads=args.threads)
    steps = []
    for ev in eng.chat_stream([{"role": "user", "content": args.prompt}], max_tokens=n):
        steps.append((ev.text, ev.tokens))
    print(f"ui-cost: a real {len(steps)}-step reply ({eng.last_stats.tokens_per_s:.1f} tok/s), "
          f"replayed through the app at {args.replay_rate:.0f} tok/s", flush=True)  # fmt: skip
    eng.close()
    replay = ReplayEngine(steps, args.replay_rate)
    opts = ChatOptions(config=EngineConfig(n_draft=0), max_tokens=n)
    app = LocalspecApp(opts, engine_factory=lambda o: replay, store=ChatStore(f"{store_dir}/u"))
    w, h = (int(v) for v in args.size.split("x"))
    trace: list[tuple[int, float]] = []
    async with app.run_test(size=(w, h)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        row = await app_run(app, pilot, n, args.prompt, trace)
    gen = row["generated"]
    print(
        f"ui-cost: {gen} tokens, UI thread CPU {row['ui_cpu']:.2f} s = "
        f"{1e3 * row['ui_cpu'] / max(gen, 1):.2f} ms/token; the replay ran at "
        f"{row['decode']:.1f} tok/s of {args.replay_rate:.0f} (wall {row['wall']:.1f})"
    )
    quarter = []
    for q in range(1, 5):
        lo, hi = (q - 1) * gen / 4, q * gen / 4
        pts = [(g, c) for g, c in trace if lo <= g <= hi]
        if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
            ms = 1e3 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
            quarter.append(f"{ms:.2f}")
        else:
            quarter.append("n/a")
    print(f"ui-cost: UI ms/token by quarter of the reply: {' '.join(quarter)}", flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lengths", default="150,1000")
    ap.add_argument("--modes", default="plain,auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ui-cost", type=int, default=0, help="tokens of a plain reply (0: skip)")
    ap.add_argument("--replay-rate", type=float, default=120.0, help="tok/s of the UI-cost run")
    ap.add_argument("--size", default="130x42", help="terminal columns x rows")
    ap.add_argument("--prompt", default=PROMPT, help="the user message")
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    args.lengths = [int(v) for v in args.lengths.split(",") if v]
    with tempfile.TemporaryDirectory() as store_dir:
        if args.ui_cost:
            await ui_cost(args.ui_cost, args, store_dir)
        for mode in [m for m in args.modes.split(",") if m]:
            await compare(mode, args, store_dir)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    asyncio.run(main())
