"""Built-in tasks. Each module registers its tasks on import."""
from . import glue  # noqa: F401
