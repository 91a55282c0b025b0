"""`localspec train`: features made by the target, the training-time-test model against an
independent token-by-token reference, training that learns, resumes, converts and runs
losslessly, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import tinymodels as tm

torch = pytest.importorskip("torch")

from localspec import load  # noqa: E402
from localspec import native as N  # noqa: E402
from localspec.cli import main  # noqa: E402
from localspec.converters.checkpoint import load_tensors, read_config  # noqa: E402
from localspec.converters.convert import convert  # noqa: E402
from localspec.converters.formats import canonical_name, parse_config  # noqa: E402
from localspec.converters.reference import TorchEagle3  # noqa: E402
from localspec.errors import CheckpointError, InvalidParameterError, LocalspecError  # noqa: E402
from localspec.lowlevel import parts  # noqa: E402
from localspec.options import RuntimeOptions  # noqa: E402
from localspec.runtime.drafter_spec import DrafterSpec  # noqa: E402
from localspec.runtime.target import Target  # noqa: E402
from localspec.training import model as model_mod  # noqa: E402
from localspec.training import train  # noqa: E402
from localspec.training.data import Batcher  # noqa: E402
from localspec.training.evaluation import evaluate, walk_chains  # noqa: E402
from localspec.training.features import load_sequences  # noqa: E402
from localspec.training.trainer import Trainer  # noqa: E402

from helpers.training import TAPS, feature_config, train_config, write_prompts  # noqa: E402

EXACT = {"kv_type": "f32", "flash_attn": False, "n_threads": 2, "n_ctx": 1024}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    target, _ = tm.write_agreeing_pair(str(d), head_noise=0.3, name="noisy")
    return str(d), target, write_prompts(str(d / "prompts.jsonl"), 48)


@pytest.fixture(scope="module")
def trained(pair):
    folder, target, data = pair
    out = os.path.join(folder, "run")
    res = train(
        target,
        [data],
        out,
        config=train_config(),
        features=feature_config(),
        taps=TAPS,
        show_progress=False,
    )
    return out, res


def test_windows_keep_prompt_context_rows_before_a_replys_first_trained_row(trained):
    """--prompt-context P: a sequence's first window starts P rows before its first trained
    row (or at row 0; P at most window - 2, so that window trains rows too), later windows
    follow it back to back, none is longer than --window; P = 0 keeps only the row the first
    label is read at."""
    from localspec.training.data import Batcher

    out, _ = trained
    seqs = load_sequences(os.path.join(out, "data"))
    t2d = np.arange(int(max(s.tokens.max() for s in seqs)) + 1)
    assert max(s.loss_start for s in seqs) > 32  # prompts longer than every P below keeps
    for pc in (0, 3, 30, 64):
        b = Batcher(seqs, train_config(window=32, prompt_context=pc), t2d)
        for i, s in enumerate(seqs):
            spans = [(a, e) for j, a, e in b.windows if j == i]
            first = max(0, s.loss_start - 1 - min(pc, 30))
            assert spans[0][0] == first and all(e - a <= 32 for a, e in spans)
            assert all(x[1] == y[0] for x, y in itertools.pairwise(spans))  # back to back
            assert spans[-1][1] >= len(s.taps) - 1  # a last single row makes no window


def test_features_match_a_plain_single_sequence_decode(pair, trained):
    """Parallel generation (4 sequences per batch, own KV streams) stores for every position
    exactly what a lone decode of that sequence gives: taps, and labels whose argmax is the
    greedy next token."""
    _, target, _ = pair
    out, _ = trained
    seqs = load_sequences(os.path.join(out, "data"))
    assert len(seqs) >= 40
    t = Target(target, RuntimeOptions(n_ctx=512, n_batch=512, n_threads=2))
    try:
        t.enable_taps(TAPS)
        for s in seqs[:6]:
            n = len(s.taps)
            t.clear()
            logits = t.decode([int(x) for x in s.tokens[:n]], all_logits=True).copy()
            taps = t.read_taps(n)
            np.testing.assert_allclose(s.taps.astype(np.float32), taps, rtol=2e-2, atol=2e-2)
            # labels exist where they are trained on (the reply): no output head elsewhere
            assert not s.labelled[: s.loss_start].any() and s.labelled[s.loss_start :].all()
            rows = np.flatnonzero(s.labelled)
            assert (s.label_ids[rows, 0] == logits[rows].argmax(-1)).mean() > 0.98
            # generated part: each token is the greedy choice at the position before it
            gen = np.arange(s.loss_start, len(s.tokens))
            assert (s.tokens[gen] == logits[gen - 1].argmax(-1)).all()
            assert s.loss_start > 3  # the prompt is not trained on
    finally:
        t.close()


@pytest.mark.parametrize(("block", "span"), [(None, None), (4, None), (None, 3), (4, 5)])
def test_unrolled_training_matches_token_by_token_drafting(trained, pair, block, span, monkeypatch):
    """The training-time test (one pass, attention trick) equals the converter's independent
    PyTorch reference decoding with a real KV cache: teacher-forced rows 0..P, then chained
    draft steps that feed back the drafter's own state. block: query rows per attention block
    (long windows' path; None: the whole window at once). span: rows attend over their last
    `span` rows (the runtime's attention window), as a cache holding only rows P-span+1..P."""
    if block is not None:
        monkeypatch.setattr(model_mod, "ATTN_BLOCK", block)
    out, _ = trained
    _, target, _ = pair
    ckpt = os.path.join(out, "checkpoint")
    cfg = read_config(ckpt)
    dc = parse_config(cfg)
    raw = load_tensors(ckpt)
    tens = {canonical_name(k, dc.family): v for k, v in raw.items()}
    trainer = Trainer(target, out, train_config(max_steps=0), TAPS, log=lambda m: None)
    model = trainer.model.double()
    model.span = span
    seq = load_sequences(os.path.join(out, "data"))[0]
    n = 12
    steps = 4
    taps = torch.from_numpy(seq.taps[:n].astype(np.float64))[None]
    toks = torch.from_numpy(seq.tokens[1 : n + steps].astype(np.int64))[None]
    with torch.no_grad():
        outs = model.unroll(model.encode(taps), toks, steps)
        logits = [model.lm_head(h)[0].numpy() for h in outs]
    embed = model.embed.numpy()
    d2t = np.arange(len(raw["d2t"])) + raw["d2t"].numpy()
    for P in (0, 5, n - 1):
        ref = TorchEagle3(
            dc,
            tens,
            embed=embed,
            head=tens["lm_head.weight"].double().numpy(),
            d2t=d2t,
            target_vocab=len(embed),
        )
        lo = 0 if span is None else max(0, P - span + 1)
        g = ref.encode(seq.taps[lo : P + 1].astype(np.float64))
        z, fed = ref.decode([int(x) for x in seq.tokens[lo + 1 : P + 2]], g, lo)
        np.testing.assert_allclose(z[P - lo, d2t], logits[0][P], rtol=1e-6, atol=1e-6)
        state = fed[P - lo : P - lo + 1]
        for j in range(1, steps):
            z, fed = ref.decode([int(seq.tokens[P + 1 + j])], state, P + j)
            np.testing.assert_allclose(z[0, d2t], logits[j][P], rtol=1e-6, atol=1e-6)
            state = fed


def test_attention_in_blocks_has_the_whole_windows_gradients(trained, pair, monkeypatch):
    """A long window's attention goes in blocks of query rows, recomputed in the backward
    pass: the loss and every parameter's gradient equal the whole window's."""
    out, _ = trained
    _, target, _ = pair
    trainer = Trainer(target, out, train_config(max_steps=0), TAPS, log=lambda m: None)
    model = trainer.model.double()
    seq = max(load_sequences(os.path.join(out, "data")), key=lambda s: len(s.tokens))
    steps = 4
    n = min(40, len(seq.tokens) - steps)
    assert n > 2 * 7, "the data has no sequence long enough for blocks of 7 rows"
    taps = torch.from_numpy(seq.taps[:n].astype(np.float64))[None]
    toks = torch.from_numpy(seq.tokens[1 : n + steps].astype(np.int64))[None]

    def loss_and_grads(block: int) -> tuple[float, dict[str, np.ndarray]]:
        monkeypatch.setattr(model_mod, "ATTN_BLOCK", block)
        model.zero_grad()
        outs = model.unroll(model.encode(taps), toks, steps)
        w = torch.linspace(-1.0, 1.0, outs[0].numel(), dtype=torch.float64).view_as(outs[0])
        loss = sum(((model.lm_head(h) ** 2).mean() + (h * w).sum()) for h in outs)
        loss.backward()
        return loss.item(), {
            k: p.grad.numpy().copy() for k, p in model.named_parameters() if p.grad is not None
        }

    whole_loss, whole = loss_and_grads(1 << 20)
    block_loss, blocks = loss_and_grads(7)  # several blocks, the last one short
    assert block_loss == pytest.approx(whole_loss, rel=1e-12)
    assert whole.keys() == blocks.keys() and "midlayer.self_attn.q_proj.weight" in whole
    for k in whole:
        np.testing.assert_allclose(blocks[k], whole[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_training_learns_and_beats_the_untrained_drafter(trained):
    _, res = trained
    assert res.steps == 80
    assert res.untrained is not None
    assert res.final.loss < 0.5 * res.untrained.loss
    assert res.final.acc[0] > res.untrained.acc[0] + 0.3
    assert res.final.tau > res.untrained.tau + 0.5
    losses = [h["held_loss"] for h in res.history]
    assert len(losses) == 4 and losses[-1] < res.untrained.loss


def test_trained_checkpoint_converts_and_runs_losslessly(pair, trained, tmp_path):
    _, target, _ = pair
    out, _ = trained
    gguf_path = str(tmp_path / "trained.eagle3.gguf")
    r = convert(os.path.join(out, "checkpoint"), target, gguf_path, outtype="f32", log=print)
    assert r.verify is not None and r.verify.passed
    # the rows it trained over: the runtime's drafter attends over as many
    assert DrafterSpec(gguf_path).attention_window == train_config().window
    cfg = read_config(os.path.join(out, "checkpoint"))
    for bad in (0, "512", 2**31):
        cfg["localspec"]["window"] = bad
        with pytest.raises(CheckpointError, match="window must be an integer"):
            parse_config(cfg)
    plain = load(target, draft=False, **EXACT)
    spec = load(target, draft=gguf_path, n_draft=4, **EXACT)
    try:
        assert parts(spec).drafter.window == train_config().window
        drafted = accepted = 0
        for prompt in ("abc de", "hij ab cd", "a"):
            want = plain.complete(prompt, max_tokens=60).tokens
            got = spec.complete(prompt, max_tokens=60)
            assert got.tokens == want
            drafted += got.stats.drafted
            accepted += got.stats.accepted
        assert accepted / drafted > 0.5  # it learned: far above an untrained drafter's ~0
    finally:
        plain.close()
        spec.close()


def test_walked_estimate_is_what_decoding_measures(pair, trained, tmp_path):
    """Decoding takes an easy stretch in one step where the estimate averaged over rows
    counts it once per row. Chains walked through each reply (walk_chains) are what the
    engine measures: the trained drafter, converted, decodes the prompts of its own data to
    the same tokens per step and acceptance per position as the walk of the PyTorch model
    predicts on those replies."""
    _, target, data = pair
    # a drafter part way trained, that agrees often but not always (the trained one agrees
    # on every row)
    out = str(tmp_path / "run")
    shutil.copytree(os.path.join(trained[0], "data"), os.path.join(out, "data"))
    cfg = train_config(max_steps=20, eval_every=1000)
    train(
        target, [data], out, config=cfg, features=feature_config(), taps=TAPS, show_progress=False
    )
    gguf_path = str(tmp_path / "walk.eagle3.gguf")
    convert(os.path.join(out, "checkpoint"), target, gguf_path, outtype="f32", log=print)
    new = feature_config().max_new  # every reply of this data runs to it: decode each as far
    spec = load(target, draft=gguf_path, n_draft=4, **EXACT)
    seqs, steps, accepted = [], 0, 0
    accepted_at, drafted_at = np.zeros(4), np.zeros(4)
    try:
        for s in load_sequences(os.path.join(out, "data"))[:16]:
            got = spec.complete([int(x) for x in s.tokens[: s.loss_start]], max_tokens=new)
            # the data was made in parallel batches: a near-tie may decode otherwise alone
            # (another CPU's kernels), and then the two walk different replies
            if got.tokens != [int(x) for x in s.tokens[s.loss_start :]]:
                continue
            seqs.append(s)
            steps += got.stats.steps
            accepted += got.stats.accepted
            for mine, theirs in (
                (accepted_at, got.stats.accepted_at),
                (drafted_at, got.stats.drafted_at),
            ):
                mine[: len(theirs)] += theirs
    finally:
        spec.close()
    assert len(seqs) >= 12
    trainer = Trainer(target, out, cfg, TAPS, log=lambda m: None)
    # whole sequences in one window each: the engine's drafter attends to all it has seen
    whole = dataclasses.replace(trainer.cfg, window=512, batch_tokens=512)
    rows = Batcher(seqs, whole, trainer.t2d_map)
    batches = [rows.tensors(b, "cpu") for b in rows.batches(np.arange(len(rows.windows)))]
    ev = evaluate(trainer.model.float(), batches, 4, walk_limit=new)
    measured = 1 + accepted / steps
    print(f"tau: over rows {ev.tau:.3f}, walked {ev.tau_walk:.3f}, decoded {measured:.3f}")
    assert 0.2 < ev.accept_walk[0] < 0.8  # a drafter whose chains end at varied depths
    assert ev.tau_walk == pytest.approx(measured, abs=0.05)
    assert ev.accept_walk == pytest.approx(list(accepted_at / drafted_at), abs=0.03)


def test_walk_follows_each_reply_as_decoding_does():
    """Lengths per row, fed in windows out of order: the walk takes row p's chain, then the
    row after its tokens; a gap in positions starts a new reply; a reply's end or a limit
    cuts its last chain short."""
    lengths = np.array([2, 0, 0, 4, 1, 1, 1, 1, 0, 3])  # one reply, rows 10..19
    pos = np.arange(10, 20)
    parts = {0: [(pos[5:], lengths[5:]), (pos[:5], lengths[:5])]}
    # steps at rows 10 (+3), 13 (+5), 18 (+1), 19 (+1): 10 tokens in 4 steps
    tau, accept = walk_chains(parts, 4)
    assert tau == pytest.approx(10 / 4)
    assert accept == pytest.approx([2 / 4, 2 / 4, 1 / 4, 1 / 4])
    # a second reply after a gap (a user turn) starts its own walk at its first row
    parts[1] = [(np.arange(40, 43), np.array([0, 1, 5]))]  # rows 40 (+1), 41 (+2): 3 tokens
    tau, _ = walk_chains(parts, 4)
    assert tau == pytest.approx((10 + 3) / (4 + 2))
    parts[0].append((np.arange(30, 33), np.array([2, 2, 2])))  # same sequence, later reply
    tau, _ = walk_chains(parts, 4)
    assert tau == pytest.approx((10 + 3 + 3) / (4 + 2 + 1))
    # each reply's first 4 tokens, the first of them the target's before any chain: rows
    # 10 (+3); 30 (+3); 40 (+1) and 41 (+2): 9 tokens in 4 steps
    tau, accept = walk_chains(parts, 4, limit=4)
    assert tau == pytest.approx(9 / 4)
    # and drafts no further than the limit: rows 10, 30, 40 draft 2 positions, row 41 one
    assert accept == pytest.approx([3 / 4, 2 / 3, 0, 0])
    tau, accept = walk_chains({}, 4)
    assert np.isnan(tau) and accept == []


def test_resume_continues_without_new_data(pair, tmp_path):
    _, target, data = pair
    out = str(tmp_path / "resume")
    logs: list[str] = []
    first = train(
        target,
        [data],
        out,
        config=train_config(max_steps=6),
        features=feature_config(max_tokens=1500),
        taps=TAPS,
        show_progress=False,
        log=logs.append,
    )
    manifest = json.loads(Path(out, "data", "manifest.json").read_text())
    second = train(
        target,
        [data],
        out,
        config=train_config(max_steps=10),
        features=feature_config(max_tokens=1500),
        taps=TAPS,
        show_progress=False,
        log=logs.append,
    )
    assert (first.steps, second.steps) == (6, 10)
    assert any("resuming at step 6" in m for m in logs)
    assert json.loads(Path(out, "data", "manifest.json").read_text()) == manifest
    assert second.positions > first.positions
    # a time budget stops a run on its own
    third = train(
        target,
        [data],
        out,
        config=train_config(max_steps=None, time_budget=0.5),
        features=feature_config(max_tokens=1500),
        taps=TAPS,
        show_progress=False,
        log=logs.append,
    )
    assert third.steps > 10 and third.seconds - second.seconds < 20


def test_plain_text_without_generation(pair, tmp_path):
    _, target, _ = pair
    txt = tmp_path / "notes.txt"
    txt.write_text("abc def ghi jab cde\n\nfgh ija bcd efg hij abc\n\nxyz abc\n")
    out = str(tmp_path / "text")
    res = train(
        target,
        [str(txt)],
        out,
        config=train_config(max_steps=2, window=8, batch_tokens=16),
        features=feature_config(generate=False),
        taps=TAPS,
        show_progress=False,
        log=lambda m: None,
    )
    seqs = load_sequences(os.path.join(out, "data"))
    assert len(seqs) == 3 and all(s.loss_start == 0 for s in seqs)
    assert all(len(s.tokens) == len(s.taps) for s in seqs)
    assert all(s.taps.dtype == np.float16 for s in seqs)  # taps that fit take half the disk
    assert res.steps == 2


def _conversations(path, n: int, seed: int = 1) -> str:
    rng = random.Random(seed)

    def words() -> str:
        return " ".join(
            "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 5)))
            for _ in range(rng.randint(2, 12))
        )

    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            roles = ["user", "assistant", "user", "assistant"][: rng.choice([2, 4])]
            msgs = [{"role": r, "content": words()} for r in roles]
            fh.write(json.dumps({"messages": msgs}) + "\n")
    return str(path)


def _reply_rows(model, tokens) -> np.ndarray:
    """Rows whose token is a reply's text: after an assistant header's newline, up to its
    <|im_end|> (the last such row predicts it). Found by reading the tokens, not as the
    feature pass does."""
    start, end = (
        model.tokenize(t, add_special=False, parse_special=True)[0]
        for t in ("<|im_start|>", "<|im_end|>")
    )
    out = np.zeros(len(tokens), bool)
    role, in_header = "", False
    for p, tok in enumerate(tokens):
        piece = model.piece(int(tok))
        if tok == start:
            rest = b"".join(model.piece(int(t)) for t in tokens[p + 1 : p + 16])
            role, in_header = rest.split(b"\n")[0].decode(), True
        elif tok == end:
            role = ""
        elif in_header and piece.endswith(b"\n"):
            in_header = False
            continue
        out[p] = role == "assistant" and not in_header
    return out


def test_data_own_text_packs_sequences_and_labels_only_replies(pair, tmp_path):
    """The data's own conversations (--no-generate) are packed several to a batch in one
    shared KV stream. Each sequence still gets exactly what a lone decode gives it, and labels
    (and their output rows) only where an assistant turn is, the later ones included."""
    _, target, _ = pair
    data = _conversations(tmp_path / "talk.jsonl", 24)
    out = str(tmp_path / "own")
    train(
        target,
        [data],
        out,
        config=train_config(max_steps=0),
        features=feature_config(generate=False),
        taps=TAPS,
        show_progress=False,
        log=lambda m: None,
    )
    seqs = load_sequences(os.path.join(out, "data"))
    assert len(seqs) == 24
    lengths = [len(s.taps) for s in seqs]
    assert sum(lengths) > 2 * max(lengths)  # short enough that batches hold several
    t = Target(target, RuntimeOptions(n_ctx=512, n_batch=512, n_threads=2))
    try:
        t.enable_taps(TAPS)
        multi_turn = 0
        for s in seqs:
            n = len(s.taps)
            t.clear()
            logits = t.decode([int(x) for x in s.tokens[:n]], all_logits=True).copy()
            np.testing.assert_allclose(s.taps.astype(np.float32), t.read_taps(n), atol=2e-2)
            np.testing.assert_array_equal(s.labelled, _reply_rows(t.model, s.tokens[:n]))
            rows = np.flatnonzero(s.labelled)
            assert (s.label_ids[rows, 0] == logits[rows].argmax(-1)).mean() > 0.98
            assert (s.label_ids[~s.labelled] == 0).all()
            # a second assistant turn after a user turn: labelled, unlabelled, labelled again
            multi_turn += int(np.count_nonzero(np.diff(s.labelled.astype(int)) == 1) == 2)
        assert multi_turn > 3
    finally:
        t.close()


def test_taps_beyond_float16_are_kept_whole(tmp_path):
    """Gemma's residual stream reaches ~1e5 at the first position, past float16's 65504: such
    a shard is stored in float32, and its taps equal a plain decode's (no inf)."""
    rng = np.random.default_rng(3)
    embd = (rng.standard_normal((tm.N_VOCAB, 64)) * 1e5).astype(np.float32)
    target = tm.write_target(str(tmp_path / "loud.gguf"), weights={"token_embd.weight": embd})
    txt = tmp_path / "notes.txt"
    txt.write_text("abc def ghi jab cde fgh ija bcd\n\nefg hij abc xyz abc def\n")
    out = str(tmp_path / "loud")
    train(
        target,
        [str(txt)],
        out,
        config=train_config(max_steps=0),
        features=feature_config(generate=False),
        taps=TAPS,
        show_progress=False,
        log=lambda m: None,
    )
    seqs = load_sequences(os.path.join(out, "data"))
    assert len(seqs) == 2
    t = Target(target, RuntimeOptions(n_ctx=512, n_batch=512, n_threads=2))
    try:
        t.enable_taps(TAPS)
        for s in seqs:
            t.clear()
            t.decode([int(x) for x in s.tokens[: len(s.taps)]], all_logits=True)
            want = t.read_taps(len(s.taps))
            assert np.abs(want).max() > 65504  # the case under test
            assert s.taps.dtype == np.float32 and np.isfinite(s.taps).all()
            np.testing.assert_allclose(s.taps, want, rtol=1e-6)
    finally:
        t.close()


def test_bad_input_is_one_clear_error(pair, tmp_path, capsys):
    folder, target, data = pair
    with pytest.raises(LocalspecError, match="no such data file"):
        train(
            target,
            [str(tmp_path / "missing.jsonl")],
            str(tmp_path / "a"),
            taps=TAPS,
            show_progress=False,
        )
    with pytest.raises(InvalidParameterError, match="variant"):
        train(
            target,
            [data],
            str(tmp_path / "b"),
            config=train_config(variant="eagle4"),
            features=feature_config(max_tokens=300),
            taps=TAPS,
            show_progress=False,
        )
    with pytest.raises(InvalidParameterError, match="prompt_context"):
        train(
            target,
            [data],
            str(tmp_path / "pc"),
            config=train_config(prompt_context=-1),
            features=feature_config(max_tokens=300),
            taps=TAPS,
            show_progress=False,
        )
    with pytest.raises(InvalidParameterError, match="3 taps"):
        train(target, [data], str(tmp_path / "c"), taps=(1, 2), show_progress=False)
    with pytest.raises(InvalidParameterError, match=">= 1"):
        train(
            target,
            [data],
            str(tmp_path / "d"),
            taps=(0, 1, 2),
            config=train_config(),
            features=feature_config(max_tokens=300),
            show_progress=False,
        )
    # data made for another target is refused, not mixed in
    other = tm.write_target(str(tmp_path / "other.gguf"), seed=4)
    out = str(tmp_path / "e")
    train(
        target,
        [data],
        out,
        config=train_config(max_steps=1),
        features=feature_config(max_tokens=300),
        taps=TAPS,
        show_progress=False,
        log=lambda m: None,
    )
    with pytest.raises(LocalspecError, match="another target or other settings"):
        train(
            other,
            [data],
            out,
            config=train_config(max_steps=1),
            features=feature_config(max_tokens=300),
            taps=TAPS,
            show_progress=False,
        )
    # a torn state file: one message, and the data is kept
    with open(os.path.join(out, "state.pt"), "wb") as fh:
        fh.write(b"not a checkpoint")
    with pytest.raises(LocalspecError, match="cannot resume"):
        train(
            target,
            [data],
            out,
            config=train_config(max_steps=2),
            features=feature_config(max_tokens=300),
            taps=TAPS,
            show_progress=False,
        )
    assert os.path.isfile(os.path.join(out, "data", "manifest.json"))
    # the command line prints one line, no traceback
    rc = main(["train", target, "--data", str(tmp_path / "nope.json"), "-o", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert rc == 1 and "error: no such data file" in err and "Traceback" not in err
    rc = main(["train", target, "--data", data, "-o", str(tmp_path / "g"), "--time-budget", "x"])
    assert rc == 1 and "--time-budget" in capsys.readouterr().err


def test_cli_train_writes_a_checkpoint_and_gguf(pair, tmp_path, capsys):
    _, target, data = pair
    out = str(tmp_path / "cli")
    gg = str(tmp_path / "cli.eagle3.gguf")
    rc = main(
        [
            "train",
            target,
            "--data",
            data,
            "-o",
            out,
            "--max-steps",
            "3",
            "--taps",
            "1,2,3",
            "--max-tokens",
            "600",
            "--max-new",
            "20",
            "--parallel",
            "2",
            "--draft-vocab",
            "64",
            "--window",
            "32",
            "--batch-tokens",
            "64",
            "--gguf",
            gg,
            "--outtype",
            "f16",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "held-out tau(k=5)" in err and "verify passed" in err
    assert re.search(r"^data: \d+ records used, 0 skipped$", err, re.M)
    assert N.GGUFHeader(gg).architecture == "eagle3"
