"""Built-in attention methods. Each module registers its methods on import; a new module is added to this list."""
from . import dropout, uniform  # noqa: F401
