"""What a method draws in training, declared (`AttentionMethod.stochastic`): the method check reads it to know what
to vary and what to measure (docs/adding-a-method.md#stochastic-parameters). Torch-free."""
from __future__ import annotations

import dataclasses

# what the rest of the suite uses; other names are this module's own
__all__ = ["AXES", "Stochastic", "stochastic_fields"]

AXES = ("sample", "head", "query", "key")  # the axes of the (B, H, Lq, Lk) weights a draw can vary along


@dataclasses.dataclass(frozen=True)
class Stochastic:
    """A Config field that sets what a method draws in training: a "rate" in [0, 1) or a "scale" >= 0 (a noise's
    sigma); it `lands` on the "probabilities" handed to `attend` (as zeros) or "elsewhere"; draws are independent
    along the axes it `varies`; `schedule` names the Config field that picks how the rate moves over training (its
    value "constant" holds it)."""
    field: str
    kind: str = "rate"
    lands: str = "probabilities"
    varies: tuple[str, ...] = AXES
    schedule: str | None = None

    def __post_init__(self):
        if self.kind not in ("rate", "scale") or self.lands not in ("probabilities", "elsewhere") or not set(
                self.varies) <= set(AXES):
            raise TypeError(f"Stochastic({self.field!r}): kind rate|scale, lands probabilities|elsewhere, axes {AXES}")


def stochastic_fields(cls) -> tuple[Stochastic, ...]:
    """A method class's declared stochastic parameters; undeclared (`stochastic = None`), the fields the naming rule
    gives: p and p_*, typed float, as rates landing where the check cannot tell."""
    if cls.stochastic is not None:
        return tuple(cls.stochastic)
    return tuple(Stochastic(f.name, lands="elsewhere") for f in dataclasses.fields(cls.Config)
                 if (f.name == "p" or f.name.startswith("p_")) and isinstance(getattr(cls.Config(), f.name), float))
