"""--ema: a run keeps an exponential moving average of its weights, checked against the
average recomputed by hand from every step's weights; the average is what the run estimates,
exports, resumes, judges with estimate_on and hands to a child run, and an absurd decay is one
clear error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from localspec.cli import main  # noqa: E402
from localspec.converters.checkpoint import load_tensors  # noqa: E402
from localspec.errors import InvalidParameterError  # noqa: E402
from localspec.training import train  # noqa: E402
from localspec.training.evaluation import estimate_on  # noqa: E402
from localspec.training.trainer import Trainer  # noqa: E402

from helpers import tinymodels as tm  # noqa: E402
from helpers.training import TAPS, feature_config, train_config, write_prompts  # noqa: E402

DECAY = 0.3  # the warm-up term (1 + n) / (10 + n) passes it at n = 3: both branches run


@pytest.fixture(scope="module")
def avg_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("average")
    target, _ = tm.write_agreeing_pair(str(d), head_noise=0.3, name="noisy")
    data = write_prompts(str(d / "prompts.jsonl"), 32)
    made = str(d / "made")  # data only: each test copies nothing, it trains in its own folder
    train(target, [data], made, config=train_config(max_steps=0),
          features=feature_config(max_tokens=1200), taps=TAPS, show_progress=False,
          log=lambda m: None)  # fmt: skip
    return target, os.path.join(made, "data")


def _folder(tmp_path: Path, data: str, name: str) -> str:
    out = tmp_path / name
    out.mkdir()
    os.symlink(data, out / "data")
    return str(out)


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_average_is_the_ema_of_every_steps_weights(avg_pair, tmp_path):
    target, data = avg_pair
    out = _folder(tmp_path, data, "ema")
    tr = Trainer(target, out, train_config(max_steps=9, eval_every=4, ema=DECAY), TAPS, log=_quiet)
    start = _weights(tr.model)
    seen: list[dict[str, torch.Tensor]] = []
    evaluated: list[float] = []
    real_evaluate = tr.evaluate

    def judged():
        ev = real_evaluate()
        evaluated.append(ev.loss)
        return ev

    tr.evaluate = judged
    res = tr.run(lambda rec: seen.append(_weights(tr.model)))
    assert res.steps == 9 and len(seen) == 9
    # by hand: avg <- d * avg + (1 - d) * w after update n, d = min(DECAY, (1 + n) / (10 + n))
    want = {k: v.double() for k, v in start.items()}
    for n, w in enumerate(seen):
        d = min(DECAY, (1 + n) / (10 + n))
        want = {k: d * want[k] + (1 - d) * w[k].double() for k in want}
    got = dict(tr.average.model.named_parameters())
    for k, v in want.items():
        assert torch.allclose(got[k].double(), v, atol=1e-6), k
    # the check can fail: the last step's weights are elsewhere
    assert any(not torch.allclose(seen[-1][k].double(), v, atol=1e-4) for k, v in want.items())

    # the checkpoint holds the average, and says it does
    ckpt = os.path.join(out, "checkpoint")
    tensors = load_tensors(ckpt)
    for k, v in want.items():
        assert torch.allclose(tensors[k].double(), v, atol=1e-6), k
    meta = json.loads(Path(ckpt, "config.json").read_text())["localspec"]
    assert meta["ema"] == {"decay": DECAY, "updates": 9}
    # and so does the speculators export (vLLM's layout: the decoder layer renamed)
    spec = load_tensors(os.path.join(out, "speculators"))
    assert torch.allclose(spec["fc.weight"].double(), want["fc.weight"], atol=1e-6)

    # estimates judge the average alone: the raw weights can be anything
    tr.evaluate = real_evaluate
    before = tr.evaluate()
    assert len(evaluated) == 4  # the start, steps 4 and 8, and the run's end
    assert before.loss == pytest.approx(evaluated[-1], rel=1e-9) == res.final.loss
    with torch.no_grad():
        for p in tr.model.parameters():
            if p.requires_grad:
                p.zero_()
    assert tr.evaluate().loss == pytest.approx(before.loss, rel=1e-9)
    # estimate_on judges the average a state file keeps, not its last step's weights
    state = os.path.join(out, "state.pt")
    st = torch.load(state, weights_only=False)
    as_model = _resaved(tmp_path, st, "as-model.pt", model=st["ema"]["weights"])
    raw = _resaved(tmp_path, st, "raw.pt")
    got = estimate_on(target, state, data)
    assert got.loss == pytest.approx(estimate_on(target, as_model, data).loss, rel=1e-9)
    assert got.loss != pytest.approx(estimate_on(target, raw, data).loss, rel=1e-6)


def _quiet(message: str) -> None:
    pass


def _resaved(tmp_path: Path, st: dict, name: str, **changes) -> str:
    """A copy of a state file without its average (changes: keys to replace)."""
    path = str(tmp_path / name)
    torch.save({k: v for k, v in st.items() if k != "ema"} | changes, path)
    return path


def test_a_resumed_run_goes_on_with_its_average(avg_pair, tmp_path):
    """Stopped after 4 steps and resumed to 8 (without --ema: the run's own decay holds),
    the average is the one an unbroken 8-step run keeps (resume itself is exact: the same
    data order and optimizer state). --ema 0 drops it and says so; a run that turns --ema on
    later starts its average at the weights it resumes."""
    target, data = avg_pair
    whole = _folder(tmp_path, data, "whole")
    Trainer(
        target, whole, train_config(max_steps=8, eval_every=1000, ema=DECAY), TAPS, _quiet
    ).run()
    split = _folder(tmp_path, data, "split")
    Trainer(
        target, split, train_config(max_steps=4, eval_every=1000, ema=DECAY), TAPS, _quiet
    ).run()
    resumed = Trainer(target, split, train_config(max_steps=8, eval_every=1000), TAPS, _quiet)
    assert resumed.cfg.ema == DECAY and resumed.average.updates == 4
    resumed.run()
    a = dict(resumed.average.model.named_parameters())
    b = torch.load(os.path.join(whole, "state.pt"), weights_only=False)["ema"]
    assert b["updates"] == 8
    for k, v in a.items():
        assert torch.allclose(v, b["weights"][k], atol=1e-6), k

    logs: list[str] = []
    off = Trainer(target, split, train_config(max_steps=8, ema=0.0), TAPS, logs.append)
    assert off.average is None and off.drafter is off.model
    assert any("kept an average of its weights; with --ema 0 it is dropped" in m for m in logs)

    late = _folder(tmp_path, data, "late")
    Trainer(target, late, train_config(max_steps=3, eval_every=1000), TAPS, _quiet).run()
    assert Trainer(target, late, train_config(max_steps=3), TAPS, _quiet).average is None
    on = Trainer(target, late, train_config(max_steps=3, ema=DECAY), TAPS, _quiet)
    assert on.average.updates == 0
    for k, v in on.average.model.state_dict().items():
        assert torch.equal(v, on.model.state_dict()[k]), k


def test_a_child_run_starts_from_its_parents_average(avg_pair, tmp_path):
    target, data = avg_pair
    parent = _folder(tmp_path, data, "parent")
    Trainer(
        target, parent, train_config(max_steps=5, eval_every=1000, ema=DECAY), TAPS, _quiet
    ).run()
    st = torch.load(os.path.join(parent, "state.pt"), weights_only=False)
    child = _folder(tmp_path, data, "child")
    for ema in (0.0, DECAY):
        tr = Trainer(
            target, child, train_config(max_steps=0, init_from=parent, ema=ema), TAPS, _quiet
        )
        for k, v in tr.model.state_dict().items():
            assert torch.equal(v, st["ema"]["weights"][k]), k
        if ema:  # its own average starts there, counting from zero
            assert tr.average.updates == 0
    assert any(not torch.equal(v, st["model"][k]) for k, v in st["ema"]["weights"].items())


def test_an_absurd_decay_is_one_clear_error(avg_pair, tmp_path, capsys):
    target, data = avg_pair
    out = _folder(tmp_path, data, "bad")
    for decay in (1.0, -0.1, 2.0):
        with pytest.raises(InvalidParameterError, match="ema is a decay per step"):
            Trainer(target, out, train_config(max_steps=0, ema=decay), TAPS)
    # refused before any data is made, as every absurd setting is
    for kw, said in (({"ema": 1.5}, "ema is a decay per step"), ({"init": "bogus"}, "init")):
        never = str(tmp_path / f"never-{said[:4]}")
        with pytest.raises(InvalidParameterError, match=said):
            train(target, [str(tmp_path / "x.jsonl")], never, config=train_config(**kw),
                  features=feature_config(), taps=TAPS, show_progress=False,
                  log=_quiet)  # fmt: skip
        assert not os.path.exists(never)
    args = ["train", target, "--data", "x.jsonl", "-o", str(tmp_path / "cli"), "--ema", "1.5"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "ema is a decay per step" in err and "Traceback" not in err
