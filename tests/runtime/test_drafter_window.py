"""The drafter's attention window: drafts attend over the last W pairs of the history (the
rows a drafter was trained over), checked against the numpy reference drafter attending over
exactly those pairs, through every way its cache moves: a prompt longer than the window,
steps that slide it, an edit that moves it back, and a saved and restored session. Then the
whole engine with a window stays lossless, and the window is read from the GGUF or the
caller."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import localspec
from localspec.errors import InvalidParameterError, ModelFileError
from localspec.files import gguf_keys as K
from localspec.files.fileinfo import describe, format_info
from localspec.lowlevel import parts
from localspec.runtime.drafter import Drafter

from conftest import EXACT
from helpers import gguf_edit as ge
from helpers import tinymodels as tm
from helpers.greedy import assert_greedy_lossless
from helpers.reference import RefDrafter, read_tensors

W = 8
TEXT = (
    "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat and "
    "the bird sings in the tall tree"
)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))


class Checker:
    """Feeds the engine's drafter and the reference the same pairs; compares their drafts."""

    def __init__(self, eng: localspec.Engine, ref: RefDrafter) -> None:
        self.dft: Drafter = parts(eng).drafter
        self.tgt = parts(eng).target
        self.ref = ref
        self.full_history_differs = 0  # checks where attending over all pairs would differ

    def feed(self, tokens: list[int], taps: np.ndarray) -> None:
        """Queue pairs at the drafter's next positions; the reference decodes them when
        flushed (each pair row attends to the window of the flush's last row)."""
        self.pending = (self.dft.next_pos, list(tokens), self.dft.encode(taps))
        self.dft.queue(tokens, taps)

    def flush_and_draft(self, steps: int = 3) -> None:
        pos0, tokens, g = self.pending
        logits, h = self.dft.flush()
        end = self.dft.end
        assert end == pos0 + len(tokens)
        low = max(self.dft.start, end - W)
        for i, tok in enumerate(tokens):  # rows before the window: only their K/V count
            z, hp = self.ref.decode(tok, g[i], pos0 + i, low=low if pos0 + i >= low else 0)
        fin = np.isfinite(z)
        assert _rel(logits[fin], z[fin]) < 2e-4
        assert _rel(h, self.ref.feedback(hp)) < 2e-4
        if low > 0:  # the same pair over the whole history: what the window changes
            z_all, _ = self.ref.decode(tokens[-1], g[-1], end - 1, low=0)
            self.full_history_differs += _rel(z_all[fin], z[fin]) > 1e-2
        state = self.ref.feedback(hp)
        # a tree's first frontier: each node in a sequence branched from the window's
        toks, seqs = [5, 17], [1, 2]
        for s in seqs:
            self.dft.branch(0, s)
        states = np.repeat(state[None, :], len(toks), axis=0).astype(np.float32)
        rows, _ = self.dft.decode_frontier(toks, states, end, seqs)
        rows = rows.copy()
        for tok, row in zip(toks, rows, strict=True):
            z, _ = self.ref.decode(tok, state, end, low=low)
            assert _rel(row[fin], z[fin]) < 2e-4, "tree frontier"
        self.dft.drop_branches(seqs)
        for step, tok in zip(range(steps), itertools.cycle([11, 23, 7])):
            out = self.dft.chain_next(tok, end + step, feed=step < steps - 1).copy()
            z, hp = self.ref.decode(tok, state, end + step, low=low)
            assert _rel(out[fin], z[fin]) < 2e-4, f"chain step {step}"
            state = self.ref.feedback(hp)
        self.dft.rewind()
        self.ref.truncate(end)

    def target_taps(self, tokens: list[int]) -> np.ndarray:
        self.tgt.decode(tokens, all_logits=False)
        return self.tgt.read_taps(len(tokens))

    def step(self, history: list[int], new: list[int], back: int | None = None) -> list[int]:
        """Keep all but the history's last `back` tokens (an edit; 0: a keep that changes
        nothing), then accept `new` after it: the target decodes what precedes each new
        token, the drafter and the reference get the pairs, both draft. Returns the new
        history."""
        cut = len(history) - (back or 0)
        if back is not None:
            self.tgt.keep(cut - 1)
            self.dft.keep(cut - 1)
            self.ref.truncate(cut - 1)
        self.feed(new, self.target_taps(history[cut - 1 : cut] + new[:-1]))
        self.flush_and_draft()
        return history[:cut] + new


@pytest.mark.parametrize("flags", [{}, {"fc_norm": True, "norm_output": True}], ids=["3", "3.1"])
def test_window_drafts_equal_the_reference_over_the_last_pairs(models, tmp_path, flags) -> None:
    path = tm.write_drafter(str(tmp_path / "d.gguf"), models["target"], tm.DrafterShape(**flags))
    tt, _ = read_tensors(models["target"])
    # a drafter batch of 8 rows: the prompt's pairs before the window take several chunks
    opts = {**EXACT, "draft_batch": 8}
    with localspec.load(models["target"], draft=path, draft_window=W, **opts) as eng:
        ref = RefDrafter(path, tt["token_embd.weight"], tt["output.weight"])
        c = Checker(eng, ref)
        assert c.dft.window == W
        c.tgt.set_taps_active(True)
        c.tgt.clear()
        c.dft.restart(0)
        prompt = eng.tokenize(TEXT)
        assert len(prompt) > 3 * W
        # a prompt longer than the window: its first pairs go to the history alone
        c.feed([*prompt[1:], 40], c.target_taps(prompt))
        c.flush_and_draft()
        # steps of a few accepted tokens slide the window; a long one passes it whole
        history = [*prompt, 40]
        for new in ([51, 52], [60], [70, 71, 72, 73], list(range(110, 110 + W + 5)), [80, 81]):
            history = c.step(history, new)
        # back a little, inside the window; a keep at the end (back 0) changes nothing
        history = c.step(history, [95, 96], back=3)
        history = c.step(history, [97, 98], back=0)
        # an edit: back to before the window's start, then a new continuation
        history = c.step(history, [90, 91], back=W + 5)
        # a session: captured, restored into an emptied cache, and drafted on
        saved = c.dft.capture()
        c.dft.restart(0)
        c.dft.restore(saved)
        history = c.step(history, [100, 101, 102])
        # ... holding the whole history: an edit back past the window's start reads it
        c.step(history, [103, 104], back=W + 3)
        assert c.full_history_differs >= 3, "the window never changed a draft: test too weak"


def test_engine_with_a_window_stays_lossless(models, tmp_path) -> None:
    session = str(tmp_path / "s.session")
    with localspec.load(models["target"], draft=models["draft31"], draft_window=5, **EXACT) as eng:
        assert parts(eng).drafter.window == 5
        for prompt, kw in (
            ("the quick brown fox", {"n_draft": 4}),
            ("Once upon a time, there was", {"tree": (3, 2, 6)}),
        ):
            first = eng.complete(prompt, max_tokens=150, **kw)
            assert first.stats.drafted > 0
            assert_greedy_lossless(eng, prompt, first)
            # the next call reuses the cached history (the window moves back to its prefix)
            longer = prompt + first.text[:20]
            again = eng.complete(longer, max_tokens=80, **kw)
            assert_greedy_lossless(eng, longer, again)
        eng.save_session(session)
    # a session saved with a window holds the whole history: a drafter without one reads it
    with localspec.load(models["target"], draft=models["draft31"], draft_window=0, **EXACT) as eng:
        eng.load_session(session)
        longer += again.text[:10]
        c = eng.complete(longer, max_tokens=60, n_draft=4)
        assert c.stats.drafted > 0
        assert_greedy_lossless(eng, longer, c)


def test_a_window_fits_the_smallest_drafter_batches(models) -> None:
    """The history takes one more KV sequence than the tree's frontier: the smallest batches
    still load and run their largest trees."""
    for n_batch, draft_batch, shape in ((2, 2, (3, 1, 3)), (4, 3, (3, 1, 3)), (8, 5, (3, 2, 6))):
        opts = {**EXACT, "n_batch": n_batch, "draft_batch": draft_batch}
        with localspec.load(models["target"], draft=models["draft31"], draft_window=4, **opts) as e:
            for kw in ({}, {"tree": shape}):
                c = e.complete("the quick brown fox", max_tokens=40, **kw)
                assert_greedy_lossless(e, "the quick brown fox", c)


def test_window_comes_from_the_gguf_or_the_caller(models, tmp_path) -> None:
    path = tm.write_drafter(
        str(tmp_path / "w.gguf"), models["target"], tm.DrafterShape(attention_window=12)
    )
    for kw, want in (({}, 12), ({"draft_window": 0}, None), ({"draft_window": 3}, 3)):
        with localspec.load(models["target"], draft=path, **kw, **EXACT) as eng:
            assert parts(eng).drafter.window == want
            assert ("attending over its last" in eng.drafter_note) == (want is not None)
    assert "attends over  its last 12 pairs" in format_info(describe(path))
    # a drafter without the key attends over everything
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        assert parts(eng).drafter.window is None
    with pytest.raises(InvalidParameterError, match="draft_window"):
        localspec.load(models["target"], draft=path, draft_window=-1, **EXACT)
    g = ge.read(path)
    g.set(K.ATTENTION_WINDOW, 0)
    bad = ge.write(g, str(tmp_path / "bad.gguf"))
    with pytest.raises(ModelFileError, match="attention_window is 0"):
        localspec.load(models["target"], draft=bad, **EXACT)
    g.set(K.ATTENTION_WINDOW, "wide", ge.STR)
    bad = ge.write(g, str(tmp_path / "bad2.gguf"))
    with pytest.raises(ModelFileError, match="attention_window"):
        localspec.load(models["target"], draft=bad, **EXACT)
