"""GLUE's official metrics on scikit-learn/scipy (offline; evaluate's GLUE metric downloads its script at run time)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from suite.api.registry import Registry

# what the rest of the suite uses; other names are this module's own
__all__ = ["METRICS", "check_task_metrics", "compute", "headline", "predictions", "register_metric"]

if TYPE_CHECKING:  # numpy is imported where a metric is computed: dry runs only check that the metrics exist
    import numpy as np


# scikit-learn and scipy are imported when a metric is first computed, not with this module: they cost seconds,
# which `list` and dry runs (they only check that a task's metrics exist) do not need.
def _correlation(name: str):
    def wrapped(pred, gold):
        import numpy as np

        if np.std(pred) == 0 or np.std(gold) == 0:  # correlation undefined; scipy warns and returns nan
            return math.nan
        import scipy.stats

        return float(getattr(scipy.stats, name)(pred, gold)[0])
    return wrapped


def _sklearn(name: str, **kwargs):
    def wrapped(pred, gold):
        import sklearn.metrics

        return float(getattr(sklearn.metrics, name)(gold, pred, **kwargs))
    return wrapped


# Built-in metrics are registered below (accuracy, f1, mcc, pearson, spearman); a plugin adds its own with
# `register_metric` from the module that registers its task (the task's entry point imports both).
METRICS: Registry[Callable[[np.ndarray, np.ndarray], float]] = Registry("metric", "suite.api.metrics")


def register_metric(name: str, fn: Callable[[np.ndarray, np.ndarray], float]) -> Callable:
    """Make `fn(predictions, gold) -> float` usable by name in a TaskSpec's `metrics` (plugin tasks).

    Both arguments are numpy arrays over the dev examples: `predictions` holds label ids (the argmax of the logits)
    for a classification task and the predicted score for a regression task, `gold` the labels. A larger value must
    be better unless the task sets `higher_is_better=False`; NaN means undefined (a run whose final score is NaN
    is recorded as failed).
    Registering a name again with another function is refused. Example::

        register_metric("macro_f1", lambda pred, gold: float(f1_score(gold, pred, average="macro")))
    """
    if not callable(fn):
        raise TypeError(f"register_metric({name!r}, ...): the metric must be a function (predictions, gold) -> float")
    if name in METRICS and METRICS.get(name) is not fn:
        raise ValueError(f"metric {name!r} is already registered")
    return METRICS.add(name, fn)


register_metric("accuracy", _sklearn("accuracy_score"))
register_metric("f1", _sklearn("f1_score", pos_label=1, average="binary", zero_division=0.0))
register_metric("mcc", _sklearn("matthews_corrcoef"))
register_metric("pearson", _correlation("pearsonr"))
register_metric("spearman", _correlation("spearmanr"))


def check_task_metrics(spec) -> None:
    """Before training: every metric a task names must be registered (a typo would otherwise fail after training)."""
    from suite.api.errors import BadInput

    unknown = [m for m in spec.metrics if m not in METRICS]
    if unknown:
        import difflib

        close = {m: difflib.get_close_matches(m, METRICS.names(), n=1) for m in unknown}
        hints = "".join(f" ({m!r}: did you mean {c[0]!r}?)" for m, c in close.items() if c)
        raise BadInput(f"task {spec.display} names unknown metric(s) {', '.join(map(repr, unknown))}{hints}. "
                       f"Registered metrics: {', '.join(METRICS.names())}; a plugin adds one with "
                       "suite.register_metric(name, fn)")


def predictions(logits: np.ndarray, regression: bool) -> np.ndarray:
    return logits[:, 0] if regression else logits.argmax(-1)


def compute(names, logits: np.ndarray, labels: np.ndarray, regression: bool, suffix: str = "") -> dict[str, float]:
    pred = predictions(logits, regression)
    return {(f"{n}_{suffix}" if suffix else n): METRICS.get(n)(pred, labels) for n in names}


def headline(metrics: dict[str, float], keys) -> float:
    """The task's single number: the mean of its official metrics (MRPC F1/acc, STS-B Pearson/Spearman, MNLI m/mm)."""
    import numpy as np

    values = [metrics[k] for k in keys]
    return float(np.mean(values)) if values and not any(math.isnan(v) for v in values) else math.nan
