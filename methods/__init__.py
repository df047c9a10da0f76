"""Built-in attention methods. Each module registers its methods on import; a new module is added to this list."""
from . import (  # noqa: F401  # noqa: F401  # noqa: F401  # noqa: F401
    attendout,
    convolution,
    dropkey,
    dropout,
    entmax_attention,
    less_attention,
    regularizers,
    rela,
    structured_dropout,
    topk,
    uniform,
)
