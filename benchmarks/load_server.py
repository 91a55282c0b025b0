"""Load test of `localspec serve` on loopback, bounded in time (not a test: it measures).

Starts `localspec serve` (the real default SmolLM2 pair unless told otherwise) on a free
127.0.0.1 port, then, in one run:
1. answers each prompt once, one request at a time (greedy): the reference answers;
2. 8 concurrent clients x 5 requests each (half streaming), greedy, with /health polled
   throughout: every request must be answered, with no 5xx, the same text as its reference,
   and /health must answer during the run; prints p50/p95 latency and tokens/s;
3. the server's time per token against Engine.chat_stream in this process on the same prompts,
   interleaved in rotated order (non-streaming and streaming), as a ratio of medians.

    python benchmarks/load_server.py [TARGET.gguf] [--draft D.gguf] [-t 2] [--time-limit 900]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

import localspec
from localspec.datasets import mtbench_questions


@dataclass
class Result:
    client: int
    stream: bool
    prompt: int
    status: int = 0
    text: str = ""
    tokens: int = 0
    latency: float = 0.0
    ttft: float = 0.0  # streaming: time to the first text
    engine_s: float = 0.0  # time inside the engine (timings: prompt_ms + predicted_ms)
    error: str = ""


@dataclass
class Health:
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise SystemExit(f"load_server: time limit reached during {what}")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "localspec.cli", "serve", "--port", "0", "-t", str(args.threads)]
    cmd += [args.target] if args.target else []
    cmd += ["--draft", args.draft] if args.draft else []
    cmd += ["--max-queue", str(args.clients * args.requests)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if " at http://127.0.0.1:" not in line:
        proc.kill()
        raise SystemExit(f"load_server: the server did not start: {line!r}")
    return proc, line.split(" at ")[1].strip().removesuffix("/v1")


def chat_body(prompt: str, max_tokens: int, stream: bool, **extra: Any) -> dict[str, Any]:
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        **extra,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def request(http: httpx.Client, url: str, body: dict[str, Any], res: Result) -> Result:
    """One chat request; fills status, text, tokens, latency (and ttft when streaming)."""
    t0 = time.perf_counter()
    try:
        if not body["stream"]:
            r = http.post(url + "/chat/completions", json=body)
            res.status = r.status_code
            if r.status_code == 200:
                data = r.json()
                res.text = data["choices"][0]["message"]["content"]
                res.tokens = data["usage"]["completion_tokens"]
                res.engine_s = engine_seconds(data)
            else:
                res.error = r.text[:200]
        else:
            with http.stream("POST", url + "/chat/completions", json=body) as r:
                res.status = r.status_code
                if r.status_code != 200:
                    res.error = r.read().decode()[:200]
                parts: list[str] = []
                last = ""
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    last = line
                    if '"content":' in line:  # parse text chunks only as much as needed
                        piece = json.loads(line[6:])["choices"][0]["delta"].get("content")
                        if piece and not res.ttft:
                            res.ttft = time.perf_counter() - t0
                        parts.append(piece or "")
                res.text = "".join(parts)
                if last:
                    data = json.loads(last[6:])
                    res.tokens = (data.get("usage") or {}).get("completion_tokens", 0)
                    res.engine_s = engine_seconds(data)
                    if "error" in data:
                        res.error = str(data["error"])
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.latency = time.perf_counter() - t0
    return res


def engine_seconds(data: dict[str, Any]) -> float:
    t = data.get("timings") or {}
    return 1e-3 * (t.get("prompt_ms", 0.0) + t.get("predicted_ms", 0.0))


def poll_health(url: str, stop: threading.Event, out: Health) -> None:
    with httpx.Client(timeout=5) as http:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = http.get(url + "/health")
                if r.status_code != 200:
                    out.failures.append(f"status {r.status_code}")
            except httpx.HTTPError as exc:
                out.failures.append(f"{type(exc).__name__}: {exc}")
            out.latencies.append(time.perf_counter() - t0)
            stop.wait(0.25)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("--draft")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=5, help="per client")
    ap.add_argument("--prompts", type=int, default=10, help="distinct MT-Bench questions")
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--overhead-prompts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=900, help="seconds for the whole run")
    args = ap.parse_args()
    deadline = Deadline(args.time_limit)
    prompts = [q[0] for q in mtbench_questions()[: args.prompts]]

    proc, base = start_server(args)
    url = base + "/v1"
    print(f"server: {base} (pid {proc.pid}), -t {args.threads}", flush=True)
    timeout = httpx.Timeout(max(30.0, deadline.left()), connect=10)
    try:
        with httpx.Client(timeout=timeout) as http:
            meta = http.get(url + "/models").json()["data"][0]["meta"]
            print(f"target:  {meta['target']}\ndrafter: {meta['drafter']}")
            # warm-up: auto calibrates its cost model on its first generation
            request(http, url, chat_body("Hello", 8, False), Result(-1, False, -1))

            # 1. references, one at a time
            refs: list[str] = []
            for i, p in enumerate(prompts):
                deadline.check("the reference answers")
                r = request(http, url, chat_body(p, args.max_tokens, False), Result(-1, False, i))
                if r.status != 200:
                    raise SystemExit(f"reference request {i} failed: {r.status} {r.error}")
                refs.append(r.text)
            print(f"references: {len(refs)} prompts answered one at a time")

        # 2. concurrent clients
        results: list[Result] = []
        lock = threading.Lock()

        def client(c: int) -> None:
            with httpx.Client(timeout=timeout) as http:
                for j in range(args.requests):
                    if deadline.left() <= 0:
                        return
                    k = (c * args.requests + j) % len(prompts)
                    stream = (c + j) % 2 == 0
                    res = request(
                        http,
                        url,
                        chat_body(prompts[k], args.max_tokens, stream),
                        Result(c, stream, k),
                    )
                    with lock:
                        results.append(res)

        stop = threading.Event()
        health = Health()
        poller = threading.Thread(target=poll_health, args=(base, stop, health))
        poller.start()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, deadline.left()))
        wall = time.perf_counter() - t0
        stop.set()
        poller.join()

        expected = args.clients * args.requests
        ok = [r for r in results if r.status == 200 and not r.error]
        five = [r for r in results if r.status >= 500]
        differ = [r for r in ok if r.text != refs[r.prompt]]
        lat = [r.latency for r in ok]
        ttft = [r.ttft for r in ok if r.stream and r.ttft]
        tokens = sum(r.tokens for r in ok)
        print(
            f"\nconcurrent: {args.clients} clients x {args.requests} requests "
            f"({sum(r.stream for r in results)} streaming), max_tokens {args.max_tokens}, greedy"
        )
        print(
            f"  answered        {len(ok)}/{expected}  (5xx: {len(five)}, other failures: "
            f"{len(results) - len(ok) - len(five)}, never sent: {expected - len(results)})"
        )
        print(f"  same text as one-at-a-time: {len(ok) - len(differ)}/{len(ok)}")
        print(
            f"  latency         p50 {pct(lat, 0.5):.2f} s   p95 {pct(lat, 0.95):.2f} s   "
            f"max {max(lat, default=float('nan')):.2f} s"
        )
        print(
            f"  first text      p50 {pct(ttft, 0.5):.2f} s   p95 {pct(ttft, 0.95):.2f} s"
            " (streaming)"
        )
        print(f"  throughput      {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tokens/s")
        print(
            f"  /health         {len(health.latencies)} polls, {len(health.failures)} failed, "
            f"p50 {1e3 * pct(health.latencies, 0.5):.1f} ms, "
            f"max {1e3 * max(health.latencies, default=float('nan')):.1f} ms"
        )
        for r in (five + differ)[:5]:
            print(
                f"  ! client {r.client} prompt {r.prompt}: {r.status} {r.error or 'text differs'}"
            )

        # 3. overhead per token against Engine.generate, interleaved
        deadline.check("the overhead measurement")
        over = overhead(args, url, prompts[: args.overhead_prompts], deadline)
    finally:
        proc.terminate()
        proc.wait(30)

    failed = len(ok) != expected or five or differ or health.failures or not health.latencies
    print("\nRESULT:", "FAIL" if failed else "OK", f"(server overhead {over})")
    return 1 if failed else 0


def overhead(args: argparse.Namespace, url: str, prompts: list[str], deadline: Deadline) -> str:
    """Time per token: Engine.chat_stream in this process against the server (whole and streamed) on
    the same prompts and settings, in rotated order, the server idle while the engine runs
    and vice versa. Plain decoding (n_draft=0) on both sides: the same steps, and one event
    per token, the server's worst case. Two ratios: against the in-process engine (median of
    the per-prompt ratios: pairs taken side by side, so slow drifts of a shared machine's load
    cancel), and the client's wall time against the time the server's own engine reports for
    the same request (timings), which isolates HTTP, queueing and serialisation."""
    gen = {"max_tokens": args.max_tokens, "temperature": 0.0, "n_draft": 0}
    eng = localspec.load(args.target, draft=args.draft, n_threads=args.threads)
    per: dict[str, list[float]] = {"engine": [], "server": [], "server stream": []}
    inside: dict[str, list[float]] = {"server": [], "server stream": []}
    with eng, httpx.Client(timeout=httpx.Timeout(120, connect=10)) as http:
        eng.complete("Hello", max_tokens=8)

        def engine_run(p: str) -> Result:
            t0 = time.perf_counter()
            for _ in eng.chat_stream([{"role": "user", "content": p}], **gen):
                pass
            return Result(
                -1, False, -1, 200, "", eng.last_stats.generated, time.perf_counter() - t0
            )

        def server_run(p: str, stream: bool) -> Result:
            r = request(
                http, url, chat_body(p, args.max_tokens, stream, n_draft=0), Result(-1, stream, -1)
            )
            if r.status != 200 or r.error or not r.engine_s:
                raise SystemExit(f"overhead request failed: {r.status} {r.error}")
            return r

        runs = [
            ("engine", engine_run),
            ("server", lambda p: server_run(p, False)),
            ("server stream", lambda p: server_run(p, True)),
        ]
        for rnd in range(args.rounds):
            for i, p in enumerate(prompts):
                deadline.check("the overhead measurement")
                shift = (rnd + i) % len(runs)
                for name, fn in runs[shift:] + runs[:shift]:
                    r = fn(p)
                    per[name].append(r.latency / max(1, r.tokens))
                    if name in inside:
                        inside[name].append(r.latency / r.engine_s)
    med = {k: statistics.median(v) for k, v in per.items()}
    print(
        f"\noverhead: {len(prompts)} prompts x {args.rounds} rounds, plain decoding, "
        f"{args.max_tokens} tokens, wall time per token (request to last byte), medians"
    )
    for k, v in med.items():
        print(f"  {k:14s} {1e3 * v:7.2f} ms/token   ({1 / v:.1f} tokens/s)")
    out = []
    for k in inside:
        paired = statistics.median(s / e for s, e in zip(per[k], per["engine"], strict=True))
        own = statistics.median(inside[k])
        print(
            f"  {k:14s} / Engine.chat_stream in-process: x{paired:.3f} (paired median); "
            f"client wall / its engine's own time: x{own:.3f}"
        )
        out.append(f"{k} x{paired:.3f} (x{own:.3f} over its own engine time)")
    return "; ".join(out)


if __name__ == "__main__":
    sys.exit(main())
