"""pcbatch: program-counter autobatching for JAX.

Write a recursive, control-heavy function for ONE example; decorate it with
`@pcbatch.autobatch`; call it on a batch. It runs as a single `lax.while_loop`.
"""
from pcbatch.api import Autobatched, autobatch
from pcbatch.options import Options
from pcbatch.runtime.options import Tuning
from pcbatch.errors import (
    ArgumentError,
    DtypeOverflowError,
    ExampleError,
    ForwardModeError,
    MaxStepsExceededError,
    MaybeUnboundWarning,
    TypeJoinWarning,
    OptionError,
    PcbatchError,
    StackOverflowError,
    TapeOverflowError,
    TypeMismatchError,
    UnsupportedSyntaxError,
)
from pcbatch.sharding import sharded

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Autobatched",
    "DtypeOverflowError",
    "ExampleError",
    "ForwardModeError",
    "MaxStepsExceededError",
    "MaybeUnboundWarning",
    "TypeJoinWarning",
    "OptionError",
    "Options",
    "PcbatchError",
    "StackOverflowError",
    "TapeOverflowError",
    "Tuning",
    "TypeMismatchError",
    "UnsupportedSyntaxError",
    "autobatch",
    "sharded",
]
