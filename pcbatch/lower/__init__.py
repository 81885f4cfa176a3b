"""Block IR (Figure 2) -> stack program (Figure 4): calls to PushJump/Return,
constants, liveness, variable classes, stacks, pop-push elimination, types."""
from pcbatch.lower.pipeline import lower, specialize

__all__ = ["lower", "specialize"]
