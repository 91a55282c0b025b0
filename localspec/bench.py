"""`localspec bench`: plain decoding and speculation at several k, side by side in one run.

Every prompt is answered once per setting, the settings in a rotated order per prompt, so slow
drifts of a shared machine hit all of them alike. Speed is decoding speed (prompt processing
excluded); speedups are ratios to plain decoding measured in the same run. Greedy runs also
check that every setting produced exactly the plain tokens. Given several drafters, every
speculative setting runs once per drafter on the same loaded target (Engine.use_drafter).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import json
import multiprocessing
import os
import platform
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import native as N
from .auto.verdict import inconsistencies
from .datasets import (
    Message,
    humaneval_instruction,
    humaneval_prompts,
    jsonl_prompts,
    load_conversations,
    mtbench_questions,
    prompt_records,
    sharegpt_path,
)
from .errors import InvalidParameterError, LocalspecError
from .lowlevel import verify_curve as verify_curve  # bench prints it; lowlevel owns it
from .stats import Stats

NAMED_SETS = ("mtbench", "humaneval", "long", "short", "copy", "copy-wide")
# "long"/"short": the same final ShareGPT questions, asked after their whole conversation
# (1-3k tokens of history) or alone, from the end of the file (not what `train` used first)
LONG_CHARS = (4000, 12000)
# "copy": requests whose good answer copies most of the context (a whole edited file, a
# proofread text, reshaped JSON, an earlier answer repeated with one change), written for
# localspec and shipped in the package: where drafting from the context itself pays
COPY_SET = "copy_heavy.jsonl"
# "copy-wide": copy-heavy requests of every reply length (50-300 tokens), edits that change more
# (a rewrite to async/await, a tone change, CSV to JSON) and two-turn edits whose second turn
# edits the model's own first answer; written for issue 48 and committed before its first timing
COPY_WIDE_SET = "copy_wide.jsonl"


@dataclass
class BenchPrompt:
    id: str
    turns: list[str]  # user turns, each answered and measured
    history: list[Message] = field(default_factory=list)  # earlier messages (not measured)


@functools.lru_cache(maxsize=2)
def _long_short(limit: int) -> tuple[list[BenchPrompt], list[BenchPrompt]]:
    convs = list(load_conversations(sharegpt_path()))
    long, short = [], []
    for i in range(len(convs) - 1, -1, -1):
        msgs = convs[i]
        last = max((j for j, m in enumerate(msgs) if m["role"] == "user"), default=0)
        history = msgs[:last]
        size = sum(len(m["content"]) for m in history)
        q = msgs[last]["content"] if msgs else ""
        if not (LONG_CHARS[0] <= size <= LONG_CHARS[1]) or not 20 <= len(q) <= 600:
            continue
        long.append(BenchPrompt(f"sharegpt-{i}", [q], history))
        short.append(BenchPrompt(f"sharegpt-{i}", [q]))
        if len(long) >= limit:
            break
    return long, short


def bench_records(text: str, source: str) -> list[BenchPrompt]:
    """JSONL prompt records that may carry an "id" and a "history" of earlier messages (an
    assistant's answer among them) before their "prompt" or "turns"; the history is sent
    through the chat template ahead of the measured turns, never measured itself."""
    return [
        BenchPrompt(pid or f"{source}-{i}", turns, history)
        for i, (pid, turns, history) in enumerate(prompt_records(text, source))
    ]


def copy_prompts(name: str = COPY_SET) -> list[BenchPrompt]:
    """The copy-heavy set (localspec/data/copy_heavy.jsonl): code edits returning the whole
    file (code-*), text fixes (text-*), JSON reshaping (json-*) and chats that ask for an
    earlier answer again with one change (chat-*); or, given COPY_WIDE_SET, the wide one."""
    res = importlib.resources.files("localspec") / "data" / name
    return bench_records(res.read_text(encoding="utf-8"), name)


def load_prompt_set(spec: str, limit: int | None) -> list[BenchPrompt]:
    """A named set (mtbench, humaneval, long, short, copy, copy-wide) or a JSONL file of prompts."""
    if limit is not None and limit < 1:
        raise InvalidParameterError("--limit must be >= 1")
    if spec == "mtbench":
        out = [BenchPrompt(f"mtbench-{i}", t) for i, t in enumerate(mtbench_questions())]
    elif spec == "humaneval":
        out = [
            BenchPrompt(f"humaneval-{i}", [humaneval_instruction(p)])
            for i, p in enumerate(humaneval_prompts())
        ]
    elif spec in ("long", "short"):
        long, short = _long_short(limit or 16)
        out = list(long if spec == "long" else short)
    elif spec == "copy":
        out = copy_prompts()
    elif spec == "copy-wide":
        out = copy_prompts(COPY_WIDE_SET)
    elif os.path.exists(spec) or os.path.dirname(spec) or os.path.splitext(spec)[1]:
        # a path (a folder or an extension such as .jsonl): jsonl_prompts says what is wrong
        out = [
            BenchPrompt(f"{os.path.basename(spec)}-{i}", t)
            for i, t in enumerate(jsonl_prompts(spec))
        ]
    else:
        raise LocalspecError(
            f"unknown prompt set {spec!r}: the sets are {', '.join(NAMED_SETS)}, "
            "or give a JSONL file of prompts"
        )
    return out[:limit] if limit else out


@dataclass
class SettingResult:
    label: str  # "plain", "auto", "k=3", "tree 4x2/8" (+ " NAME" when drafters are compared)
    gen: dict[str, Any]  # what engine.chat gets to run it (n_draft / tree, draft_source)
    drafter: str | None = None  # the drafter put to work for it (None: whichever is loaded)
    stats: Stats = field(default_factory=Stats)
    prompt_tps: list[float] = field(default_factory=list)
    mismatches: int = 0  # greedy prompts whose tokens differ from plain decoding
    # auto: its explanation at the end of every turn (Verdict.as_dict), to be checked
    explanations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def k(self) -> int | None:
        """The chain length of a fixed-k setting (0: plain), else None."""
        n = self.gen.get("n_draft")
        return n if isinstance(n, int) and "tree" not in self.gen else None

    @property
    def speculative(self) -> bool:
        return self.k != 0

    @property
    def is_auto(self) -> bool:
        return self.gen.get("n_draft") == "auto" and "tree" not in self.gen

    def as_dict(self, plain: SettingResult | None) -> dict[str, Any]:
        st = self.stats
        d: dict[str, Any] = {
            "setting": self.label,
            "k": self.k,
            "tokens_per_s": st.tokens_per_s,
            "tau": st.tau if self.speculative else None,
            "acceptance_at": st.acceptance_at if self.speculative else [],
            "shapes": dict(st.shapes),
            "predicted_tokens_per_s": st.predicted_tokens_per_s or None,
            "predicted_speedup": st.predicted_speedup or None,
            "generated": st.generated,
            "steps": st.steps,
            "drafted": st.drafted,
            "t_target": st.t_target,
            "t_draft": st.t_draft,
            "t_glue": st.t_glue,
            "eagle_positions": st.eagle_positions,
            "draft_native_ms_per_position": st.draft_native_ms,
            "draft_host_ms_per_position": st.draft_host_ms,
            "mismatches": self.mismatches,
            "draft_source": self.gen.get("draft_source"),
            "drafter": self.drafter,
            # per draft source: steps it drafted in, drafted, accepted, tau, acceptance_rate
            "sources": {name: x.as_dict() for name, x in sorted(st.sources.items())},
        }
        d["prompt_tokens_per_s"] = list(self.prompt_tps)  # per (round, prompt), in run order
        if self.explanations:
            d["explanations"] = self.explanations
        if plain is not None:
            d["speedup"] = speedup(self, plain)
            d["speedup_median_prompt"] = median_speedup(self, plain)
        return d


def settings_for(
    ks: Sequence[int],
    trees: Sequence[Any],
    auto: bool,
    source: str = "auto",
    drafters: Sequence[str] = (),
) -> list[SettingResult]:
    """Plain first, then auto, every fixed chain length and every fixed tree shape; the
    speculative settings draft from ``source`` (the engine's draft_source: auto, eagle or
    ngram). With several drafters every speculative setting is there once per drafter, its
    label ending in the drafter's short name (drafter_names); one drafter keeps the plain
    labels."""
    gens: list[tuple[str, dict[str, Any]]] = []
    if auto:
        gens.append(("auto", {"n_draft": "auto", "draft_source": source}))
    gens += [(f"k={k}", {"n_draft": k, "draft_source": source}) for k in ks]
    gens += [(str(t), {"tree": t, "draft_source": source}) for t in trees]
    out = [SettingResult("plain", {"n_draft": 0, "draft_source": "none"})]
    if len(drafters) <= 1:
        only = drafters[0] if drafters else None
        return out + [SettingResult(label, gen, only) for label, gen in gens]
    names = drafter_names(drafters)
    for label, gen in gens:
        out += [
            SettingResult(f"{label} {n}", dict(gen), d)
            for n, d in zip(names, drafters, strict=True)
        ]
    return out


def drafter_names(paths: Sequence[str]) -> list[str]:
    """Short names for drafter files: the file name without .gguf (and .eagle3, which the
    default NAME.eagle3.gguf gives every drafter), with as many parent folders as it takes to
    tell equal names apart (a numbered suffix where even that cannot)."""
    parts = [os.path.normpath(p).split(os.sep) for p in paths]
    parts = [[*p[:-1], p[-1].removesuffix(".gguf").removesuffix(".eagle3")] for p in parts]
    names = [p[-1] for p in parts]
    depth = 1
    while len(set(names)) < len(names) and depth < max(len(p) for p in parts):
        depth += 1
        seen = {n: names.count(n) for n in names}
        names = [
            "/".join(p[-depth:]) if seen[n] > 1 else n for n, p in zip(names, parts, strict=True)
        ]
    if len(set(names)) < len(names):  # x.gguf and x.eagle3.gguf in one folder
        names = [f"{n}#{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]
    return names


def speedup(r: SettingResult, plain: SettingResult) -> float:
    p = plain.stats.tokens_per_s
    return r.stats.tokens_per_s / p if p > 0 else 0.0


def median_speedup(r: SettingResult, plain: SettingResult) -> float:
    """The median over prompts of each prompt's own speed ratio (robust to one odd prompt)."""
    return statistics.median(
        a / b for a, b in zip(r.prompt_tps, plain.prompt_tps, strict=True) if b > 0
    )


@dataclass
class SetResult:
    name: str
    n_prompts: int
    settings: list[SettingResult]
    rounds: int = 1  # each prompt was answered this many times per setting

    @property
    def plain(self) -> SettingResult:
        return self.settings[0]

    def best(self) -> SettingResult:
        return max(self.settings, key=lambda r: r.stats.tokens_per_s)

    def best_fixed(self, drafter: str | None = None) -> SettingResult:
        """The fastest fixed setting (plain included): what a hand-tuned user would pick;
        with a drafter, among that drafter's settings (auto's baseline when drafters are
        compared)."""
        fixed = [
            s
            for s in self.settings
            if not s.is_auto and (drafter is None or s.drafter in (None, drafter))
        ]
        return max(fixed, key=lambda r: r.stats.tokens_per_s)

    def autos(self) -> list[SettingResult]:
        """The auto settings (one per drafter compared)."""
        return [s for s in self.settings if s.is_auto]


def run_set(
    engine: Any,
    name: str,
    prompts: Sequence[BenchPrompt],
    settings: Sequence[SettingResult],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    rounds: int = 1,
) -> SetResult:
    """Answer every prompt (all its turns) with each setting, in rotated order per prompt;
    settings[0] must be plain decoding (the reference for speed and greedy output). Each
    setting's conversation starts from an empty cache and reuses it across its own turns; a
    setting with a drafter of its own puts it to work first (engine.use_drafter). rounds:
    the whole set is answered that many times, each round's order rotated once more, so
    every setting runs at every place of the order."""
    settings = list(settings)
    greedy = temperature == 0.0
    total = len(prompts) * len(settings) * rounds
    done = 0
    runs = [(r, i, p) for r in range(rounds) for i, p in enumerate(prompts)]
    for r, i, p in runs:
        at = (i + r) % len(settings)
        order = settings[at:] + settings[:at]
        outputs: dict[str, list[list[int]]] = {}
        for s in order:
            if s.drafter is not None:
                engine.use_drafter(s.drafter)  # nothing to do when it is already at work
            engine.reset()  # every setting starts cold; later turns reuse their own cache
            msgs = list(p.history)
            st = Stats()
            toks: list[list[int]] = []
            for turn in p.turns:
                msgs.append({"role": "user", "content": turn})
                text: list[str] = []
                tt: list[int] = []
                for ev in engine.chat_stream(
                    msgs, max_tokens=max_tokens, temperature=temperature, seed=seed, **s.gen
                ):
                    text.append(ev.text)
                    tt += ev.tokens
                msgs.append({"role": "assistant", "content": "".join(text)})
                st.add(engine.last_stats)
                if engine.last_stats.auto is not None:
                    s.explanations.append(engine.last_stats.auto.as_dict())
                toks.append(tt)
            s.stats.add(st)
            s.prompt_tps.append(st.tokens_per_s)
            outputs[s.label] = toks
            done += 1
            if progress is not None:
                progress(done, total)
        if greedy:
            for s in settings[1:]:
                s.mismatches += int(outputs[s.label] != outputs[settings[0].label])
    return SetResult(name, len(prompts), settings, rounds)


# --- reporting ----------------------------------------------------------------------------------


def format_table(res: SetResult, max_tokens: int, temperature: float) -> str:
    turns = (
        "greedy (bench's default: measurements are reproducible; --temperature samples)"
        if temperature == 0
        else f"sampler: temperature {temperature}, no other sampler"
    )
    source = next((s.gen["draft_source"] for s in res.settings[1:] if "draft_source" in s.gen), "")
    drafts = f", draft source {source}" if source else ""
    w = max(15, *(len(s.label) for s in res.settings))  # labels name compared drafters
    lines = [
        f"{res.name}: {res.n_prompts} prompts"
        + (f" x {res.rounds} rounds" if res.rounds > 1 else "")
        + f", up to {max_tokens} tokens per turn, {turns}{drafts}",
        f"{'setting':>{w}} {'tok/s':>8} {'speedup':>8} {'median':>7} {'tau':>5} "
        f"{'draft ms/pos':>12} {'host/pos':>8}  "
        "acceptance by position | shapes run (auto: its expected speedup)",
    ]
    plain = res.plain
    for s in res.settings:
        st = s.stats
        acc = " ".join(f"{a:.0%}" for a in st.acceptance_at[:8]) if s.speculative else ""
        tau = f"{st.tau:5.2f}" if s.speculative else "    -"
        # per EAGLE draft position: the drafter's native calls, and the host time around them
        per_pos = (
            f"{st.draft_native_ms + st.draft_host_ms:12.3f} {st.draft_host_ms:8.3f}"
            if st.eagle_positions
            else f"{'-':>12} {'-':>8}"
        )
        extra = ""
        if s.is_auto:
            extra = f" | {st.shape_summary()}; expected {st.predicted_speedup:.2f}x plain"
        flag = f"  !! {s.mismatches} prompts differ from plain" if s.mismatches else ""
        lines.append(
            f"{s.label:>{w}} {st.tokens_per_s:8.1f} {speedup(s, plain):7.2f}x "
            f"{median_speedup(s, plain):6.2f}x {tau} {per_pos}  {acc}{extra}{flag}"
        )
        if s.speculative and st.sources:
            lines.append(f"{'':>{w}} {format_sources(st)}")
    best = res.best_fixed()
    line = f"best fixed setting: {best.label} ({speedup(best, plain):.2f}x plain)"
    autos = res.autos()
    for auto in autos:
        # with several drafters, each auto against the best fixed setting of its own drafter
        mine = res.best_fixed(auto.drafter) if len(autos) > 1 else best
        line += (
            f"; {auto.label}: {speedup(auto, plain):.2f}x plain, "
            f"{auto.stats.tokens_per_s / max(mine.stats.tokens_per_s, 1e-9):.2f}x best fixed"
            + (f" ({mine.label})" if mine is not best else "")
        )
    lines.append(line)
    for auto in autos:
        if auto.explanations:
            bad = [x for x in auto.explanations if inconsistencies(x)]
            lines.append(
                f"{auto.label}: {len(auto.explanations)} explanations, "
                + (
                    f"{len(bad)} inconsistent: {inconsistencies(bad[0])}"
                    if bad
                    else "all consistent"
                )
            )
    return "\n".join(lines)


def format_sources(st: Stats) -> str:
    """Per draft source: accepted/drafted, acceptance and tau (per step it drafted in)."""
    return "  ".join(
        f"{name} {x.accepted}/{x.drafted} ({100 * x.acceptance_rate:.0f}%) tau {x.tau:.2f}"
        for name, x in sorted(st.sources.items())
    )


def format_curve(curve: dict[int, float]) -> str:
    one = curve.get(1) or next(iter(curve.values()))
    parts = [f"{n}:{t / one:.2f}" for n, t in curve.items()]
    return f"verify cost t(n)/t(1) for n tokens (t(1) = {1e3 * one:.2f} ms): " + " ".join(parts)


def _spin() -> None:  # pragma: no cover - runs in a child process
    x = 0
    while True:
        x += 1


@contextlib.contextmanager
def busy_load(n: int) -> Iterator[None]:
    """n other processes spinning on the CPU while the block runs (another program competing
    for the cores, as a training run beside the chat would)."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
            p.join(timeout=5)


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_python": N.INSTALLED_LLAMA_CPP_PYTHON,
    }


def write_png(path: str, sets: list[SetResult], curve: dict[int, float]) -> None:
    """Speedup and tau per k for each prompt set (and drafter, where several are compared),
    and the verify-cost curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for res in sets:
        labels = [s.label for s in res.settings]
        a1.plot(labels, [speedup(s, res.plain) for s in res.settings], marker="o", label=res.name)
        chains = [s for s in res.settings if s.k]
        drafters = list(dict.fromkeys(s.drafter for s in chains))
        names = dict(zip(drafters, drafter_names([d or "" for d in drafters]), strict=True))
        for d in drafters:
            mine = [s for s in chains if s.drafter == d]
            a2.plot(
                [s.k + 1 for s in mine if s.k],
                [s.stats.tau for s in mine],
                marker="s",
                linestyle="--",
                label=f"tau, {res.name}" + (f", {names[d]}" if len(drafters) > 1 else ""),
            )
    a1.tick_params(axis="x", labelrotation=45, labelsize=8)
    a1.axhline(1.0, color="grey", linewidth=0.8)
    a1.set_xlabel("setting")
    a1.set_ylabel("speedup over plain decoding")
    a1.set_title("decoding speed")
    a1.legend()
    one = curve.get(1) or next(iter(curve.values()))
    a2.plot(
        list(curve),
        [t / one for t in curve.values()],
        marker="o",
        color="black",
        label="verify cost t(n)/t(1)",
    )
    a2.plot(list(curve), list(curve), color="grey", linewidth=0.8, label="n (no batching gain)")
    a2.set_xlabel("tokens per target decode n = k + 1")
    a2.set_ylabel("tokens / cost ratio")
    a2.set_title("what a step costs vs what it gains")
    a2.legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def report(
    sets: list[SetResult],
    curve: dict[int, float],
    *,
    target: str,
    drafters: Sequence[str],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The run as JSON: "drafters" lists every drafter compared, "drafter" is the one drafter
    (null with none or several; each setting names its own)."""
    return {
        "machine": machine(),
        "target": target,
        "drafter": drafters[0] if len(drafters) == 1 else None,
        "drafters": list(drafters),
        "options": options,
        "verify_curve_s": {str(n): t for n, t in curve.items()},
        "sets": {
            r.name: {
                "prompts": r.n_prompts,
                "rounds": r.rounds,
                "best_fixed": r.best_fixed().label,
                "settings": [s.as_dict(r.plain if s.speculative else None) for s in r.settings],
            }
            for r in sets
        },
    }


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)
