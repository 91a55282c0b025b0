"""How auto's cost model times native work (see cost_clock)."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def cost_clock(offloaded: bool) -> Clock:
    """How auto times native work. On the CPU: the calling thread's CPU time. llama.cpp's
    calling thread computes its share of every decode and spins at its barriers, so this
    follows the decode's cost, while time spent waiting for the interpreter lock (another
    thread running Python: the chat app drawing) is not counted; a wall clock would charge
    that wait to every native call and make big batches look cheap per token. With layers on
    a GPU the thread sleeps while the device works, so there it is the wall clock."""
    return time.perf_counter if offloaded else time.thread_time
