"""suite: a benchmark and ablation suite for attention-dropout and sparse-attention methods on pre-trained encoders."""
from .attention import (METHODS, AttentionMethod, HyperParameterError, NoConfig, attend, attention_modules,
                        check_probability, drop_scores, mask_fill_value, probs_dropout, register_method, scores,
                        softmax, valid_keys)
from .registry import UnknownNameError

__version__ = "0.1.0"

__all__ = ["METHODS", "AttentionMethod", "HyperParameterError", "NoConfig", "UnknownNameError", "attend",
           "attention_modules", "check_probability", "drop_scores", "mask_fill_value", "probs_dropout",
           "register_method", "scores", "softmax", "valid_keys", "__version__"]
