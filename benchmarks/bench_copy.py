"""Drafter-free speculation on copy-heavy replies: localspec against llama.cpp's own peers.

Answers every prompt of the copy-heavy set (`localspec bench --prompts copy`: whole edited
files, proofread texts, reshaped JSON, an earlier answer repeated with one change) greedily with
one target GGUF under each setting, interleaved per prompt and round (the settings in a rotated
order), each formatted with the target's own chat template:

- localspec `plain` (n_draft=0, on an engine loaded with draft_source="none"), `auto`
  (draft_source="auto": the cost model picks plain decoding, n-gram drafts from the context or
  the EAGLE drafter each step), `ngram` (n-gram drafts only) and, with --draft, `eagle` (the
  EAGLE drafter only);
- llama-cpp-python's prompt-lookup decoding (`llama_cpp.Llama(draft_model=
  LlamaPromptLookupDecoding(...))`, `create_chat_completion`) and the same Llama without a
  draft model as that peer's own plain baseline;
- with --llama-server PATH, llama.cpp's server with `--spec-type ngram-mod` (or each --spec,
  one server apiece: a spec type and its own arguments) and a server without speculation as
  their baseline (`timings` of each response).

For every run it records decoding speed (generated tokens / decoding seconds, prompt processing
excluded) and end-to-end speed (generated tokens / the whole call), then prints per setting the
median of both, the ratio to localspec's plain decoding (and, for the peers, to their own plain
baseline), for localspec settings the drafted/accepted tokens and tau per draft source, and how
many greedy replies differ from plain decoding's (tokens for localspec settings, text for the
peers). Then the aggregate end to end (all tokens over all seconds) of every setting against
localspec plain and against the best llama-server n-gram setting, each request's end-to-end ratio
of auto to plain (the lowest named), and the machine: its CPU and what verifying 16 tokens costs
there against one (localspec's own verify curve, taps off). --json writes every run.

    python benchmarks/bench_copy.py [--target T.gguf] [--draft D.gguf] [--prompts copy]
        [--max-tokens 256] [--rounds 2] [--limit N] [--threads 2]
        [--llama-server /path/to/llama-server [--spec "ngram-mod" --spec "ngram-simple
        --spec-draft-n-max 16" ...] [--server-args "..."]] [--json OUT.json]

The default target is Qwen2.5-Coder-1.5B-Instruct Q4_K_M (scripts/get-real-targets.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import localspec  # noqa: E402
from localspec import native as N  # noqa: E402
from localspec.bench import BenchPrompt, load_prompt_set  # noqa: E402
from localspec.native.hardware import cpu_extra_buffers  # noqa: E402

N_CTX = 4096
FLASH_ATTN = ["off"]  # --flash-attn, the same for every setting (llama-cpp-python's default)
Messages = list[dict[str, str]]


@dataclass
class Reply:
    """One answered turn."""

    text: str
    generated: int
    decode_s: float  # decoding only (prompt processing excluded)
    e2e_s: float  # the whole call
    tokens: list[int] | None = None  # token ids, where the setting gives them
    sources: dict[str, dict[str, float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """One prompt (all its turns) under one setting in one round."""

    setting: str
    prompt: str
    round: int
    generated: int
    decode_s: float
    e2e_s: float
    texts: list[str]
    tokens: list[list[int]] | None
    sources: dict[str, dict[str, float]]
    extra: list[dict[str, Any]]
    differs: bool | None = None  # from plain decoding (None: not compared)

    @property
    def tok_s(self) -> float:
        return self.generated / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def e2e_tok_s(self) -> float:
        return self.generated / self.e2e_s if self.e2e_s > 0 else 0.0


@dataclass
class Setting:
    name: str
    kind: str  # "localspec", "peer" (llama-cpp-python), "server" (llama-server)
    answer: Callable[[Messages, int], Reply]  # (messages, max_tokens)
    baseline: str = "plain"  # its own plain baseline (peers: their own)
    note: str = ""
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # a peer's calls that raised


# --- localspec ----------------------------------------------------------------------------------


def _sources(stats: Any) -> dict[str, dict[str, float]]:
    out = {}
    for name, s in (getattr(stats, "sources", None) or {}).items():
        if isinstance(s, dict):
            out[name] = {k: float(v) for k, v in s.items() if isinstance(v, int | float)}
        else:  # an object with the same fields
            out[name] = {
                k: float(getattr(s, k))
                for k in ("drafted", "accepted", "steps", "tau")
                if isinstance(getattr(s, k, None), int | float)
            }
    return out


def localspec_answer(eng: Any, gen: dict[str, Any]) -> Callable[[Messages, int], Reply]:
    def answer(msgs: Messages, max_tokens: int) -> Reply:
        eng.reset()  # cold: the whole prompt is processed, as by every other setting
        t0 = time.perf_counter()
        c = eng.chat(msgs, max_tokens=max_tokens, temperature=0.0, **gen)
        e2e = time.perf_counter() - t0
        st = c.stats
        return Reply(
            c.text,
            st.generated,
            st.t_decode,
            e2e,
            tokens=list(c.tokens),
            sources=_sources(st),
            extra={"prefill_s": st.t_prefill, "calibrate_s": st.t_calibrate, "mode": st.mode},
        )

    return answer


def check_draft_source(eng: Any) -> str:
    """Empty when engine.chat takes draft_source, else why not (the API is being added)."""
    try:
        eng.chat([{"role": "user", "content": "Hi"}], max_tokens=1, draft_source="ngram")
    except TypeError as exc:
        return f"engine.chat does not take draft_source yet ({exc})"
    except localspec.LocalspecError as exc:
        return f"engine.chat refused draft_source='ngram': {exc}"
    return ""


# --- llama-cpp-python's prompt lookup -----------------------------------------------------------


def patch_llama_cpp_params() -> None:
    """llama.cpp's AMX kernels crash on multi-token decodes on some CPUs
    (localspec.native.hardware): give llama-cpp-python's Llama the extra-buffer setting
    localspec uses, as the tests do."""
    import llama_cpp.llama_cpp as C

    if getattr(C.llama_model_default_params, "_bench_copy", False):
        return
    default = C.llama_model_default_params

    def params():  # type: ignore[no-untyped-def]
        p = default()
        p.use_extra_bufts = cpu_extra_buffers()
        return p

    params._bench_copy = True  # type: ignore[attr-defined]
    C.llama_model_default_params = params


def peer_answer(llm: Any) -> Callable[[Messages, int], Reply]:
    """create_chat_completion, timed: decoding starts when the first token is sampled (the
    prompt has been evaluated then)."""
    first: list[float] = []
    sample = llm.sample

    def timed_sample(*args: Any, **kwargs: Any) -> Any:
        if not first:
            first.append(time.perf_counter())
        return sample(*args, **kwargs)

    llm.sample = timed_sample

    def answer(msgs: Messages, max_tokens: int) -> Reply:
        first.clear()
        llm.reset()  # cold, as every localspec setting: no prompt prefix reused
        t0 = time.perf_counter()
        out = llm.create_chat_completion(msgs, max_tokens=max_tokens, temperature=0.0)
        t1 = time.perf_counter()
        n = int(out["usage"]["completion_tokens"])
        start = first[0] if first else t0
        return Reply(
            out["choices"][0]["message"]["content"] or "",
            n,
            t1 - start,
            t1 - t0,
            extra={"prefill_s": start - t0, "finish": out["choices"][0]["finish_reason"]},
        )

    return answer


# --- llama-server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, cmd: list[str], port: int, log: str, spec: str) -> None:
        self.cmd, self.port, self.log, self.spec = cmd, port, log, spec
        self._fh = open(log, "wb")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self._fh, stderr=subprocess.STDOUT)

    def wait(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}/health"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited with {self.proc.returncode}; see {self.log}:\n"
                    + self.tail()
                )
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama-server not healthy after {timeout:.0f} s; see {self.log}")

    def tail(self, n: int = 15) -> str:
        self._fh.flush()
        with open(self.log, "rb") as fh:
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-n:])

    def chat(self, msgs: Messages, max_tokens: int) -> Reply:
        body = json.dumps(
            {
                "messages": msgs,
                "max_tokens": max_tokens,
                "temperature": 0,
                "cache_prompt": False,
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=1800) as r:
                out = json.loads(r.read())
        except (urllib.error.URLError, ConnectionError) as exc:
            alive = self.proc.poll() is None
            raise RuntimeError(
                f"llama-server request failed ({exc}); server "
                f"{'alive' if alive else f'exited with {self.proc.returncode}'}:\n{self.tail()}"
            ) from None
        e2e = time.perf_counter() - t0
        tm = out.get("timings", {})
        n = int(tm.get("predicted_n", out.get("usage", {}).get("completion_tokens", 0)))
        sources = {}
        if "draft_n" in tm:
            sources[self.spec or "draft"] = {
                "drafted": float(tm["draft_n"]),
                "accepted": float(tm.get("draft_n_accepted", 0)),
            }
        return Reply(
            out["choices"][0]["message"].get("content") or "",
            n,
            float(tm.get("predicted_ms", 0.0)) / 1e3,
            e2e,
            sources=sources,
            extra={"timings": tm},
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._fh.close()


def start_server(binary: str, target: str, threads: int, spec: str, extra: str) -> Server:
    """llama-server on a free local port; spec: its --spec-type, or "" for none. Where
    localspec keeps llama.cpp's extra CPU buffers off (AMX CPUs, whose kernels crash on
    multi-token decodes: localspec.native.hardware), the server gets --no-repack, which does
    the same (without it this build segfaults at its first decode on the project's Xeon)."""
    port = free_port()
    cmd = [binary, "-m", target, "-t", str(threads), "-c", str(N_CTX), "-np", "1", "--jinja"]
    cmd += ["-fa", FLASH_ATTN[0]]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    if spec:
        cmd += ["--spec-type", spec]
    if not cpu_extra_buffers():
        cmd.append("--no-repack")
    cmd += shlex.split(extra)
    log = tempfile.mkstemp(prefix="bench_copy_server_", suffix=".log")[1]
    print("llama-server:", shlex.join(cmd), f"(log {log})", flush=True)
    srv = Server(cmd, port, log, spec)
    try:
        srv.wait()
    except BaseException:
        srv.stop()
        raise
    return srv


# --- running ------------------------------------------------------------------------------------


def run_prompt(s: Setting, p: BenchPrompt, rnd: int, max_tokens: int) -> Run:
    """Every user turn of the prompt after its history, each reply fed back for the next."""
    msgs: Messages = list(p.history)
    texts, tokens, extra = [], [], []
    sources: dict[str, dict[str, float]] = {}
    gen = 0
    dec = e2e = 0.0
    all_tokens = True
    for turn in p.turns:
        msgs.append({"role": "user", "content": turn})
        r = s.answer(msgs, max_tokens)
        msgs.append({"role": "assistant", "content": r.text})
        texts.append(r.text)
        gen += r.generated
        dec += r.decode_s
        e2e += r.e2e_s
        extra.append(r.extra)
        if r.tokens is None:
            all_tokens = False
        else:
            tokens.append(r.tokens)
        for name, d in r.sources.items():
            acc = sources.setdefault(name, {})
            for k, v in d.items():
                if k != "tau":
                    acc[k] = acc.get(k, 0.0) + v
    return Run(
        s.name,
        p.id,
        rnd,
        gen,
        dec,
        e2e,
        texts,
        tokens if all_tokens else None,
        sources,
        extra,
    )


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def paired_ratio(runs: list[Run], base: list[Run], e2e: bool = False) -> float:
    """The median over (prompt, round) of this setting's speed over the baseline's."""
    by_key = {(r.prompt, r.round): r for r in base}
    ratios = []
    for r in runs:
        b = by_key.get((r.prompt, r.round))
        if b is None:
            continue
        num, den = (r.e2e_tok_s, b.e2e_tok_s) if e2e else (r.tok_s, b.tok_s)
        if den > 0:
            ratios.append(num / den)
    return median(ratios)


def source_summary(runs: list[Run]) -> dict[str, dict[str, float]]:
    tot: dict[str, dict[str, float]] = {}
    for r in runs:
        for name, d in r.sources.items():
            acc = tot.setdefault(name, {})
            for k, v in d.items():
                acc[k] = acc.get(k, 0.0) + v
    for d in tot.values():
        steps = d.get("steps", 0.0)
        d["tau"] = (d.get("accepted", 0.0) + steps) / steps if steps else 0.0
    return tot


def format_table(settings: list[Setting]) -> str:
    by = {s.name: s for s in settings}
    plain = by["plain"].runs
    lines = [
        f"{'setting':>40} {'tok/s':>7} {'x plain':>7} {'x own':>6} {'e2e t/s':>7} "
        f"{'x plain':>7} {'differ':>6}  per source: drafted/accepted, tau",
    ]
    for s in settings:
        tps = median([r.tok_s for r in s.runs])
        e2e = median([r.e2e_tok_s for r in s.runs])
        own = f"{paired_ratio(s.runs, by[s.baseline].runs):5.2f}x" if s.baseline in by else "    -"
        if s.name == s.baseline or s.kind == "localspec":
            own = "     -"
        compared = [r for r in s.runs if r.differs is not None]
        differ = f"{sum(bool(r.differs) for r in compared)}/{len(compared)}" if compared else "-"
        src = "  ".join(
            f"{name} {d.get('drafted', 0):.0f}/{d.get('accepted', 0):.0f}"
            + (f" tau {d['tau']:.2f}" if d.get("steps") else "")
            for name, d in source_summary(s.runs).items()
        )
        lines.append(
            f"{s.name:>40} {tps:7.1f} {paired_ratio(s.runs, plain):6.2f}x {own:>6} "
            f"{e2e:7.1f} {paired_ratio(s.runs, plain, e2e=True):6.2f}x {differ:>6}  {src}"
        )
    lines.append(
        "tok/s: generated tokens / decoding seconds (prompt processing excluded), median over "
        "runs; x plain: median over prompt and round of the ratio to localspec plain; x own: "
        "to the setting's own plain baseline; e2e: the whole call; differ: greedy replies that "
        "differ from localspec plain (tokens for localspec, text for peers)"
    )
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def machine_info(eng: Any) -> dict[str, Any]:
    """The CPU, and one target decode of 16 tokens against one (median of 5 each, taps off as
    plain decoding runs, after a 64-token context): what a long draft's verify costs here."""
    from localspec.lowlevel import verify_curve

    curve = verify_curve(eng, [1, 16], reps=5, taps=False)
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "verify_s": {str(k): v for k, v in curve.items()},
        "t16_over_t1": curve[16] / curve[1],
    }


def aggregate_summary(settings: list[Setting]) -> dict[str, Any]:
    """All tokens over all seconds per setting (end to end and decoding), each against localspec
    plain and against the best llama-server speculative setting; auto's per-request ratios."""
    by = {s.name: s for s in settings}

    def agg(s: Setting, e2e: bool) -> float:
        secs = sum(r.e2e_s if e2e else r.decode_s for r in s.runs)
        return sum(r.generated for r in s.runs) / secs if secs > 0 else 0.0

    rows: dict[str, dict[str, float]] = {
        s.name: {"e2e_tok_s": agg(s, True), "decode_tok_s": agg(s, False), "runs": len(s.runs)}
        for s in settings
    }
    plain = rows["plain"]
    servers = [s.name for s in settings if s.kind == "server" and s.baseline != s.name]
    best = max(servers, key=lambda n: rows[n]["e2e_tok_s"], default=None)
    for row in rows.values():
        pe, pd = plain["e2e_tok_s"], plain["decode_tok_s"]
        row["e2e_x_plain"] = row["e2e_tok_s"] / pe if pe else 0.0
        row["decode_x_plain"] = row["decode_tok_s"] / pd if pd else 0.0
        if best:
            b = rows[best]
            row["e2e_x_best_server"] = row["e2e_tok_s"] / b["e2e_tok_s"]
            row["decode_x_best_server"] = row["decode_tok_s"] / b["decode_tok_s"]
    per_request: list[dict[str, Any]] = []
    if "auto" in by:
        base = {(r.prompt, r.round): r for r in by["plain"].runs}
        for r in by["auto"].runs:
            b = base.get((r.prompt, r.round))
            if b is None or b.e2e_tok_s <= 0 or b.tok_s <= 0:
                continue
            per_request.append(
                {
                    "prompt": r.prompt,
                    "round": r.round,
                    "generated": r.generated,
                    "plain_generated": b.generated,
                    "e2e_x_plain": r.e2e_tok_s / b.e2e_tok_s,
                    "decode_x_plain": r.tok_s / b.tok_s,
                }
            )
    return {"settings": rows, "best_server": best, "auto_per_request": per_request}


def format_summary(summary: dict[str, Any], machine: dict[str, Any]) -> str:
    best = summary["best_server"]
    lines = [
        f"machine: {machine['cpu']}, {machine['cores']} cores; verifying 16 tokens costs "
        f"{machine['t16_over_t1']:.2f}x one",
        f"{'aggregate':>40} {'e2e t/s':>8} {'x plain':>7} {'decode':>7} {'x plain':>7}"
        + (f" {'e2e x best server':>17} {'decode x':>8}" if best else ""),
    ]
    for name, row in summary["settings"].items():
        line = (
            f"{name:>40} {row['e2e_tok_s']:8.2f} {row['e2e_x_plain']:6.2f}x "
            f"{row['decode_tok_s']:7.2f} {row['decode_x_plain']:6.2f}x"
        )
        if best:
            line += f" {row['e2e_x_best_server']:16.2f}x {row['decode_x_best_server']:7.2f}x"
        lines.append(line)
    if best:
        lines.append(f"best llama-server n-gram setting (end to end): {best}")
    per = sorted(summary["auto_per_request"], key=lambda d: d["e2e_x_plain"])
    if per:
        below = [d for d in per if d["e2e_x_plain"] < 0.97]
        lines.append(
            f"auto per request, end to end x plain: lowest {per[0]['e2e_x_plain']:.2f} "
            f"({per[0]['prompt']}, {per[0]['generated']} tokens), median "
            f"{median([d['e2e_x_plain'] for d in per]):.2f}, highest {per[-1]['e2e_x_plain']:.2f};"
            f" {len(below)} of {len(per)} below 0.97"
        )
        for d in per:
            lines.append(
                f"  {d['prompt']:>28} r{d['round'] + 1} {d['generated']:4d} tokens  e2e "
                f"{d['e2e_x_plain']:.2f}x  decode {d['decode_x_plain']:.2f}x"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", help="target GGUF (default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M)")
    ap.add_argument("--draft", help="EAGLE drafter GGUF (adds an `eagle` setting)")
    ap.add_argument("--prompts", default="copy", help="prompt set or JSONL file (default copy)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--flash-attn",
        choices=("on", "off", "auto"),
        default="off",
        help="attention kernel for every setting (default off, llama-cpp-python's default; "
        "llama.cpp's auto turns it on for the CPU, 25%% slower here at 350 tokens)",
    )
    ap.add_argument("--lookup-tokens", type=int, default=10, help="prompt lookup: num_pred_tokens")
    ap.add_argument("--lookup-ngram", type=int, default=2, help="prompt lookup: max_ngram_size")
    ap.add_argument("--no-peer", action="store_true", help="skip llama-cpp-python prompt lookup")
    ap.add_argument("--no-ngram", action="store_true", help="skip localspec's n-gram-only setting")
    ap.add_argument("--llama-server", metavar="PATH", help="llama-server binary (adds its rows)")
    ap.add_argument("--spec-type", default="ngram-mod", help="llama-server --spec-type")
    ap.add_argument(
        "--spec",
        action="append",
        default=None,
        help="a llama-server spec setting: its --spec-type and any arguments of its own, e.g. "
        "'ngram-simple --spec-draft-n-max 16'; repeat for several (default: --spec-type)",
    )
    ap.add_argument("--server-args", default="", help="extra llama-server arguments (both)")
    ap.add_argument("--json", metavar="PATH", help="write every run here")
    args = ap.parse_args()
    FLASH_ATTN[0] = args.flash_attn

    target = args.target
    if target is None:
        from helpers import realmodels

        target = realmodels.real_target_path(realmodels.QWEN25_CODER)
        if target is None:
            print(
                "Qwen2.5-Coder-1.5B is not downloaded: run scripts/get-real-targets.py or pass "
                "--target T.gguf",
                file=sys.stderr,
            )
            return 2
    prompts = load_prompt_set(args.prompts, args.limit)
    T, n = args.threads, args.max_tokens
    settings: list[Setting] = []
    closers: list[Callable[[], None]] = []
    notes: list[str] = []
    try:
        fa_opt = {"flash_attn": FLASH_ATTN[0]}
        # plain decoding as a user who asks for it runs it: an engine loaded for it (a hybrid
        # target keeps no snapshots of its recurrent state there, which cost every decode)
        plain_eng = localspec.load(
            target, draft=False, draft_source="none", n_ctx=N_CTX, n_threads=T, **fa_opt
        )
        closers.append(plain_eng.close)
        settings.append(Setting("plain", "localspec", localspec_answer(plain_eng, {"n_draft": 0})))
        spec_eng = localspec.load(
            target, draft=args.draft or False, n_ctx=N_CTX, n_threads=T, **fa_opt
        )
        closers.append(spec_eng.close)
        why = check_draft_source(spec_eng)
        if why:
            notes.append(f"localspec auto/ngram/eagle settings skipped: {why}")
            print(f"!! {notes[-1]}", file=sys.stderr)
        else:
            sources = ["auto"] + ([] if args.no_ngram else ["ngram"])
            sources += ["eagle"] if args.draft else []
            for src in sources:
                gen = {"draft_source": src}
                settings.append(Setting(src, "localspec", localspec_answer(spec_eng, gen)))

        if not args.no_peer:
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            patch_llama_cpp_params()
            fa = {"on": True, "off": False}.get(FLASH_ATTN[0])
            common = {"model_path": target, "n_ctx": N_CTX, "n_threads": T, "verbose": False}
            if fa is not None:
                common["flash_attn"] = fa
            peer_plain = llama_cpp.Llama(**common)
            closers.append(peer_plain.close)
            lookup = LlamaPromptLookupDecoding(
                max_ngram_size=args.lookup_ngram, num_pred_tokens=args.lookup_tokens
            )
            # logits_all: with a draft model llama-cpp-python stores every row's logits, and
            # its default buffer of n_batch rows overflows past 512 tokens (a ValueError)
            peer_lookup = llama_cpp.Llama(**common, draft_model=lookup, logits_all=True)
            closers.append(peer_lookup.close)
            settings.append(
                Setting(
                    "llama-cpp-python plain",
                    "peer",
                    peer_answer(peer_plain),
                    baseline="llama-cpp-python plain",
                )
            )
            settings.append(
                Setting(
                    "prompt-lookup",
                    "peer",
                    peer_answer(peer_lookup),
                    baseline="llama-cpp-python plain",
                    note=f"LlamaPromptLookupDecoding(max_ngram_size={args.lookup_ngram}, "
                    f"num_pred_tokens={args.lookup_tokens})",
                )
            )

        if args.llama_server:
            srv_plain = start_server(args.llama_server, target, T, "", args.server_args)
            closers.append(srv_plain.stop)
            settings.append(
                Setting(
                    "llama-server plain",
                    "server",
                    srv_plain.chat,
                    baseline="llama-server plain",
                    note=shlex.join(srv_plain.cmd),
                )
            )
            for spec in args.spec or [args.spec_type]:
                kind, *own = shlex.split(spec)
                extra = " ".join([args.server_args, shlex.join(own)]).strip()
                srv_spec = start_server(args.llama_server, target, T, kind, extra)
                closers.append(srv_spec.stop)
                settings.append(
                    Setting(
                        f"llama-server {spec}",
                        "server",
                        srv_spec.chat,
                        baseline="llama-server plain",
                        note=shlex.join(srv_spec.cmd),
                    )
                )

        print(
            f"target {target}; llama-cpp-python {N.INSTALLED_LLAMA_CPP_PYTHON}, {T} threads, "
            f"{len(prompts)} prompts ({args.prompts}) x {args.rounds} rounds, up to {n} tokens, "
            f"greedy; settings: {', '.join(s.name for s in settings)}",
            flush=True,
        )
        machine = machine_info(plain_eng)
        print(
            f"CPU {machine['cpu']}; verifying 16 tokens costs {machine['t16_over_t1']:.2f}x one "
            "(localspec's verify curve, taps off)",
            flush=True,
        )
        # warm-up (auto's first call may time the machine): one short reply per setting
        warm = [{"role": "user", "content": prompts[0].turns[0]}]
        for s in settings:
            s.answer(warm, min(n, 16))

        for rnd in range(args.rounds):
            for i, p in enumerate(prompts):
                j = (rnd * len(prompts) + i) % len(settings)
                order = settings[j:] + settings[:j]
                runs = {}
                for s in order:
                    try:
                        r = run_prompt(s, p, rnd, n)
                    except Exception as exc:  # a peer's own bug: reported, not fatal
                        if s.kind == "localspec":
                            raise
                        s.failures.append(f"{p.id}: {type(exc).__name__}: {exc}")
                        continue
                    s.runs.append(r)
                    runs[s.name] = r
                base = runs["plain"]
                for s in settings[1:]:
                    if s.name not in runs:
                        continue
                    r = runs[s.name]
                    if r.tokens is not None and base.tokens is not None:
                        r.differs = r.tokens != base.tokens
                    else:
                        r.differs = [t.strip() for t in r.texts] != [t.strip() for t in base.texts]
                print(
                    f"round {rnd + 1} {p.id}: "
                    + ", ".join(
                        f"{s.name} {runs[s.name].tok_s:.1f}" + ("*" if runs[s.name].differs else "")
                        if s.name in runs
                        else f"{s.name} FAILED"
                        for s in settings
                    )
                    + " tok/s",
                    flush=True,
                )
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception as exc:  # noqa: BLE001  (report, keep closing the rest)
                print(f"closing: {exc}", file=sys.stderr)

    print()
    print(format_table(settings))
    print()
    summary = aggregate_summary(settings)
    print(format_summary(summary, machine))
    for s in settings:
        if s.note:
            print(f"{s.name}: {s.note}")
        for f in s.failures:
            print(f"{s.name} failed on {f}")
    for note in notes:
        print(note)
    if args.json:
        data = {
            "target": target,
            "draft": args.draft,
            "options": {
                k: getattr(args, k)
                for k in ("prompts", "max_tokens", "rounds", "limit", "threads", "flash_attn")
                + ("lookup_tokens", "lookup_ngram", "llama_server", "spec_type", "spec")
                + ("server_args",)
            },
            "llama_cpp_python": N.INSTALLED_LLAMA_CPP_PYTHON,
            "cpu_extra_buffers": cpu_extra_buffers(),
            "machine": machine,
            "summary": summary,
            "notes": notes,
            "settings": {
                s.name: {
                    "kind": s.kind,
                    "baseline": s.baseline,
                    "note": s.note,
                    "failures": s.failures,
                    "median_tok_s": median([r.tok_s for r in s.runs]),
                    "median_e2e_tok_s": median([r.e2e_tok_s for r in s.runs]),
                    "x_plain": paired_ratio(s.runs, settings[0].runs),
                    "sources": source_summary(s.runs),
                    "runs": [
                        {**asdict(r), "tok_s": r.tok_s, "e2e_tok_s": r.e2e_tok_s} for r in s.runs
                    ],
                }
                for s in settings
            },
        }
        tmp = args.json + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
