"""Built-in attention methods. Each module registers its methods on import; a new module is added to this list."""
from . import dropout, uniform  # noqa: F401
from . import entmax_attention, rela, structured_dropout, topk  # noqa: F401
from . import attendout, regularizers  # noqa: F401
from . import convolution, less_attention  # noqa: F401
