"""Sessions on disk: an engine that loads what another saved answers the next turn as the
saving engine does and as a fresh engine does, reusing the saved history; every file that
cannot serve it is refused with one clear reason and leaves it working; SessionCache keeps a
bounded folder of them."""

from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import pytest

import localspec
from localspec.files.session_cache import SessionCache
from localspec.lowlevel import hold, parts
from localspec.runtime import session_state

from conftest import EXACT
from helpers import tinymodels as tm
from helpers.costs import inject_costs
from helpers.greedy import F32_MARGIN, replay_plain_greedy

TURNS = ["Tell me about the sea.", "And the mountains?", "Which is older?"]


def prompt_ids(eng, messages) -> list[int]:
    return eng.tokenize(eng.format_chat(messages)[0], add_special=False, parse_special=True)


def chat(eng, messages, **kw):
    prompt, _ = eng.format_chat(messages)
    return eng.complete(prompt, add_special=False, parse_special=True, **kw)


def check_same(eng, ids: list[int], got, want) -> None:
    """The same tokens, or (where a reused one-token row and a fresh batch row round apart)
    both plain greedy up to near-ties."""
    if got.tokens != want.tokens:
        assert replay_plain_greedy(eng, ids, got.tokens, margin=F32_MARGIN).ties
        replay_plain_greedy(eng, ids, want.tokens, margin=F32_MARGIN)


def converse(eng, turns, **kw) -> list[dict[str, str]]:
    msgs: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
    for turn in turns:
        msgs.append({"role": "user", "content": turn})
        msgs.append({"role": "assistant", "content": chat(eng, msgs, **kw).text})
    return msgs


def load(target, draft, **opts):
    return localspec.load(target, draft=draft, **{**EXACT, **opts})


# --- the next turn after a restore -------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    [{"n_draft": 0}, {"n_draft": 3}, {"tree": (4, 3, 12)}, {}, {"draft_source": "ngram"}],
    ids=["plain", "chain", "tree", "auto", "ngram-auto"],
)
def test_the_next_turn_after_a_restore(models, tmp_path, mode) -> None:
    path = tmp_path / "chat.session"
    kw = {"max_tokens": 30, **mode}
    with load(models["target"], models["draft31"]) as a:
        msgs = converse(a, TURNS[:2], **kw)
        size = a.save_session(path)
        assert size == os.path.getsize(path)
        saved = parts(a).target.n
        before = len(prompt_ids(a, msgs[:-1]))  # the prompt of the last reply
        msgs.append({"role": "user", "content": TURNS[2]})
        ids = prompt_ids(a, msgs)
        went_on = chat(a, msgs, **kw)
    with load(models["target"], models["draft31"]) as b:
        assert b.load_session(path) == saved
        assert b.cached_tokens == saved
        got = chat(b, msgs, **kw)
        # the history up to where the reply's text stops giving back its tokens (this random
        # model's bytes are not always UTF-8); auto's choices depend on what ran before
        assert got.stats.cached_tokens >= before
        if mode.get("n_draft") is not None or "tree" in mode:
            assert got.stats.cached_tokens == went_on.stats.cached_tokens
    with load(models["target"], models["draft31"]) as c:
        fresh = chat(c, msgs, **kw)
        assert fresh.stats.cached_tokens == 0
        check_same(c, ids, got, went_on)
        check_same(c, ids, got, fresh)


@pytest.mark.parametrize(
    "mode", [{"n_draft": 4}, {"tree": (4, 2, 8)}, {}], ids=["chain", "tree", "auto"]
)
def test_acceptance_after_a_restore_equals_a_fresh_engines(
    agree, tmp_path, mode, monkeypatch
) -> None:
    """A drafter cache restored wrong (pairs, queued rows, positions) would accept less; a
    restored engine drafts as a fresh one does. Auto's choices follow measured costs: the two
    engines are priced alike (an injected cost clock), so only their caches can tell them
    apart (on the wall clock a step's timing once clipped a draft differently, 42 against 43
    accepted tokens)."""
    target, draft = agree
    path = tmp_path / "agree.session"
    kw = {"max_tokens": 50, **mode}
    turns = ["abc", "klm", "uvw"]
    with load(target, draft) as a:
        msgs = converse(a, turns[:2], **kw)
        a.save_session(path)
        msgs.append({"role": "user", "content": turns[2]})
        went_on = chat(a, msgs, **kw)
    with load(target, draft) as b, load(target, draft) as c:
        for eng in (b, c):
            inject_costs(monkeypatch, eng, lambda n: 10e-3 * (1 + 0.05 * n))
        b.load_session(path)
        got, fresh = chat(b, msgs, **kw), chat(c, msgs, **kw)
        assert got.tokens == fresh.tokens == went_on.tokens
        assert got.stats.cached_tokens > 0
        acc = [(r.stats.accepted, r.stats.drafted) for r in (got, fresh, went_on)]
        assert acc[0] == acc[1] and acc[0][0] > 0, acc
        if mode:  # auto's choices also follow what the saving engine ran before (its n-gram
            # memory, its scheduler's history), which a restore does not carry
            assert acc[0] == acc[2], acc


def test_queued_pairs_not_yet_encoded_or_written(models, tmp_path) -> None:
    """A long prompt with no step after it leaves encoded pairs queued (more than ENCODE_AT
    taps) and taps not yet encoded: both are saved, and the drafts after a restore are a
    fresh engine's (this drafter's attention matters)."""
    words = " ".join(f"w{i}" for i in range(150))
    prompt = f"the quick brown fox {words}"
    with load(models["target"], models["draft31"]) as a:
        a.complete(prompt, max_tokens=0, n_draft=3)
        d = parts(a).drafter
        assert d._queued_g and d.end == 0
        a.complete(prompt + " jumps", max_tokens=0, n_draft=3)
        assert d._queued_taps and d._queued_g
        a.save_session(tmp_path / "q.session")
        longer = a.tokenize(prompt + " jumps over")
        n = parts(a).target.n
    with (
        load(models["target"], models["draft31"]) as b,
        load(models["target"], models["draft31"]) as c,
    ):
        assert b.load_session(tmp_path / "q.session") == n
        db, da = parts(b).drafter, d
        assert (db.start, db.end, db.next_pos, db._n_queued_taps) == (
            da.start,
            da.end,
            da.next_pos,
            da._n_queued_taps,
        )
        assert b.propose(longer, k=6) == c.propose(longer, k=6)


def test_a_drafter_that_restarted_mid_history(models, tmp_path) -> None:
    """Auto wakes a drafter mid-generation by restarting its cache (start > 0); restored, the
    next call treats it as the saving engine would: it keeps none of it."""
    with load(models["target"], models["draft31"]) as a:
        p1 = a.tokenize("the quick brown fox jumps over the lazy dog and more words here")
        done = a.complete(p1, max_tokens=20, n_draft=3)
        parts(a).state.wake()
        start = parts(a).drafter.start
        assert start > 0
        a.save_session(tmp_path / "w.session")
        prompt = p1 + done.tokens + a.tokenize(" again", add_special=False)
    with (
        load(models["target"], models["draft31"]) as b,
        load(models["target"], models["draft31"]) as c,
    ):
        b.load_session(tmp_path / "w.session")
        assert parts(b).drafter.start == start
        assert b.propose(prompt, k=6) == c.propose(prompt, k=6)
        assert parts(b).drafter.start == 0


def test_parked_gap_cells_are_restored(models, tmp_path) -> None:
    """Cells parked for rejected tree nodes come back in their sequence, so the restored
    cache is laid out as the saving engine's."""
    kw = {"tree": (4, 3, 12)}
    with load(models["target"], models["draft31"]) as a:
        events = a.complete_stream("the quick brown fox", max_tokens=150, **kw)
        shown = []
        for ev in events:
            shown += ev.tokens
            if parts(a).target.gap_cells:
                break
        events.close()
        gaps = list(parts(a).target._gaps)
        assert gaps
        a.save_session(tmp_path / "g.session")
        ids = a.tokenize("the quick brown fox") + shown + a.tokenize(" and", add_special=False)
        went_on = a.complete(ids, max_tokens=30, **kw)
    with load(models["target"], models["draft31"]) as b:
        b.load_session(tmp_path / "g.session")
        assert parts(b).target._gaps == gaps
        got = b.complete(ids, max_tokens=30, **kw)
        assert got.stats.cached_tokens == went_on.stats.cached_tokens > 0
        check_same(b, ids, got, went_on)


def test_saving_mid_stream_and_loading_over_a_running_generation(models, tmp_path) -> None:
    with load(models["target"], models["draft31"]) as a:
        events = a.complete_stream("hello there", max_tokens=40, n_draft=3)
        first = next(events)
        a.save_session(tmp_path / "s.session")  # between steps: the stream goes on
        rest = [t for ev in events for t in ev.tokens]
        assert len(first.tokens) + len(rest) == 40
        running = a.complete_stream("hello there", max_tokens=40, n_draft=3)
        next(running)
        assert a.load_session(tmp_path / "s.session") > 0
        with pytest.raises(localspec.GenerationError, match="superseded"):
            next(running)


# --- edits, and architectures with other caches ------------------------------------------------


def test_an_edited_conversation_reuses_only_the_common_prefix(models, tmp_path) -> None:
    with load(models["target"], models["draft31"]) as a:
        msgs = converse(a, TURNS[:2], max_tokens=30, n_draft=3)
        a.save_session(tmp_path / "e.session")
    edited = [msgs[0], {"role": "user", "content": "Tell me about the sky."}, *msgs[2:]]
    edited.append({"role": "user", "content": TURNS[2]})
    with (
        load(models["target"], models["draft31"]) as b,
        load(models["target"], models["draft31"]) as c,
    ):
        b.load_session(tmp_path / "e.session")
        ids, old = prompt_ids(b, edited), prompt_ids(b, msgs)
        common = next(i for i, (x, y) in enumerate(zip(ids, old, strict=False)) if x != y)
        got = chat(b, edited, max_tokens=30, n_draft=3)
        assert 0 < got.stats.cached_tokens <= common
        check_same(c, ids, got, chat(c, edited, max_tokens=30, n_draft=3))


@pytest.mark.parametrize("arch", ["gemma3", "mamba", "qwen35", "lfm2", "nemotron_h"])
def test_sliding_window_and_recurrent_targets(tmp_path, arch) -> None:
    """Gemma 3: every cell of the sliding-window layers is saved, so a restored cache can be
    cut back far below its window (6 here). Recurrent and hybrid: the state holds only its
    last position, so an edited history reuses nothing (and does not fail); the hybrids draft
    from the n-gram index and cut their state back, and what they save is whole."""
    writers = {
        "gemma3": tm.write_gemma3_target,
        "mamba": tm.write_mamba_target,
        "qwen35": tm.write_qwen35_target,
        "lfm2": tm.write_lfm2_target,
        "nemotron_h": tm.write_nemotron_h_target,
    }
    target = writers[arch](str(tmp_path / f"{arch}.gguf"))
    with load(target, False) as a:
        p1 = a.tokenize("the quick brown fox jumps over the lazy dog")
        out = a.complete(p1, max_tokens=30)
        a.save_session(tmp_path / "a.session")
        more = a.tokenize(" and then", add_special=False)
    nxt = p1 + out.tokens + more
    edited = p1[:10] + a_tokens_unlike(p1[10]) + p1[11:] + out.tokens + more
    with load(target, False) as b, load(target, False) as c:
        for prompt in (nxt, edited):
            b.load_session(tmp_path / "a.session")
            got = b.complete(prompt, max_tokens=30)
            if prompt is nxt:  # all the history
                assert got.stats.cached_tokens == len(p1) + len(out.tokens) - 1
            else:
                assert got.stats.cached_tokens == (10 if arch == "gemma3" else 0)
            c.reset()
            check_same(c, prompt, got, c.complete(prompt, max_tokens=30))
        if arch == "gemma3":  # the logits after the cut are a fresh prefill's (without the
            # cells the window masks at the end of the history, they were 0.3 apart)
            b.load_session(tmp_path / "a.session")
            with hold(b) as p:
                p.target.keep(10)
                got_logits = np.array(p.target.prefill(edited[10:])[0])
            with hold(c) as p:
                p.target.clear()
                want = np.array(p.target.prefill(edited)[0])
            assert np.abs(got_logits - want).max() < 1e-3


def a_tokens_unlike(token: int) -> list[int]:
    return [token + 1 if token < 200 else token - 1]


# --- refused files ------------------------------------------------------------------------------


@pytest.fixture
def saved(models, tmp_path):
    """A session saved by the default tiny pair, and the prompt that follows it."""
    path = tmp_path / "ok.session"
    with load(models["target"], models["draft31"]) as a:
        msgs = converse(a, TURNS[:1], max_tokens=20, n_draft=3)
        a.save_session(path)
    return path, [*msgs, {"role": "user", "content": TURNS[1]}]


def refused_then_works(eng, path, match: str, msgs) -> None:
    """load_session refuses with a reason; the caches are empty and the engine answers as a
    fresh one."""
    with pytest.raises(localspec.SessionStateError, match=match) as err:
        eng.load_session(path)
    assert str(path) in str(err.value)
    drafter = parts(eng).drafter
    assert eng.cached_tokens == 0 and (drafter is None or drafter.next_pos == 0)
    got = chat(eng, msgs, max_tokens=20, n_draft=3)
    assert got.stats.cached_tokens == 0
    replay_plain_greedy(eng, prompt_ids(eng, msgs), got.tokens, margin=F32_MARGIN)


def test_files_for_other_model_files_or_settings_are_refused(models, saved, tmp_path) -> None:
    path, msgs = saved
    other_target = shutil.copy(models["target"], tmp_path / "copy.gguf")
    other_draft = shutil.copy(models["draft31"], tmp_path / "copy.eagle3.gguf")
    cases = [
        ((other_target, models["draft31"]), {}, "another target file"),
        ((models["target"], other_draft), {}, "another drafter file"),
        ((models["target"], models["draft"]), {}, "another drafter file"),
        ((models["target"], False), {}, "saved with the drafter .*; this engine has none"),
        (
            (models["target"], models["draft31"]),
            {"n_ctx": 2048},
            "n_ctx=1024; this engine runs n_ctx=2048",
        ),
        (
            (models["target"], models["draft31"]),
            {"kv_type": "f16"},
            "kv_type=f32; this engine runs kv_type=f16",
        ),
        ((models["target"], models["draft31"]), {"n_batch": 256}, "n_batch=512"),
    ]
    for files, opts, match in cases:
        with load(*files, **opts) as eng:
            refused_then_works(eng, path, match, msgs)
    # a file saved without a drafter, for an engine with one
    with load(models["target"], False) as a:
        a.complete("hello", max_tokens=5)
        a.save_session(tmp_path / "plain.session")
    with load(models["target"], models["draft31"]) as eng:
        refused_then_works(eng, tmp_path / "plain.session", "saved without a drafter", msgs)


def test_a_touched_model_file_invalidates(models, tmp_path) -> None:
    target = shutil.copy(models["target"], tmp_path / "t.gguf")
    with load(target, models["draft31"]) as eng:
        msgs = converse(eng, TURNS[:1], max_tokens=20, n_draft=3)
        eng.save_session(tmp_path / "t.session")
        st = os.stat(target)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        msgs.append({"role": "user", "content": TURNS[1]})
        refused_then_works(eng, tmp_path / "t.session", "target file .* changed since", msgs)


def test_broken_files_are_refused(models, saved, tmp_path) -> None:
    path, msgs = saved
    data = path.read_bytes()
    prefix = session_state.PREFIX
    head_len = struct.unpack_from("<I", data, 12)[0]
    body = prefix.size + head_len
    flipped = bytearray(data)
    flipped[body + (len(data) - body) // 2] ^= 0x40
    broken = {
        "empty": (b"", "is empty"),
        "short": (data[:5], "truncated"),
        "no header": (data[: prefix.size + 3], "truncated"),
        "truncated": (data[:-100], "truncated"),
        "longer": (data + b"\0", "corrupt"),
        "random": (np.random.default_rng(0).bytes(len(data)), "not a localspec session file"),
        "magic": (b"GGUF" + data[4:], "not a localspec session file"),
        "version": (
            data[:8] + struct.pack("<I", 99) + data[12:],
            "format 99; this localspec reads format 1",
        ),
        "header": (data[: prefix.size] + b"{" * head_len + data[body:], "header is not JSON"),
        "flipped": (bytes(flipped), "checksum"),
    }
    with load(models["target"], models["draft31"]) as eng:
        refused_then_works(eng, tmp_path / "missing.session", "no such file", msgs)
        for name, (raw, match) in broken.items():
            bad = tmp_path / f"{name}.session"
            bad.write_bytes(raw)
            refused_then_works(eng, bad, match, msgs)


def test_a_state_llama_cpp_refuses(models, saved, tmp_path) -> None:
    """A whole file whose state bytes llama.cpp does not accept (here another architecture's):
    its refusal is checked, nothing half-restored stays."""
    path, msgs = saved
    gemma = tm.write_gemma3_target(str(tmp_path / "g.gguf"))
    with load(gemma, False) as g:
        g.complete("hello there", max_tokens=5)
        foreign = parts(g).state.snapshot()[0].memory
    with load(models["target"], models["draft31"]) as eng:
        ident = session_state.identity(parts(eng).target, parts(eng).drafter, parts(eng).rt)
        target, drafter = session_state.read(str(path), ident)
        for bad_target, bad_drafter, match in [
            (session_state.TargetState(target.tokens, [], foreign), drafter, "refused the target"),
            (
                target,
                session_state.DrafterState(
                    0, 1, [5], drafter.queued_g[:0], drafter.queued_taps[:0], foreign
                ),
                "refused the drafter",
            ),
            (
                session_state.TargetState(target.tokens[:-1], [], target.memory),
                drafter,
                "disagree with its history",
            ),
            (
                session_state.TargetState(target.tokens, [eng.n_ctx], target.memory),
                drafter,
                "outside the context",
            ),
            (
                session_state.TargetState(target.tokens, [3], target.memory),
                drafter,
                "disagree with its history",
            ),
        ]:
            session_state.write(str(tmp_path / "x.session"), ident, bad_target, bad_drafter)
            refused_then_works(eng, tmp_path / "x.session", match, msgs)


def test_writing_where_no_file_can_be_written(models, tmp_path) -> None:
    with load(models["target"], False) as eng:
        eng.complete("hello", max_tokens=3)
        with pytest.raises(localspec.SessionStateError, match="cannot write it"):
            eng.save_session(tmp_path / "no" / "such" / "folder.session")
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


# --- the cache folder ---------------------------------------------------------------------------


def test_session_cache_round_trip_miss_stale_and_drop(models, tmp_path) -> None:
    cache = SessionCache(str(tmp_path / "sessions"))
    key = "chat:abc123:7"
    with (
        load(models["target"], models["draft31"]) as a,
        load(models["target"], models["draft31"]) as b,
    ):
        assert cache.restore(b, key) == 0  # a miss
        assert cache.total_bytes() == 0
        a.complete("the quick brown fox", max_tokens=20, n_draft=3)
        size = cache.save(a, key)
        assert size > 0 and cache.total_bytes() == size
        assert key not in " ".join(os.listdir(cache.directory))  # names are hashes
        assert cache.restore(b, key) == parts(a).target.n
        cache.drop(key)
        cache.drop(key)  # dropping a missing key is fine
        assert cache.restore(b, key) == 0
    with load(models["target"], models["draft31"]) as a:
        a.complete("the quick brown fox", max_tokens=20, n_draft=3)
        cache.save(a, key)
    with load(models["target"], models["draft31"], n_ctx=512) as other:
        assert cache.restore(other, key) == 0  # stale for this engine: deleted, a miss
        assert not os.path.exists(cache.path(key))
        assert other.complete("hello", max_tokens=3).stats.cached_tokens == 0


def test_session_cache_evicts_the_least_recently_used(models, tmp_path) -> None:
    with load(models["target"], False) as eng:
        eng.complete("the quick brown fox", max_tokens=20)
        probe = SessionCache(str(tmp_path / "probe"))
        one = probe.save(eng, "x")
        cache = SessionCache(str(tmp_path / "s"), max_bytes=int(2.5 * one))
        for i, key in enumerate(["a", "b", "c"]):
            assert cache.save(eng, key) == one
            os.utime(cache.path(key), ns=(i * 10**9, i * 10**9))  # distinct ages
        assert not os.path.exists(cache.path("a"))  # the oldest went
        assert cache.total_bytes() == 2 * one <= cache.max_bytes
        assert cache.restore(eng, "b") > 0  # "b" is now the most recently used
        cache.save(eng, "d")
        assert os.path.exists(cache.path("b")) and not os.path.exists(cache.path("c"))
        tiny = SessionCache(str(tmp_path / "tiny"), max_bytes=one - 1)
        assert tiny.save(eng, "big") == 0 and tiny.total_bytes() == 0  # alone too large


def test_session_cache_tolerates_files_vanishing(models, tmp_path, monkeypatch) -> None:
    cache = SessionCache(str(tmp_path / "s"))
    with load(models["target"], False) as eng:
        eng.complete("hello there", max_tokens=5)
        cache.save(eng, "k")
        load_session = eng.load_session

        def vanish_first(path):  # another process drops it between the check and the read
            os.unlink(path)
            return load_session(path)

        monkeypatch.setattr(eng, "load_session", vanish_first)
        assert cache.restore(eng, "k") == 0
        monkeypatch.undo()
        cache.save(eng, "k")
        listdir = os.listdir
        monkeypatch.setattr(os, "listdir", lambda d: [*listdir(d), "gone" + ".session"])
        assert cache.total_bytes() == os.path.getsize(cache.path("k"))
        cache.save(eng, "k2")  # eviction lists the vanished name too
        assert os.path.exists(cache.path("k2"))


def test_session_cache_default_folder(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "c"))
    assert SessionCache().directory == str(tmp_path / "c" / "sessions")
