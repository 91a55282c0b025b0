"""Prompt cache benchmark: a multi-turn chat with prefix reuse against the same chat re-reading
its whole history every turn, side by side in one run; then calibration kept on disk.

Part 1: two engines on the same files answer the same conversation turn by turn (interleaved:
turn i with reuse, then turn i after ``reset()``), greedy, so both see the same history. For
each turn it prints the prompt tokens, how many were reused, and the time to first token
(from the call to the first event) of each, with their ratio.

Part 2: two fresh processes with an empty calibration folder each answer one auto turn; the
first times the machine (calibration) before its first token, the second reads the stored
calibration. Both times to first token are printed.

    python benchmarks/bench_prompt_cache.py [--target T.gguf] [-t 2] [-n 200] [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import localspec  # noqa: E402

from greedy import QUANT_MARGIN, replay_plain_greedy  # noqa: E402

# a conversation whose history passes 1k tokens by the last turn (with ~200-token replies)
TURNS = [
    "I want to plan a week-long trip to Japan in spring. Where should I start?",
    "Which cities would you pick for a first visit, and why?",
    "How should I split the seven days between them?",
    "What should I eat in each city? Give me a few dishes.",
    "How do I get between the cities, and is the rail pass worth it?",
    "What etiquette mistakes should a first-time visitor avoid?",
    "Can you summarise the whole plan in a short checklist?",
    "Finally, what should I pack for the weather in April?",
]


def first_token_time(eng: localspec.Engine, msgs: list[dict[str, str]], n: int) -> tuple:
    """Seconds from the call to the first event, the reply (text, tokens), and the stats."""
    t0 = time.perf_counter()
    events = eng.chat_stream(msgs, max_tokens=n)
    first = next(events)
    ttft = time.perf_counter() - t0
    rest = list(events)
    text = first.text + "".join(ev.text for ev in rest)
    tokens = first.tokens + [t for ev in rest for t in ev.tokens]
    return ttft, (text, tokens), eng.last_stats


def why_different(eng: localspec.Engine, msgs: list[dict[str, str]], a: list, b: list) -> str:
    """Replay plain greedy decoding over both replies: where they part, a near-tie of the
    target's own logits, or not (then the cache is wrong)."""
    prompt, _ = eng.format_chat(msgs)
    ids = eng.tokenize(prompt, add_special=False, parse_special=True)
    ties = [replay_plain_greedy(eng, ids, r, margin=QUANT_MARGIN).ties for r in (a, b)]
    first = min((t for tt in ties for t in tt), default=None)
    return "near-tie" if first is None else f"near-tie at token {first[0]} ({first[1]:.3f})"


def conversation(args: argparse.Namespace) -> None:
    opts = {"n_threads": args.threads, "n_ctx": 4096}
    with (
        localspec.load(args.target, **opts) as reuse,
        localspec.load(args.target, **opts) as cold,
    ):
        print(f"target:  {reuse.target_path}\ndrafter: {reuse.draft_path}")
        for eng in (reuse, cold):  # calibrate auto and warm up before timing anything
            eng.complete("Hello", max_tokens=4)
            eng.reset()
        msgs_r: list[dict[str, str]] = []
        msgs_c: list[dict[str, str]] = []
        print(
            f"\n{'turn':>4} {'prompt':>7} {'reused':>7} {'TTFT reuse':>11} "
            f"{'TTFT reset':>11} {'ratio':>6}  same reply"
        )
        for i, turn in enumerate(TURNS[: args.turns], 1):
            msgs_r.append({"role": "user", "content": turn})
            msgs_c.append({"role": "user", "content": turn})
            t_r, (text_r, toks_r), st_r = first_token_time(reuse, msgs_r, args.max_tokens)
            cold.reset()
            t_c, (text_c, toks_c), st_c = first_token_time(cold, msgs_c, args.max_tokens)
            same = "yes" if toks_r == toks_c else "-" if msgs_r != msgs_c else ""
            if not same:  # same prompt, different reply: where, and why
                same = "no: " + why_different(cold, msgs_c, toks_r, toks_c)
            msgs_r.append({"role": "assistant", "content": text_r})
            msgs_c.append({"role": "assistant", "content": text_c})
            print(
                f"{i:>4} {st_r.prompt_tokens:>7} {st_r.cached_tokens:>7} "
                f"{t_r:>10.3f}s {t_c:>10.3f}s {t_r / t_c:>6.2f}  {same}"
            )


CHILD = """
import json, sys, time, localspec
t0 = time.perf_counter()
eng = localspec.load(sys.argv[1] or None, n_threads=int(sys.argv[2]))
t_load = time.perf_counter() - t0
t0 = time.perf_counter()
events = eng.chat_stream([{"role": "user", "content": "Say hello."}], max_tokens=16)
next(events)
ttft = time.perf_counter() - t0
events.close()
print(json.dumps({"load": t_load, "ttft": ttft, "calibrate": eng.last_stats.t_calibrate}))
"""


def calibration(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "LOCALSPEC_CACHE_DIR": cache}
        print("\ncalibration kept on disk (two fresh processes, empty cache folder at first):")
        for name in ("first process", "second process"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, args.target or "", str(args.threads)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"  {name:<15} time to first token {r['ttft']:.3f}s "
                f"(of which calibration {r['calibrate']:.3f}s; model load {r['load']:.2f}s)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target GGUF (default: SmolLM2 with its shipped drafter)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--max-tokens", "-n", type=int, default=200, help="tokens per reply")
    ap.add_argument("--turns", type=int, default=8)
    args = ap.parse_args()
    conversation(args)
    calibration(args)


if __name__ == "__main__":
    main()
