"""What methods read of an encoder's attention layers whatever its type: each module under BERT's names (`layer_idx`,
`num_attention_heads`, `attention_head_size`), a local layer's window (ModernBERT), and the refusal of a method that
treats depths differently where layers share one module (ALBERT)."""
from __future__ import annotations

from suite.api.errors import HyperParameterError

# what the rest of the suite uses; other names are this module's own
__all__ = ["local_window", "name_the_layers", "refuse_shared_layers"]


def name_the_layers(modules: list) -> None:
    """Give each attention module what methods read under BERT's names where its type spells it otherwise
    (DistilBERT and ALBERT have no `layer_idx`, DistilBERT says `n_heads`, ModernBERT `head_dim`)."""
    for index, module in enumerate(modules):
        if not isinstance(getattr(module, "layer_idx", None), int):
            module.layer_idx = index
        if not hasattr(module, "num_attention_heads"):
            module.num_attention_heads = module.config.num_attention_heads
        if not hasattr(module, "attention_head_size"):
            module.attention_head_size = getattr(module, "head_dim", None) or (
                module.config.hidden_size // module.config.num_attention_heads)


def local_window(module) -> int | None:
    """How far from its query a key of a local layer may be (transformers' bidirectional sliding-window mask lets
    |query - key| <= config.sliding_window through: ModernBERT's local layers); None in a global layer."""
    layer_types = getattr(module.config, "layer_types", None)
    if layer_types and layer_types[module.layer_idx] == "sliding_attention":
        return int(module.config.sliding_window)
    return None


def refuse_shared_layers(method, model, modules: list) -> None:
    """HyperParameterError when `method` does something of its own at each depth (`method.layer_specific`) and the
    model's layers share fewer attention modules than it has layers: every depth would get the first one's."""
    layers = getattr(model.config, "num_hidden_layers", len(modules))
    what = method.layer_specific
    if what and len(modules) < layers:
        raise HyperParameterError(
            f"{method.name} cannot run on model type {model.config.model_type!r}: its {layers} layers share "
            f"{len(modules)} attention module{'s' if len(modules) > 1 else ''} (one module called at every depth), "
            f"while {method.name} gives each layer {what}; every layer would get the first layer's")
