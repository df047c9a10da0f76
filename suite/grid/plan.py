"""The grid of jobs: `--set`/`--sweep` assignments parsed against each field's type, and every job they expand to.

`M.KEY=V` fixes a method's hyper-parameter, `train.KEY=V` a training setting, `M:train.KEY=V` one method's training
setting; `--sweep` gives comma lists that multiply. `build_grid` validates every job before anything trains.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import typing
from typing import Any

from suite.api.errors import HyperParameterError
from suite.api.method_facts import (
    METHODS,
    check_precision,
    method_registry,
    replaces_training_step,
    validated_hparams,
)
from suite.run.settings import RunConfig, TrainSettings, check_seeds

# what the rest of the suite uses; other names are this module's own
__all__ = ["build_grid", "parse_assignment", "target_method"]


def _convert(value: str, typ, where: str):
    origin = typing.get_origin(typ)
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and args:
        if value.lower() in ("none", "null"):
            return None
        typ = args[0]
    try:
        if typ is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return value.lower() in ("true", "1", "yes")
        if typ is int:
            return int(value)
        if typ is float:
            return float(value)
        return value
    except ValueError:
        raise HyperParameterError(f"{where}={value!r}: expected a {getattr(typ, '__name__', typ)}") from None


def _fields(target: str) -> dict[str, Any]:
    cls = TrainSettings if target.split(":")[0] == "train" else METHODS.get(target).Config
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def method_train_target(method: str) -> str:
    """The target of `METHOD:train.KEY` assignments: one method's own training settings."""
    return f"train:{method}"


def target_method(target: str) -> str | None:
    """The method an assignment target belongs to (`M` and `train:M` are M's); None for the grid's `train`."""
    if target == "train":
        return None
    return target.split(":", 1)[1] if target.startswith("train:") else target


def parse_assignment(text: str, sweep: bool) -> tuple[str, str, list[Any]]:
    """'method.key=v1,v2' -> (method, key, [v1, v2]) with values converted to the field's type.

    'METHOD:train.key=...' scopes a training setting to one method (a per-method learning-rate sweep); its target
    is 'train:METHOD'."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise HyperParameterError(f"cannot parse {text!r}: write METHOD.KEY=VALUE (or train.KEY=VALUE, or "
                                  "METHOD:train.KEY=VALUE for one method's training setting)"
                                  + (", with a comma list of values" if sweep else ""))
    lhs, rhs = text.split("=", 1)
    scope, _, path = lhs.strip().rpartition(":")
    target, key = path.split(".", 1)
    if scope and target != "train":
        raise HyperParameterError(f"{text!r}: only training settings take a method scope (METHOD:train.KEY=V); "
                                  f"write {target}.{key}=... for a method's own hyper-parameter")
    target = "train" if target == "train" else method_registry().canonical(target)
    if scope:
        target = method_train_target(method_registry().canonical(scope))
    fields = _fields(target)
    if key not in fields:
        close = difflib.get_close_matches(key, list(fields), n=1)
        hint = f" Did you mean {target.split(':')[0]}.{close[0]}?" if close else ""
        raise HyperParameterError(f"{target} has no hyper-parameter {key!r}.{hint} "
                                  f"Valid: {', '.join(fields) or '(none)'}")
    raw = [v.strip() for v in rhs.split(",")] if sweep else [rhs.strip()]
    if not raw or any(v == "" for v in raw):
        raise HyperParameterError(f"{text!r}: empty value")
    return target, key, [_convert(v, fields[key], lhs) for v in raw]


def build_grid(models: list[str], tasks: list[str], methods: list[str], seeds: list[int],
               train: TrainSettings | dict[str, TrainSettings], sets: list[str] = (), sweeps: list[str] = (),
               data_source: str = "local") -> list[RunConfig]:
    """Every job of the grid, validated before anything trains (impossible values raise HyperParameterError).

    `train` is one TrainSettings for every task, or one per task (a preset's per-task values). A job that the
    grid would list twice (a repeated seed or sweep value) is listed once. Settings for a method that is not in
    `methods` (`M.KEY`, `M:train.KEY`) change nothing here, so that a study's settings hold in every grid that
    inherits them; `preflight.warn_unused_settings` names the ones no grid uses.
    """
    seeds = check_seeds(list(seeds))
    fixed, swept = _assignments(sets, sweeps)
    per_task = train if isinstance(train, dict) else {t: train for t in tasks}
    jobs: dict[str, RunConfig] = {}
    for method in methods:
        entry = method_registry().get(method)  # its class, or its facts from the catalog (suite.api.method_facts)
        trains = {task: _train_variants(per_task[task], *_method_train(fixed, swept, method)) for task in tasks}
        for over in _combos(fixed, swept, method):
            hparams = validated_hparams(method, over)
            for model, task, seed in itertools.product(models, tasks, seeds):
                for t in trains[task]:
                    check_precision(entry, t.precision)
                    _check_accumulation(entry, t)
                    job = RunConfig(model, task, method, hparams, seed, t, data_source)
                    jobs.setdefault(job.hash, job)
    return list(jobs.values())


def _assignments(sets, sweeps) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, list[Any]]]]:
    fixed: dict[str, dict[str, Any]] = {}
    swept: dict[str, dict[str, list[Any]]] = {}
    for text in sets:
        target, key, values = parse_assignment(text, sweep=False)
        fixed.setdefault(target, {})[key] = values[0]
    for text in sweeps:
        target, key, values = parse_assignment(text, sweep=True)
        swept.setdefault(target, {})[key] = list(dict.fromkeys(values))  # a repeated value is one grid point
    return fixed, swept


def _combos(fixed, swept, target: str) -> list[dict[str, Any]]:
    keys = list(swept.get(target, {}))
    if not keys:
        return [fixed.get(target, {})]
    return [{**fixed.get(target, {}), **dict(zip(keys, vals))}
            for vals in itertools.product(*(swept[target][k] for k in keys))]


def _check_accumulation(method, t: TrainSettings) -> None:
    if t.grad_accumulation > 1 and replaces_training_step(method):
        raise HyperParameterError(f"{method.name} replaces the training step (it steps the optimizer itself), so "
                                  f"train.grad_accumulation={t.grad_accumulation} cannot apply: use 1 and a "
                                  "smaller batch, or another method")


def _method_train(fixed, swept, method: str):
    """The training assignments that apply to `method`: the grid's, then its own `METHOD:train.KEY` ones."""
    scoped = method_train_target(method)
    return ({"train": {**fixed.get("train", {}), **fixed.get(scoped, {})}},
            {"train": {**swept.get("train", {}), **swept.get(scoped, {})}})


def _train_variants(base: TrainSettings, fixed, swept) -> list[TrainSettings]:
    out = []
    for over in _combos(fixed, swept, "train"):
        t = dataclasses.replace(base, **over)
        t.validate()
        out.append(t)
    return out
