"""Auto's calibration is kept on disk per machine, build, files and settings: a second process
starts without timing the machine again; stale or corrupt files are replaced; recalibrate
forces a new timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import localspec
from localspec.auto import calibration

from conftest import EXACT

CHILD = """
import json, sys, localspec
from localspec.auto import calibration
calibration.OtherLoad.cores = lambda self: 0.0  # as conftest's _quiet_machine
opts = json.loads(sys.argv[3])
with localspec.load(sys.argv[1], draft=sys.argv[2], **opts) as eng:
    c = eng.complete("the quick brown fox", max_tokens=8)
print(json.dumps({"t_calibrate": c.stats.t_calibrate, "tokens": c.tokens}))
"""


def run_child(models, env) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, models["target"], models["draft"], json.dumps(EXACT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def stored(folder: str) -> list[str]:
    d = os.path.join(folder, "calibration")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def test_a_second_process_starts_without_calibrating(models, tmp_path) -> None:
    env = {**os.environ, "LOCALSPEC_CACHE_DIR": str(tmp_path)}
    first = run_child(models, env)
    assert first["t_calibrate"] > 0
    (name,) = stored(str(tmp_path))
    second = run_child(models, env)
    assert second["t_calibrate"] == 0.0 and second["tokens"] == first["tokens"]
    assert stored(str(tmp_path)) == [name]


def test_the_key_names_everything_the_timing_depends_on(models, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        assert eng.complete("hi", max_tokens=4).stats.t_calibrate > 0
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        assert eng.complete("hi", max_tokens=4).stats.t_calibrate == 0
    # another thread count, KV type or drafter file: timed again, stored beside
    for change in ({"n_threads": 1}, {"kv_type": "f16"}):
        with localspec.load(models["target"], draft=models["draft"], **{**EXACT, **change}) as e:
            assert e.complete("hi", max_tokens=4).stats.t_calibrate > 0
    with localspec.load(models["target"], draft=models["draft31"], **EXACT) as eng:
        assert eng.complete("hi", max_tokens=4).stats.t_calibrate > 0
    assert len(stored(str(tmp_path))) == 4
    data = read_json(os.path.join(tmp_path, "calibration", stored(str(tmp_path))[0]))
    key = data["key"]
    assert {"machine", "llama_cpp_python", "target", "drafter", "runtime"} <= set(key)
    assert {"n_threads", "n_gpu_layers", "kv_type", "flash_attn"} <= set(key["runtime"])
    assert {"size", "mtime_ns"} <= set(key["target"])


def test_corrupt_stale_and_forced_calibrations_are_replaced(models, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path))

    def t_calibrate(**kw) -> float:
        with localspec.load(models["target"], draft=models["draft"], **EXACT, **kw) as eng:
            return eng.complete("hi", max_tokens=4).stats.t_calibrate

    assert t_calibrate() > 0
    (name,) = stored(str(tmp_path))
    path = os.path.join(tmp_path, "calibration", name)
    for damage in (b"{not json", b'{"key": 1}', b""):
        with open(path, "wb") as fh:
            fh.write(damage)
        assert t_calibrate() > 0  # ignored, timed again
        assert read_json(path)["verify"]  # and replaced by a valid file
    data = read_json(path)
    data["created"] = time.time() - calibration.MAX_AGE_S - 60
    with open(path, "w") as fh:
        json.dump(data, fh)
    assert t_calibrate() > 0  # stale
    assert t_calibrate() == 0
    assert t_calibrate(recalibrate=True) > 0  # forced (the CLI's --recalibrate)
    assert t_calibrate() == 0


def test_an_unwritable_cache_folder_is_not_an_error(models, tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(blocker))
    with localspec.load(models["target"], draft=models["draft"], **EXACT) as eng:
        assert eng.complete("hi", max_tokens=4).stats.t_calibrate > 0


def test_a_call_with_auto_on_a_fixed_k_engine_can_be_timed_first(models) -> None:
    """An engine whose own calls draft a fixed chain has nothing pending, but a call that asks
    for auto does (the chat's /k auto, a server request): calibration_due and calibrate take
    the call's settings, so the wait can be shown before that call."""
    with localspec.load(models["target"], draft=models["draft"], n_draft=3, **EXACT) as eng:
        assert not eng.calibration_pending
        assert not eng.calibrate()  # nothing to time for the engine's own calls
        assert eng.calibration_due(n_draft="auto")
        seen: list[float] = []
        assert eng.calibrate(seen.append, n_draft="auto")
        assert seen and seen[-1] == 1.0
        assert not eng.calibration_due(n_draft="auto")
        c = eng.complete("the quick brown fox", max_tokens=8, n_draft="auto")
        assert c.stats.t_calibrate == 0  # already timed
