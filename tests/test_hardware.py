"""The default thread count: one per physical core the process may use (llama.cpp's rule)."""

from __future__ import annotations

import os

from localspec import hardware


def _sysfs(tmp_path, siblings: dict[int, str]) -> str:
    for cpu, group in siblings.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(group + "\n")
    return str(tmp_path)


def test_smt_siblings_count_as_one_core(tmp_path, monkeypatch) -> None:
    # four logical CPUs, two cores with two hyper-threads each
    root = _sysfs(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    monkeypatch.setattr(hardware, "_allowed_cpus", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(hardware.sys, "platform", "linux")
    assert hardware.physical_cores(root) == 2
    # a process pinned to two siblings of one core gets one thread
    monkeypatch.setattr(hardware, "_allowed_cpus", lambda: [0, 2])
    assert hardware.physical_cores(root) == 1


def test_without_topology_every_allowed_cpu_counts(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(hardware, "_allowed_cpus", lambda: [0, 1, 2])
    monkeypatch.setattr(hardware.sys, "platform", "linux")
    assert hardware.physical_cores(str(tmp_path)) == 3


def test_the_engine_default_uses_it(models) -> None:
    from localspec.options import RuntimeOptions

    assert RuntimeOptions().checked().n_threads == hardware.physical_cores()
    assert 1 <= hardware.physical_cores() <= (os.cpu_count() or 1)
