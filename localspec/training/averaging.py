"""An exponential moving average of a drafter's weights, estimated and exported in place of
the last step's weights. Once the held-out curve is flat, single steps wander around the
optimum; their average tends to sit nearer it (docs/train.md measures it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import Eagle3Drafter

# the state's key for the average: {"weights": state_dict, "updates": n}
EMA_KEY = "ema"


def warmed_decay(decay: float, updates: int) -> float:
    """The decay of update number `updates` (0-based): small at first, so the average is not
    held at the starting weights for the ~1/(1 - decay) steps a plain EMA would take."""
    return min(decay, (1 + updates) / (10 + updates))


class WeightAverage:
    """The average of `model`'s weights over its optimizer steps; `model` itself keeps
    training. The average lives in a second drafter that shares the first one's token
    embeddings (a frozen buffer, the target's: not copied)."""

    def __init__(
        self, model: Eagle3Drafter, decay: float, saved: dict[str, Any] | None = None
    ) -> None:
        self.decay = decay
        self.model = type(model)(model.c, model.embed)
        self.model.to(next(model.parameters()).device)
        self.model.load_state_dict(saved["weights"] if saved else model.state_dict())
        self.model.requires_grad_(False)
        self.updates = int(saved["updates"]) if saved else 0
        live = dict(model.named_parameters())
        self._pairs = [(avg, live[name]) for name, avg in self.model.named_parameters()]

    def update(self) -> None:
        """Fold the trained model's current weights in (after each optimizer step)."""
        import torch

        w = 1.0 - warmed_decay(self.decay, self.updates)
        with torch.no_grad():
            for avg, live in self._pairs:
                avg.lerp_(live.detach().to(avg.dtype), w)
        self.updates += 1

    def state(self) -> dict[str, Any]:
        return {"weights": self.model.state_dict(), "updates": self.updates}


def exported_weights(state: dict[str, Any]) -> dict[str, Any]:
    """The weights a run's state file exports: its average where it kept one."""
    avg = state.get(EMA_KEY)
    return avg["weights"] if isinstance(avg, dict) and "weights" in avg else state["model"]
