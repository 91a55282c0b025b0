"""Training data that adds up: a run extended with more data keeps its held-out split and
resumes on all of it, stops after a number of passes, records a learning curve, can be judged
on another feature folder (or a folder of links to chosen shards), and trains with the LK
loss (checked against its formula)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localspec.errors import LocalspecError  # noqa: E402
from localspec.training import FeatureConfig, train  # noqa: E402
from localspec.training.evaluation import estimate_on  # noqa: E402
from localspec.training.features import load_sequences  # noqa: E402
from localspec.training.losses import step_losses  # noqa: E402
from localspec.training.trainer import Trainer  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402
from helpers.training import TAPS, feature_config, train_config, write_prompts  # noqa: E402


@pytest.fixture(scope="module")
def train_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("grow")
    target, _ = tm.write_agreeing_pair(str(d), head_noise=0.3, name="noisy")
    return str(d), target, write_prompts(str(d / "prompts.jsonl"), 48)


def _curve(out: str) -> list[dict]:
    with open(os.path.join(out, "curve.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _run(target, data, out, logs, taps=TAPS, **kw):
    tkw = {k: v for k, v in kw.items() if k != "max_tokens"}
    return train(
        target,
        [data],
        out,
        config=train_config(**tkw),
        features=feature_config(max_tokens=kw.get("max_tokens", 1500)),
        taps=taps,
        show_progress=False,
        log=logs.append,
    )


def test_more_data_extends_a_run_and_keeps_its_held_out_rows(train_pair, tmp_path):
    _, target, data = train_pair
    out = str(tmp_path / "grow")
    logs: list[str] = []
    _run(target, data, out, logs, max_steps=8, eval_every=4, max_tokens=1500)
    first = Trainer(target, out, train_config(max_steps=0), TAPS, log=logs.append)
    held_before = {s.key for s in first.held_seqs}
    n_before = len(first.train_seqs) + len(first.held_seqs)
    res = _run(target, data, out, logs, max_steps=16, eval_every=4, max_tokens=3000)
    assert res.steps == 16
    after = Trainer(target, out, train_config(max_steps=0), TAPS, log=logs.append)
    assert len(after.train_seqs) + len(after.held_seqs) > n_before  # the data grew
    # a sequence held out before is still held out; none moved into training
    assert held_before <= {s.key for s in after.held_seqs}
    assert any("the data grew" in m for m in logs)
    curve = _curve(out)
    assert curve[0]["positions"] == 0 and curve[0]["step"] == 0  # the untrained drafter
    assert [p["step"] for p in curve] == [0, 4, 8, 12, 16]
    positions = [p["positions"] for p in curve]
    assert positions == sorted(positions) and len(set(positions)) == 5
    # CPU time of training adds up across the two runs, and the data's own is recorded
    cpu = [p["cpu_seconds"] for p in curve]
    assert cpu == sorted(cpu) and cpu[-1] > cpu[1] > 0
    manifest = json.loads(Path(out, "data", "manifest.json").read_text())
    assert manifest["cpu_seconds"] > 0
    assert curve[-1]["unique_positions"] > curve[1]["unique_positions"]
    for p in curve:
        assert len(p["acc"]) == 4 and 1.0 <= p["tau"] <= 5.0
        # every held-out row of these short sequences sits at a position below 256
        assert p["tau_short"] == pytest.approx(p["tau"]) and p["tau_long"] is None


def test_epochs_stop_a_run_after_that_many_passes(train_pair, tmp_path):
    _, target, data = train_pair
    out = str(tmp_path / "epochs")
    res = _run(target, data, out, [], max_steps=None, max_epochs=1.5)
    tr = Trainer(target, out, train_config(max_steps=0), TAPS, log=lambda m: None)
    n = len(tr.train_data.windows)
    per_epoch = [  # batches per pass: each pass packs its own shuffle of the windows
        len(tr.train_data.batches(np.random.default_rng(e).permutation(n))) for e in (0, 1)
    ]
    assert tr.epoch == 1 and tr.cursor == int(np.ceil(0.5 * per_epoch[1]))
    assert res.steps == per_epoch[0] + tr.cursor
    # the run ended between two held-out estimates: its end is the curve's last point, once
    _run(target, data, out, [], max_steps=None, max_epochs=1.5)
    steps = [p["step"] for p in _curve(out)]
    assert res.steps % 20 and steps[-1] == res.steps and steps.count(res.steps) == 1
    assert _curve(out)[-1]["epoch"] == pytest.approx(1 + tr.cursor / per_epoch[1], abs=1e-4)


def test_eval_data_judges_on_another_folder(train_pair, tmp_path):
    _, target, data = train_pair
    judge = str(tmp_path / "judge")
    _run(target, data, judge, [], max_steps=0, max_tokens=800)
    out = str(tmp_path / "judged")
    _run(target, data, out, [], max_steps=2, eval_data=os.path.join(judge, "data"))
    tr = Trainer(
        target,
        out,
        train_config(max_steps=0, eval_data=os.path.join(judge, "data")),
        TAPS,
        log=print,
    )
    keys = {s.key for s in load_sequences(os.path.join(judge, "data"))}
    assert {s.key for s in tr.held_seqs} == keys
    assert len(tr.train_seqs) == len(load_sequences(os.path.join(out, "data")))


def test_a_runs_drafter_is_judged_on_any_folder_as_its_trainer_judges_it(train_pair, tmp_path):
    """estimate_on (scripts/held-out-on.py) rebuilds a run's drafter from its state file and
    judges it on every window of another feature folder: the numbers its own trainer reports
    on that folder as eval data; a state of another target is refused."""
    d, target, data = train_pair
    judge = str(tmp_path / "judge")
    _run(target, data, judge, [], max_steps=0, max_tokens=800)
    out = str(tmp_path / "judged")
    folder = os.path.join(judge, "data")
    _run(target, data, out, [], max_steps=6, eval_data=folder)
    cfg = train_config(
        max_steps=0, eval_data=folder, eval_batches=10_000, precision="fp32", device="cpu"
    )
    want = Trainer(target, out, cfg, TAPS, log=lambda m: None).evaluate()
    got = estimate_on(target, os.path.join(out, "state.pt"), folder)
    assert want.tau > 1.0  # a drafter that agrees somewhere: something to compare
    assert got.tau == pytest.approx(want.tau, rel=1e-6)
    assert got.acc == pytest.approx(want.acc, rel=1e-6)
    assert got.tau_walk == pytest.approx(want.tau_walk, rel=1e-6)
    assert got.accept_walk == pytest.approx(want.accept_walk, rel=1e-6)
    assert got.loss == pytest.approx(want.loss, rel=1e-5)
    deeper = tm.TargetShape(n_embd=tm.AGREE_EMBD, n_layer=6, n_head=4, n_head_kv=4, n_ff=32)
    other, _ = tm.write_agreeing_pair(d, name="other", shape=deeper)
    with pytest.raises(LocalspecError, match="another target"):
        estimate_on(other, os.path.join(out, "state.pt"), folder)
    with pytest.raises(LocalspecError, match="no such file"):
        estimate_on(target, os.path.join(out, "missing.pt"), folder)
    torn = tmp_path / "torn.pt"
    torn.write_bytes(Path(out, "state.pt").read_bytes()[:1000])
    with pytest.raises(LocalspecError, match="cannot read"):
        estimate_on(target, str(torn), folder)
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    with pytest.raises(LocalspecError, match="not the state file"):
        estimate_on(target, str(tmp_path / "foreign.pt"), folder)


def test_lk_loss_is_its_formula(train_pair, tmp_path):
    """The LK-hybrid loss of one batch (and the kl loss, its w = 1 case, which runs the
    fused head), against the formula computed by hand: per row
    w * CE + (1 - w) * (1 - alpha), alpha = sum over the target's labels of
    min(p_draft, p_target), w = exp(-3 alpha); steps weighted 0.8^j, mean over rows."""
    _, target, data = train_pair
    out = str(tmp_path / "lk")
    _run(target, data, out, [], max_steps=4, loss="lk")
    tr = Trainer(target, out, train_config(max_steps=0, loss="lk"), TAPS, log=lambda m: None)
    order = np.arange(len(tr.train_data.windows))
    t = tr.train_data.tensors(tr.train_data.batches(order)[0], "cpu")
    with torch.no_grad():
        got, _, _ = step_losses(tr.model, t, 4, "lk")
        kl, _, _ = step_losses(tr.model, t, 4, "kl")
        outs = tr.model.unroll(tr.model.encode(t["taps"]), t["tokens"], 4)
    W = t["W"]
    want, want_kl = 0.0, 0.0
    for j, h in enumerate(outs):
        p_draft = torch.softmax(tr.model.lm_head(h).detach().double(), -1).numpy()
        ids = t["ids"][:, j : j + W].numpy()
        p_t = np.exp(t["logp"][:, j : j + W].numpy().astype(np.float64))
        rows = t["valid"][:, j : j + W].numpy() & (np.arange(W)[None] < t["rows"].numpy()[:, None])
        terms, ces = [], []
        for b, c in zip(*np.nonzero(rows), strict=True):
            k = ids[b, c] >= 0
            if not k[0]:
                continue  # the target's choice is not draftable: not trained on
            pd = p_draft[b, c, ids[b, c][k]]
            pt = p_t[b, c][k]
            q = pt / pt.sum()
            ce = -(q * np.log(pd)).sum()
            alpha = np.minimum(pd, pt).sum()
            w = np.exp(-3.0 * alpha)
            terms.append(w * ce + (1 - w) * (1 - alpha))
            ces.append(ce)
        want += 0.8**j * np.mean(terms)
        want_kl += 0.8**j * np.mean(ces)
    assert float(got) == pytest.approx(want, rel=1e-4)
    assert float(kl) == pytest.approx(want_kl, rel=1e-4)  # the fused cross-entropy, too
    assert float(got) != pytest.approx(float(kl), rel=1e-3)  # the blend moved it
    # the blend weight carries no gradient: the head's gradient equals that of
    # w * CE + (1 - w) * (1 - alpha) with w held constant, and differs from w differentiated
    head = tr.model.lm_head.weight

    def head_grad(loss) -> torch.Tensor:
        (g,) = torch.autograd.grad(loss, head)
        return g

    g_lk = head_grad(step_losses(tr.model, t, 4, "lk")[0])
    g_ce = head_grad(step_losses(tr.model, t, 4, "kl")[0])
    held = _lk_by_hand(tr.model, t, 4, detach=True)
    free = _lk_by_hand(tr.model, t, 4, detach=False)
    scale = float(g_lk.abs().max())
    gap_held = float((g_lk - head_grad(held)).abs().max()) / scale
    gap_free = float((g_lk - head_grad(free)).abs().max()) / scale
    assert gap_held < 1e-4 and gap_free > 1e-2  # measured 1.6e-7 and 0.069
    assert float((g_lk - g_ce).abs().max()) / scale > 1e-2  # and it is not cross-entropy's


def _lk_by_hand(model, t, steps: int, *, detach: bool):
    """The LK-hybrid loss in torch, row by row as the formula reads, w detached or not."""
    W = t["W"]
    outs = model.unroll(model.encode(t["taps"]), t["tokens"], steps)
    total = 0.0
    for j, h in enumerate(outs):
        rows = t["valid"][:, j : j + W] & (torch.arange(W)[None] < t["rows"][:, None])
        ids = t["ids"][:, j : j + W][rows]
        p_t = t["logp"][:, j : j + W][rows].exp()
        keep = ids[:, 0] >= 0
        ids, p_t = ids[keep], p_t[keep]
        ok = ids >= 0
        logp_d = model.lm_head(h[rows][keep]).float().log_softmax(-1).gather(-1, ids.clamp(0))
        p_d = logp_d.exp()
        p_t = p_t * ok
        q = p_t / p_t.sum(-1, keepdim=True)
        ce = -(q * logp_d).sum(-1)
        alpha = torch.minimum(p_d * ok, p_t).sum(-1)
        w = torch.exp(-3.0 * (alpha.detach() if detach else alpha))
        total = total + 0.8**j * (w * ce + (1 - w) * (1 - alpha)).mean()
    return total


def test_bf16_training_keeps_float32_weights(train_pair, tmp_path):
    """--precision bf16 runs the matmuls in bfloat16 (autocast) and keeps float32 master
    weights, so the checkpoint converts like any other."""
    from safetensors.numpy import load_file

    _, target, data = train_pair
    out = str(tmp_path / "bf16")
    res = _run(target, data, out, [], max_steps=3, precision="bf16")
    tr = Trainer(target, out, train_config(max_steps=0, precision="bf16"), TAPS, log=lambda m: None)
    assert tr.precision == "bf16" and res.steps == 3
    weights = load_file(os.path.join(out, "checkpoint", "model.safetensors"))
    assert weights["fc.weight"].dtype == np.float32 and np.isfinite(weights["fc.weight"]).all()
    # auto picks bf16 only for widths where it pays (this test model's 288 is not one)
    assert (
        Trainer(target, out, train_config(max_steps=0), TAPS, log=lambda m: None).precision
        == "fp32"
    )


def test_eval_data_must_match_the_run(train_pair, tmp_path):
    """--eval-data from other taps, or the run's own data, is one clear error."""
    from localspec.errors import InvalidParameterError, LocalspecError

    _, target, data = train_pair
    out = str(tmp_path / "mine")
    _run(target, data, out, [], max_steps=0, max_tokens=800)
    os.remove(os.path.join(out, "state.pt"))  # data only: a new run in this folder
    own = os.path.join(out, "data")
    with pytest.raises(InvalidParameterError, match="own training data"):
        Trainer(target, out, train_config(max_steps=0, eval_data=own), TAPS, log=lambda m: None)
    other = str(tmp_path / "other")
    _run(target, data, other, [], taps=(2, 1, 3), max_steps=0, max_tokens=800)
    with pytest.raises(LocalspecError, match="other taps"):
        Trainer(
            target,
            out,
            train_config(max_steps=0, eval_data=os.path.join(other, "data")),
            TAPS,
            log=lambda m: None,
        )


def test_a_run_goes_on_from_another_runs_drafter(train_pair, tmp_path):
    """--init-from: a run starts from another run's drafter (its weights and draft
    vocabulary, a fresh optimizer, positions from zero) and trains it on its own data; once
    it saved a state of its own, that state resumes and still names its parent, and a folder
    holding a run started otherwise refuses a new parent. A drafter of another target, taps,
    variant or draft vocabulary size, or a file that is no run's state, is refused with one
    clear error before any data is made."""
    d, target, data = train_pair
    parent = str(tmp_path / "parent")
    _run(target, data, parent, [], max_steps=6)
    st = torch.load(os.path.join(parent, "state.pt"), weights_only=False)
    other_data = write_prompts(str(tmp_path / "other.jsonl"), 24, seed=7)
    fresh = str(tmp_path / "fresh")  # data, no state of its own
    _run(target, other_data, fresh, [], max_steps=0)
    os.remove(os.path.join(fresh, "state.pt"))
    logs: list[str] = []
    first = Trainer(
        target, fresh, train_config(max_steps=0, init_from=parent), TAPS, log=logs.append
    )
    assert (first.step, first.positions, first.parent_positions) == (0, 0, st["positions"])
    assert not first.opt.state_dict()["state"]  # a fresh optimizer
    assert np.array_equal(first.draft_ids, st["draft_ids"])
    for name, w in first.model.state_dict().items():
        assert torch.equal(w, st["model"][name]), name
    assert any("starting from the drafter of" in m for m in logs)

    child = str(tmp_path / "child")
    res = _run(target, other_data, child, logs, max_steps=4, init_from=parent)
    assert res.steps == 4
    meta = json.loads(Path(child, "checkpoint", "config.json").read_text())["localspec"]
    assert meta["init_from"] == os.path.abspath(parent)
    assert meta["parent_positions"] == st["positions"]
    # resumed without the flag: its own state, which still names the parent
    again = Trainer(target, child, train_config(max_steps=0), TAPS, log=logs.append)
    moved = any(not torch.equal(w, st["model"][n]) for n, w in again.model.state_dict().items())
    assert moved and again.step == 4 and again.cfg.init_from == os.path.abspath(parent)
    elsewhere = train_config(max_steps=0, init_from=str(tmp_path / "elsewhere"))
    for folder, named in ((child, "parent"), (parent, "the target")):
        with pytest.raises(LocalspecError, match=f"already holds a run started from .*{named}"):
            Trainer(target, folder, elsewhere, TAPS)
    # a grandchild counts every position behind it
    child_positions = torch.load(os.path.join(child, "state.pt"), weights_only=False)["positions"]
    grand = Trainer(
        target, fresh, train_config(max_steps=0, init_from=child), TAPS, log=logs.append
    )
    assert grand.parent_positions == st["positions"] + child_positions

    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    for kw, err in (
        ({"variant": "eagle3"}, "pass the same --variant"),
        ({"draft_vocab": 32}, "pass --draft-vocab 64"),
        ({"init_from": str(tmp_path / "nowhere")}, "no such file"),
        ({"init_from": str(tmp_path / "foreign.pt")}, "not the state file"),
    ):
        cfg = train_config(max_steps=0, **{"init_from": parent, **kw})
        with pytest.raises(LocalspecError, match=err):
            Trainer(target, fresh, cfg, TAPS)
    with pytest.raises(LocalspecError, match="pass the same --taps"):
        _run(target, other_data, str(tmp_path / "taps"), [], taps=(1, 2, 2), max_steps=0,
             init_from=parent)  # fmt: skip
    assert not os.path.exists(tmp_path / "taps")  # refused before any data was made
    deeper = tm.TargetShape(n_embd=tm.AGREE_EMBD, n_layer=6, n_head=4, n_head_kv=4, n_ff=32)
    other, _ = tm.write_agreeing_pair(d, name="other-init", shape=deeper)
    with pytest.raises(LocalspecError, match="another target"):
        _run(other, other_data, str(tmp_path / "other"), [], max_steps=0, init_from=parent)


def test_a_run_goes_on_from_a_drafter_gguf(train_pair, tmp_path):
    """--init-from DRAFTER.gguf (the shipped drafter, or any converted one; run folders stay on
    the machine that made them): the trainer's drafter computes what the parent run's did,
    from the GGUF's tensors (q/k rows back to rotate-half with their own head counts, on a
    grouped-query target; the folded per-tap norms as fc with unit norms), with its draft
    vocabulary. A GGUF made for another target, or a file that is no drafter, is refused
    with one clear error before any data is made."""
    from localspec.converters.convert import convert

    d, other, data = train_pair
    gqa = tm.TargetShape(n_embd=tm.AGREE_EMBD, n_layer=6, n_head=4, n_head_kv=2, n_ff=32)
    target, _ = tm.write_agreeing_pair(d, name="gqa-gguf", shape=gqa, head_noise=0.3)
    parent = str(tmp_path / "parent")
    _run(target, data, parent, [], max_steps=6)
    gguf_path = str(tmp_path / "parent.eagle3.gguf")
    convert(os.path.join(parent, "checkpoint"), target, gguf_path, outtype="f32", log=print)
    fresh = str(tmp_path / "fresh")  # data, no state of its own
    _run(target, write_prompts(str(tmp_path / "other.jsonl"), 24, seed=7), fresh, [], max_steps=0)
    os.remove(os.path.join(fresh, "state.pt"))
    logs: list[str] = []
    run = Trainer(target, parent, train_config(max_steps=0), TAPS, log=logs.append)
    child = Trainer(
        target, fresh, train_config(max_steps=0, init_from=gguf_path), TAPS, log=logs.append
    )
    assert np.array_equal(child.draft_ids, run.draft_ids)
    assert (child.step, child.positions, child.parent_positions) == (0, 0, 0)
    assert any("positions seen not recorded" in m for m in logs)
    a, b = run.model.eval(), child.model.eval()
    assert a.midlayer.self_attn.n_kv == 2 and a.midlayer.self_attn.n_head == 4
    taps = torch.randn(2, 9, 3 * a.c.target_hidden_size) * 3.0
    nxt = torch.randint(0, a.c.vocab_size, (2, 11))
    with torch.no_grad():
        for ha, hb in zip(a.unroll(a.encode(taps), nxt, 3), b.unroll(b.encode(taps), nxt, 3),
                          strict=True):  # fmt: skip
            torch.testing.assert_close(b.lm_head(hb), a.lm_head(ha), atol=1e-4, rtol=1e-4)

    for tgt, init, err in (
        (other, gguf_path, "made for a target with|the trainer's drafter for"),
        (target, target, "not an EAGLE-3"),
    ):
        with pytest.raises(LocalspecError, match=err):
            _run(tgt, data, str(tmp_path / "x"), [], max_steps=0, init_from=init)
        assert not os.path.exists(tmp_path / "x")  # refused before any data was made


def test_generated_data_reaches_max_tokens_when_replies_end_early(
    train_pair, tmp_path, monkeypatch
):
    """Each reply in flight reserves a full --max-new of the budget; one that ends early (an
    end-of-generation token) gives back what it did not use, so the data reaches
    --max-tokens instead of stopping short by every early end."""
    from localspec import native as N

    _, target, data = train_pair
    real = N.NativeModel.eog_mask
    # a few common ids end a reply too: replies stop at uneven, mostly early points
    monkeypatch.setattr(N.NativeModel, "eog_mask", lambda self: real(self) | (
        np.arange(self.n_vocab) % 5 == 2))  # fmt: skip
    out = str(tmp_path / "early")
    _run(target, data, out, [], max_steps=0, max_tokens=1500)
    seqs = load_sequences(os.path.join(out, "data"))
    new = [int(s.labelled.sum()) for s in seqs]
    assert min(new) < 40 - 5, new  # replies did end early (max_new is 40)
    manifest = json.loads(Path(out, "data", "manifest.json").read_text())
    made = manifest["n_tokens"]
    assert len(manifest["done"]) < 48  # the prompts were not used up: the budget stopped it
    # at least what was asked, and at most one more sequence (its prompt and reply) over it
    assert 1500 <= made < 1500 + FeatureConfig(taps=TAPS).max_prompt + 40, made


def test_a_resumed_run_is_judged_on_the_rows_it_was_judged_on(train_pair, tmp_path, monkeypatch):
    """Resumed without --eval-data (e.g. to add data), a run keeps the eval folder it was
    started with; another folder, or one for a run judged on its own 3%, is refused: one
    curve never mixes estimates on different rows."""
    _, target, data = train_pair
    judges = []
    for name, seed in (("judge", 3), ("judge2", 4)):
        _run(target, write_prompts(str(tmp_path / f"{name}.jsonl"), 8, seed=seed),
             str(tmp_path / name), [], max_steps=0, max_tokens=400)  # fmt: skip
        judges.append(os.path.join(tmp_path, name, "data"))
    out = str(tmp_path / "judged")
    _run(target, data, out, [], max_steps=2, eval_data=judges[0])
    again = Trainer(target, out, train_config(max_steps=0), TAPS, log=lambda m: None)
    assert again.cfg.eval_data == judges[0]
    assert {s.key for s in again.held_seqs} == {s.key for s in load_sequences(judges[0])}
    with pytest.raises(LocalspecError, match="holds a run judged on .*judge/data"):
        Trainer(target, out, train_config(max_steps=0, eval_data=judges[1]), TAPS)
    # refused before any data is made, too
    before = Path(out, "data", "manifest.json").read_text()
    with pytest.raises(LocalspecError, match="holds a run judged on"):
        _run(target, data, out, [], max_steps=0, max_tokens=5000, eval_data=judges[1])
    assert Path(out, "data", "manifest.json").read_text() == before
    # the same folder, named from another working directory, is the same folder
    monkeypatch.chdir(tmp_path)
    same = Trainer(target, out, train_config(max_steps=0, eval_data="judge/data"), TAPS)
    assert same.cfg.eval_data == judges[0]
    own = str(tmp_path / "own")
    _run(target, data, own, [], max_steps=1)
    with pytest.raises(LocalspecError, match="judged on 3% of its own data"):
        Trainer(target, own, train_config(max_steps=0, eval_data=judges[0]), TAPS)
    # a run that only made data (no step trained) takes the eval folder it is given, and its
    # untrained estimate and curve start again on those rows
    made = str(tmp_path / "made")
    _run(target, data, made, [], max_steps=0)
    res = _run(target, data, made, [], max_steps=1, eval_data=judges[0])
    rows = _curve(made)
    assert [r["step"] for r in rows] == [0, 1], rows
    judged = Trainer(target, made, train_config(max_steps=0), TAPS, log=lambda m: None)
    assert judged.cfg.eval_data == judges[0]
    assert rows[0]["tau"] == pytest.approx(res.untrained.tau)


def test_an_interrupted_run_says_it_saved_and_resumes_there(train_pair, tmp_path):
    """Ctrl-C (or kill: the CLI turns SIGTERM into the same) mid-run saves the state and the
    checkpoint, says so in one line, and the same run goes on from that step."""
    _, target, data = train_pair
    out = str(tmp_path / "stopped")
    _run(target, data, out, [], max_steps=0, max_tokens=800)
    logs: list[str] = []
    tr = Trainer(target, out, train_config(max_steps=20, eval_every=1000), TAPS, log=logs.append)

    def stop_at_3(rec: dict) -> None:
        if rec["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tr.run(stop_at_3)
    said = [m for m in logs if m.startswith("interrupted at step 3 ")]
    assert len(said) == 1 and "the same command resumes" in said[0]
    assert os.path.isfile(os.path.join(out, "checkpoint", "model.safetensors"))
    again = Trainer(target, out, train_config(max_steps=5, eval_every=1000), TAPS, log=logs.append)
    assert again.step == 3
    assert again.run().steps == 5
    assert not any(m.startswith("interrupted at step 5") for m in logs)


def test_link_shards_makes_a_folder_of_chosen_shards(train_pair, tmp_path):
    """scripts/link-shards.py: a data folder of links to chosen shards of other folders reads
    as exactly those shards' sequences, in the order asked for, and a run trains on it as it
    is (adding no data of its own); bad choices are refused with one line, not a traceback."""
    _, target, data = train_pair
    fcfg = feature_config(max_tokens=800, shard_tokens=150)
    src = str(tmp_path / "src")
    kw = {"taps": TAPS, "show_progress": False, "log": lambda m: None}
    train(target, [data], src, config=train_config(max_steps=0), features=fcfg, **kw)
    folder = os.path.join(src, "data")
    names = json.loads(Path(folder, "manifest.json").read_text())["shards"]
    assert len(names) >= 3  # something to pick from

    def shard_tokens(name: str) -> list[list[int]]:
        with np.load(os.path.join(folder, name)) as z:
            toks, off = z["tokens"], z["tok_offsets"]
        return [toks[off[i] : off[i + 1]].tolist() for i in range(len(off) - 1)]

    script = str(Path(__file__).parents[2] / "scripts" / "link-shards.py")

    def link(out: str, *sources: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, script, out, *sources], capture_output=True, text=True
        )

    mix = str(tmp_path / "mix")
    assert link(os.path.join(mix, "data"), f"{folder}:^0-1", f"{src}:0-1").returncode == 0
    got = [s.tokens.tolist() for s in load_sequences(os.path.join(mix, "data"))]
    order = names[2:] + names[:2]
    assert got == [t for n in order for t in shard_tokens(n)]
    some = str(tmp_path / "some")
    assert link(some, f"{folder}:0,2").returncode == 0
    got = [s.tokens.tolist() for s in load_sequences(some)]
    assert got == shard_tokens(names[0]) + shard_tokens(names[2])

    # all shards linked (in another order): a run on them adds none and trains on them all
    linked = load_sequences(os.path.join(mix, "data"))
    again = feature_config(max_tokens=1, shard_tokens=150)
    assert (
        train(target, [data], mix, config=train_config(max_steps=2), features=again, **kw).steps
        == 2
    )
    assert len(json.loads(Path(mix, "data", "manifest.json").read_text())["shards"]) == len(names)
    tr = Trainer(target, mix, train_config(max_steps=0), TAPS, log=lambda m: None)
    assert len(tr.train_seqs) + len(tr.held_seqs) == len(linked)

    for sources, says in (
        ([f"{folder}:{len(names)}"], f"the folder has {len(names)}"),
        ([f"{folder}:3-1"], "runs backwards"),
        ([f"{folder}:x"], "no readable manifest.json"),
        ([str(tmp_path / "nowhere")], "no readable manifest.json"),
        ([folder], "one of the sources"),
    ):
        out = folder if says == "one of the sources" else str(tmp_path / "bad")
        bad = link(out, *sources)
        assert bad.returncode != 0 and says in bad.stderr and "Traceback" not in bad.stderr
