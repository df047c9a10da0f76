"""suite: a benchmark and ablation suite for attention-dropout and sparse-attention methods on pre-trained encoders.

The names below are the plugin API (`suite.register_method`, `suite.AttentionMethod`, `suite.attend`, ...). They
live in `suite.api` and are imported on first use, so that `import suite` (and `python -m suite --help`) does not
pay for torch and transformers.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "suite.api.attention": ["METHODS", "AttentionMethod", "HyperParameterError", "NoConfig", "StepContext", "attend",
                            "attention_modules", "check_integer", "check_probability", "drop_scores", "has_probe",
                            "mask_fill_value", "probes", "probs_dropout", "register_method", "same_device", "scores",
                            "softmax", "valid_keys"],
    "suite.api.stochastic": ["Stochastic"],
    "suite.api.registry": ["UnknownNameError"],
    "suite.api.tasks": ["LocalSplit", "TaskSpec", "TestSet", "register_task", "register_test_set"],
    "suite.api.metrics": ["register_metric"],
}
_WHERE = {name: module for module, names in _API.items() for name in names}

__all__ = sorted(_WHERE) + ["__version__"]


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'suite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
