"""The default thread count: one per physical core the process may use (llama.cpp's rule)."""

from __future__ import annotations

import os
import sys

import pytest

from localspec.native import hardware


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


def _cpuinfo_cores(allowed: set[int]) -> int | None:
    """Physical cores among the allowed CPUs, counted from /proc/cpuinfo's (physical id,
    core id) pairs, a source independent of the sysfs files physical_cores reads; None where
    cpuinfo lacks them (ARM, macOS)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            blocks = fh.read().strip().split("\n\n")
    except OSError:
        return None
    cores = set()
    for block in blocks:
        fields: dict[str, str] = {}
        for ln in block.splitlines():
            key, sep, value = ln.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "core id" not in fields or "processor" not in fields:
            return None
        if int(fields["processor"]) in allowed:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def test_physical_cores_agree_with_cpuinfo() -> None:
    allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    expected = _cpuinfo_cores(allowed) if sys.platform.startswith("linux") else None
    if expected is None:
        pytest.skip("no core ids in /proc/cpuinfo here")
    assert hardware.physical_cores() == expected
    # the engine's default thread count is that count
    from localspec.options import RuntimeOptions

    assert RuntimeOptions().checked().n_threads == expected


def test_amx_cpus_run_without_llamas_extra_cpu_buffers(tmp_path, monkeypatch) -> None:
    """llama.cpp's AMX matrix multiply crashed the process on an AMX Xeon: extra buffer types
    are off where the CPU reports amx_int8, unless LOCALSPEC_CPU_EXTRA_BUFFERS says otherwise."""
    from localspec.native import hardware

    amx, plain = tmp_path / "amx", tmp_path / "plain"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f amx_bf16 amx_int8 amx_tile\n")
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n")
    assert hardware.cpu_has_amx(str(amx)) and not hardware.cpu_has_amx(str(plain))
    assert not hardware.cpu_has_amx(str(tmp_path / "missing"))
    for has_amx, env, want in [
        (True, None, False),
        (False, None, True),
        (True, "1", True),
        (False, "0", False),
        (True, "yes", False),  # not 0 or 1: the default for this CPU
    ]:
        monkeypatch.setattr(hardware, "cpu_has_amx", lambda has_amx=has_amx: has_amx)
        if env is None:
            monkeypatch.delenv("LOCALSPEC_CPU_EXTRA_BUFFERS", raising=False)
        else:
            monkeypatch.setenv("LOCALSPEC_CPU_EXTRA_BUFFERS", env)
        assert hardware.cpu_extra_buffers() is want, (has_amx, env)
