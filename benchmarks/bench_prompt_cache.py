"""Prompt cache benchmark: a multi-turn chat with prefix reuse against the same chat re-reading
its whole history every turn, side by side in one run; then calibration kept on disk.

Part 1: two engines on the same files answer the same conversation turn by turn (interleaved:
turn i with reuse, then turn i after ``reset()``), greedy, so both see the same history. For
each turn it prints the prompt tokens, how many were reused, and the time to first token
(from the call to the first event) of each, with their ratio.

Part 2: two fresh processes with an empty calibration folder each answer one auto turn; the
first times the machine (calibration) before its first token, the second reads the stored
calibration. Both times to first token are printed.

Part 3 ("reopen"): a conversation is answered until its history passes REOPEN_HISTORY tokens
and saved (Engine.save_session); then, in fresh engines as a reopened app has them, the next
turn's time to first token after load_session (the load included) against a fresh engine's
prefill of the whole prompt, the medians of --repeats each, the file's size and whether the
replies match. On SmolLM2 with its drafter (auto), then on Qwen2.5-Coder-1.5B without one when
it is in the real-models folder (it continues SmolLM2's conversation, answering its last turn
itself).

    python benchmarks/bench_prompt_cache.py [--target T.gguf] [-t 2] [-n 200] [--turns 6]
        [--parts conversation,calibration,reopen] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import localspec  # noqa: E402

from helpers.greedy import QUANT_MARGIN, replay_plain_greedy  # noqa: E402
from helpers.realmodels import QWEN25_CODER, real_target_path  # noqa: E402

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


def first_token_time(
    eng: localspec.Engine, msgs: list[dict[str, str]], n: int, **kw: object
) -> tuple:
    """Seconds from the call to the first event, the reply (text, tokens), and the stats."""
    t0 = time.perf_counter()
    events = eng.chat_stream(msgs, max_tokens=n, **kw)
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
    try:
        ties = [replay_plain_greedy(eng, ids, r, margin=QUANT_MARGIN).ties for r in (a, b)]
    except AssertionError as exc:  # not a near-tie, or more of them than the tests allow
        return f"not within the tests' near-tie rule: {str(exc).splitlines()[0]}"
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


REOPEN_HISTORY = 1500  # tokens of history a reopened conversation carries
REOPEN_REPLY = 64  # tokens of the measured reply (enough to compare the two replies)


def history(eng: localspec.Engine, n: int, msgs: list[dict[str, str]] | None = None) -> list:
    """Answer TURNS until the history passes REOPEN_HISTORY tokens (or, given msgs, answer
    their last user turn); the messages, with the next turn's question appended."""
    if msgs is None:
        msgs = []
        for turn in TURNS:
            msgs.append({"role": "user", "content": turn})
            msgs.append({"role": "assistant", "content": eng.chat(msgs, max_tokens=n).text})
            if eng.cached_tokens >= REOPEN_HISTORY:
                break
    else:
        msgs = msgs[:-1]
        msgs.append({"role": "assistant", "content": eng.chat(msgs, max_tokens=n).text})
    return [*msgs, {"role": "user", "content": TURNS[(len(msgs) // 2) % len(TURNS)]}]


def reopened_reply(target, draft, opts: dict, path: str, msgs: list, **kw: object) -> tuple:
    """A fresh engine loads the session and answers: (load seconds, seconds to the first
    event from the load on, tokens, stats)."""
    with localspec.load(target, draft, **opts) as eng:
        t0 = time.perf_counter()
        eng.load_session(path)
        t_load = time.perf_counter() - t0
        events = eng.chat_stream(msgs, max_tokens=REOPEN_REPLY, **kw)
        first = next(events)
        t_first = time.perf_counter() - t0
        tokens = first.tokens + [t for ev in events for t in ev.tokens]
        return t_load, t_first, tokens, eng.last_stats


def reopen_one(
    target: str | None, draft: str | bool | None, args: argparse.Namespace, msgs: list | None
) -> list[dict[str, str]]:
    opts = {"n_threads": args.threads, "n_ctx": 4096}
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "chat.session")
        with localspec.load(target, draft, **opts) as first:
            print(f"\ntarget:  {first.target_path}\ndrafter: {first.draft_path}")
            nxt = history(first, args.max_tokens, msgs)
            kept = first.cached_tokens
            t0 = time.perf_counter()
            size = first.save_session(path)
            t_save = time.perf_counter() - t0
            # the saving engine goes on (the prompt cache within one process), plainly: auto's
            # choices follow the clock, so only plain replies can be compared exactly
            t_warm, (_, plain_on), _ = first_token_time(first, nxt, REOPEN_REPLY, n_draft=0)
        rows = []
        for _ in range(args.repeats):
            t_load, t_reopen, got, st = reopened_reply(target, draft, opts, path, nxt)
            with localspec.load(target, draft, **opts) as fresh:
                t_full, (_, want), st_full = first_token_time(fresh, nxt, REOPEN_REPLY)
                same = "yes" if got == want else "no: " + why_different(fresh, nxt, got, want)
            assert st_full.cached_tokens == 0
            rows.append((t_load, t_reopen, t_full, same))
        plain = reopened_reply(target, draft, opts, path, nxt, n_draft=0)[2]
        med = [statistics.median(r[i] for r in rows) for i in range(3)]
        print(
            f"  history {kept} tokens, next prompt {st.prompt_tokens} tokens, reused "
            f"{st.cached_tokens}; session file {size / 2**20:.1f} MiB ({size / kept / 1024:.1f} "
            f"KiB per token), saved in {t_save:.3f}s"
        )
        print(
            f"  medians of {len(rows)}: load_session {med[0]:.3f}s; time to first token "
            f"reopened {med[1]:.3f}s (load included), full prefill {med[2]:.3f}s, "
            f"ratio {med[1] / med[2]:.2f}; the saving engine going on (plain): {t_warm:.3f}s"
        )
        for i, (t_load, t_reopen, t_full, same) in enumerate(rows, 1):
            print(
                f"    repeat {i}: load {t_load:.3f}s, TTFT reopened {t_reopen:.3f}s, "
                f"full {t_full:.3f}s, same reply as the fresh engine: {same}"
            )
        print(f"  a plain reply after the load equals the saving engine's: {plain == plain_on}")
    return nxt


def reopen(args: argparse.Namespace) -> None:
    print("\nreopening a saved conversation (fresh engines, greedy, the engine's default mode):")
    msgs = reopen_one(args.target, None, args, None)
    qwen = real_target_path(QWEN25_CODER)
    if qwen and not args.target:
        reopen_one(qwen, False, args, msgs[:-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target GGUF (default: SmolLM2 with its shipped drafter)")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--max-tokens", "-n", type=int, default=200, help="tokens per reply")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--parts", default="conversation,calibration,reopen")
    ap.add_argument("--repeats", type=int, default=3, help="reopen: measurements per model")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if "conversation" in parts:
        conversation(args)
    if "calibration" in parts:
        calibration(args)
    if "reopen" in parts:
        reopen(args)


if __name__ == "__main__":
    main()
