"""What the machine offers: the default thread count (one per physical core, as llama.cpp)."""

from __future__ import annotations

import os
import subprocess
import sys


def physical_cores(sysfs: str = "/sys/devices/system/cpu") -> int:
    """Physical cores this process may run on. SMT siblings share a core's arithmetic units, so
    a thread per logical CPU oversubscribes them and decodes slower (llama.cpp's default is one
    thread per physical core too). Falls back to the logical count when the topology is unknown.
    """
    allowed = _allowed_cpus()
    if sys.platform.startswith("linux"):
        cores = set()
        for cpu in allowed:
            path = os.path.join(sysfs, f"cpu{cpu}", "topology", "thread_siblings_list")
            try:
                with open(path, encoding="ascii") as fh:
                    cores.add(fh.read().strip())
            except OSError:
                cores.add(f"cpu{cpu}")  # unknown topology: count it as its own core
        if cores:
            return len(cores)
    if sys.platform == "darwin":
        for key in ("hw.perflevel0.physicalcpu", "hw.physicalcpu"):  # performance cores first
            n = _sysctl_int(key)
            if n:
                return min(n, len(allowed))
    return max(1, len(allowed))


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _sysctl_int(key: str) -> int:
    try:
        out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
        return int(out.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU reports Intel AMX (Sapphire Rapids and later; Linux only)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return "amx_int8" in line.split()
    except OSError:
        pass
    return False


def cpu_extra_buffers() -> bool:
    """Whether llama.cpp may put CPU weights in its extra buffer types (AMX tiles, repacked
    layouts). llama.cpp's AMX matrix multiply crashes the process on some AMX machines (seen
    here: Q4_1 batches on a Xeon with amx_int8; llama.cpp issue 20824, closed unfixed), so on
    AMX CPUs they are off unless LOCALSPEC_CPU_EXTRA_BUFFERS=1; elsewhere on unless it is 0."""
    env = os.environ.get("LOCALSPEC_CPU_EXTRA_BUFFERS", "").strip()
    if env in ("0", "1"):
        return env == "1"
    return not cpu_has_amx()
