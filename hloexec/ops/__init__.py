"""HLO opcodes: importing this package fills the registry (`hloexec.ops.registry.OPS`).

One module per family; each opcode's prepare function, shape rule and notes sit in one place.
"""

from . import (
    collectives,
    contraction,
    control,
    custom_call,
    elementwise,
    indexing,
    manual,
    misc,
    movement,
    normalization,
    reduction,
    rng,
)  # manual: after custom_call
from .registry import OPS, OpDef, lookup, op
