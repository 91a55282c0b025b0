"""The CLI, the chat app and the server are thin layers over the documented Python API: they
import none of the engine's insides and touch no private or unlisted attribute of an engine."""

from __future__ import annotations

import ast
import glob
import inspect
import os

import pytest

from localspec.engine import Engine

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FRONT_ENDS = sorted(
    [
        *glob.glob(os.path.join(ROOT, "localspec", "cli", "*.py")),
        *glob.glob(os.path.join(ROOT, "localspec", "server", "*.py")),
        *glob.glob(os.path.join(ROOT, "tui", "**", "*.py"), recursive=True),
    ]
)
# the engine's insides: what the scripting API wraps (benchmarks and tools reach them through
# localspec.lowlevel): whole subpackages, and the inner modules of the rooms front-ends may use
INTERNAL = (
    "localspec.lowlevel",
    "localspec.native",
    "localspec.runtime",
    "localspec.speculation",
    "localspec.auto",
    "localspec.text.textstream",
    "localspec.text.chat_template",
    "localspec.files.ggufdata",
    "localspec._native",  # the paths before the subpackages
    "localspec.scheduler",
    "localspec.generation",
)


def internal(mod: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in INTERNAL)


# names under which the front-ends hold an engine
ENGINE_NAMES = {"eng", "engine", "_eng", "_engine", "_loaded"}


def engine_api() -> set[str]:
    """Engine's public methods and properties, and the public attributes __init__ sets."""
    names = {n for n, _ in inspect.getmembers(Engine) if not n.startswith("_")}
    init = ast.parse(inspect.getsource(Engine))
    for node in ast.walk(init):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
            and not node.attr.startswith("_")
        ):
            names.add(node.attr)
    return names


def module_of(node: ast.ImportFrom, path: str) -> str:
    """The absolute module an import names, inside localspec (tui is localspec.tui)."""
    if node.level == 0:
        return node.module or ""
    rel = os.path.relpath(os.path.dirname(path), ROOT).split(os.sep)
    if rel[0] == "tui":
        rel = ["localspec", *rel]
    base = rel[: len(rel) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def held_engine(node: ast.Attribute) -> bool:
    v = node.value
    if isinstance(v, ast.Name):
        return v.id in ENGINE_NAMES
    return isinstance(v, ast.Attribute) and v.attr in ENGINE_NAMES


@pytest.mark.parametrize("path", FRONT_ENDS, ids=lambda p: os.path.relpath(p, ROOT))
def test_front_end_uses_only_the_public_api(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    public = engine_api()
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = module_of(node, path)
            if internal(mod):
                problems.append(f"line {node.lineno}: imports {mod}")
            else:  # a module taken from its package: from localspec.text import textstream
                problems += [
                    f"line {node.lineno}: imports {mod}.{a.name}"
                    for a in node.names
                    if internal(f"{mod}.{a.name}")
                ]
        elif isinstance(node, ast.Import):
            problems += [
                f"line {node.lineno}: imports {a.name}" for a in node.names if internal(a.name)
            ]
        elif isinstance(node, ast.Attribute):
            owner = node.value
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if private and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                problems.append(f"line {node.lineno}: private attribute .{node.attr}")
            if held_engine(node) and node.attr not in public:
                problems.append(f"line {node.lineno}: engine attribute .{node.attr} is not public")
    assert not problems, f"{os.path.relpath(path, ROOT)}:\n" + "\n".join(problems)


def test_the_check_sees_what_it_must_refuse(tmp_path) -> None:
    """The checks above catch each kind of reach past the API (so a pass means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from localspec.lowlevel import parts\n"
        "from localspec.native import Batch\n"
        "from localspec.speculation import generation\n"
        "import localspec.auto.scheduler\n"
        "from localspec.text import chat_template\n"
        "def f(eng, self):\n"
        "    eng.target.clear()\n"
        "    self.engine._drafter\n"
        "    other._private\n"
        "    eng.complete('x')\n"
    )
    with pytest.raises(AssertionError) as err:
        test_front_end_uses_only_the_public_api(str(bad))
    msg = str(err.value)
    for want in (
        "imports localspec.lowlevel",
        "imports localspec.native",
        "imports localspec.auto.scheduler",
        "imports localspec.speculation",
        "imports localspec.text.chat_template",
        "engine attribute .target",
        "private attribute ._drafter",
        "private attribute ._private",
    ):
        assert want in msg
    assert ".complete" not in msg


def test_the_engines_parts_are_private() -> None:
    api = engine_api()
    assert {"target", "drafter", "scheduler", "rt"}.isdisjoint(api)
    assert {"complete", "complete_stream", "chat", "chat_stream", "stats"} <= api


def test_lowlevel_hold_supersedes_empties_both_caches_and_restores_the_taps(agree) -> None:
    """The verify-cost curve once cleared the target without restarting the drafter and left
    the taps switched: holding the parts leaves the engine as a fresh call expects it."""
    import localspec
    from localspec.errors import GenerationError
    from localspec.lowlevel import hold, parts, verify_curve

    from conftest import EXACT

    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        running = eng.complete_stream("abcdefgh", max_tokens=50, n_draft=3)
        next(running)  # a generation with both caches filled
        p = parts(eng)
        assert p.target.n > 0 and p.drafter.next_pos > 0 and p.target.taps_active
        curve = verify_curve(eng, [1, 2, 4], reps=1, taps=False)
        assert sorted(curve) == [1, 2, 4] and all(t > 0 for t in curve.values())
        assert p.target.n == 0 and p.drafter.start == 0 and p.drafter.next_pos == 0
        assert p.target.taps_active  # as it was before the curve switched them off
        with pytest.raises(GenerationError, match="superseded"):
            next(running)
        with hold(eng) as held:
            held.target.set_taps_active(False)
        assert p.target.taps_active
        again = eng.complete("abcdefgh", max_tokens=20, n_draft=3)
        assert again.stats.cached_tokens == 0 and again.stats.accepted > 0


def test_deprecated_generate_and_iterating_a_chat_completion_still_work(agree) -> None:
    """Scripts written against the README of two weeks ago: ``for ev in eng.generate(...)``
    and ``for ev in eng.chat(...)``. Both keep working for one release, with a warning."""
    import localspec

    from conftest import EXACT

    with localspec.load(agree[0], draft=agree[1], **EXACT) as eng:
        live = list(eng.complete_stream("abcdefgh", max_tokens=12, n_draft=3))
        with pytest.warns(DeprecationWarning, match="complete_stream"):
            old = list(eng.generate("abcdefgh", max_tokens=12, n_draft=3))
        assert [ev.tokens for ev in old] == [ev.tokens for ev in live]
        assert old[-1].finish_reason == live[-1].finish_reason

        reply = eng.chat([{"role": "user", "content": "Say hi"}], max_tokens=10, n_draft=2)
        with pytest.warns(DeprecationWarning, match="chat_stream"):
            events = list(reply)
        assert events and "".join(ev.text for ev in events) == reply.text
        assert [t for ev in events for t in ev.tokens] == reply.tokens
        assert events[-1].finish_reason == reply.finish_reason
    with pytest.warns(DeprecationWarning):
        assert list(localspec.Completion("", [], [], "length")) == []


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("localspec.hub", "localspec.files.hub", "resolve_target"),
        ("localspec.context_fit", "localspec.text.context_fit", "fit_messages"),
        ("localspec.header_checks", "localspec.native.header_checks", "check_header"),
        ("localspec.discovery", "localspec.files.discovery", "default_target"),
    ],
)
def test_module_paths_the_docs_named_keep_working_with_a_warning(
    old: str, new: str, name: str
) -> None:
    import importlib

    shim, moved = importlib.import_module(old), importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        got = getattr(shim, name)
    assert got is getattr(moved, name)
    with pytest.raises(AttributeError), pytest.warns(DeprecationWarning):
        shim.no_such_name  # noqa: B018
    assert name in dir(shim)  # completion and help() list the names that still work
    names: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        exec(f"from {old} import *", names)  # noqa: S102
    assert names[name] is getattr(moved, name)
