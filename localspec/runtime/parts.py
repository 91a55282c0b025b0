"""What an engine is made of: the objects one call of the speculative loop works on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..auto.scheduler import Scheduler
    from ..options import RuntimeOptions
    from ..speculation.probe import Probe
    from ..speculation.specstate import SpecState
    from .drafter import Drafter
    from .target import Target


@dataclass(frozen=True)
class Parts:
    """What an engine is made of."""

    target: Target
    drafter: Drafter | None
    scheduler: Scheduler
    rt: RuntimeOptions
    eog: np.ndarray  # per token id: True for end-of-generation tokens
    max_tree: int  # the most tree nodes one verify batch holds (0: chains only)
    max_top_k: int  # the widest tree frontier the drafter's batch holds
    state: SpecState  # the one owner of what the caches, the taps and the n-gram index hold
    probe: Probe  # times the state's operations
