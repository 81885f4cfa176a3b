"""The lax.while_loop machine that runs a lowered StackProgram on a batch."""
from pcbatch.runtime.config import MachineConfig, Status
from pcbatch.runtime.run import run_machine

__all__ = ["MachineConfig", "Status", "run_machine"]
