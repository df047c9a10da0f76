"""The method registry, and what planning needs to know of each method without importing it.

`METHODS` holds the method classes; importing them imports torch (every method module does). Planning a grid and
listing the methods need only facts about each class: its name, description, Config fields and defaults, hash rules
(`hashed_when_changed`, a plugin's replacement of a built-in and its origin), fp16 support and whether it replaces
the training step. `method_registry()` and `method_facts(name)` give them: from the classes, or, in a command that
only plans and has not imported torch, from the catalog that the last such command wrote (`suite.api.startup_cache`:
it is used only while every file of the code that filled the registry, the entry points that add methods and the
interpreter are unchanged). The catalog is written only when every method's facts can be stored exactly (defaults
that are JSON scalars, defaults that pass the method's own validation) and no plugin failed to load; otherwise the
classes are imported, as they are for any hyper-parameter that is not a default (`validated_hparams`).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import typing
from typing import Any

from suite.api import startup_cache
from suite.api.errors import HyperParameterError
from suite.api.registry import Registry, normalise

# what the rest of the suite uses; other names are this module's own
__all__ = ["METHODS", "MethodFacts", "catalog_of_methods", "check_precision", "default_hparams", "hashed_when_changed",
           "method_facts", "method_registry", "replaces_training_step", "validated_hparams"]

# names are case- and dash-insensitive, as task names are: `scores-dropout` and `Scores_Dropout` are scores_dropout
METHODS: Registry[type] = Registry("method", "suite.methods", "suite.methods", key=normalise, guard_replacement=True)

CATALOG = "methods"


def check_precision(method, precision: str) -> None:
    """An AttentionMethod (class or instance) or its MethodFacts against the grid's precision."""
    if precision == "fp16" and not method.supports_fp16:
        raise HyperParameterError(f"{method.name} computes gradients of its own without fp16 loss scaling: "
                                  "use train.precision=bf16 (no scaling needed) or fp32")


@dataclasses.dataclass(frozen=True)
class MethodFacts:
    """What listing and planning read of a registered method (a catalog entry, or read off its class)."""

    name: str                       # the class's `name`
    description: str
    defaults: dict[str, Any]        # dataclasses.asdict(Config())
    fields: tuple[tuple[str, str, str], ...]  # (field, repr of its default, its type) for `list`
    hashed_when_changed: dict[str, Any]
    supports_fp16: bool
    own_training_step: bool         # replaces AttentionMethod.training_step (steps the optimizer itself)

    @classmethod
    def of(cls, method: type) -> MethodFacts:
        defaults = method.Config()
        hints = typing.get_type_hints(method.Config)
        fields = tuple((f.name, repr(getattr(defaults, f.name)), f"{getattr(hints[f.name], '__name__', hints[f.name])}")
                       for f in dataclasses.fields(method.Config))
        return cls(method.name, method.description, dataclasses.asdict(defaults), fields,
                   dict(method.hashed_when_changed), method.supports_fp16, replaces_training_step(method))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> MethodFacts:
        return cls(**{**stored, "fields": tuple(tuple(f) for f in stored["fields"])})


def replaces_training_step(method: type | MethodFacts) -> bool:
    """Whether a method (its class, or its facts) replaces AttentionMethod.training_step: it steps the optimizer
    itself, so gradient accumulation cannot apply."""
    if isinstance(method, MethodFacts):
        return method.own_training_step
    base = next(c for c in reversed(method.__mro__)  # AttentionMethod, without importing its module (torch)
                if c.__module__ == "suite.api.attention" and c.__qualname__ == "AttentionMethod")
    return method.training_step is not base.training_step


def method_registry() -> Registry:
    """`METHODS`; or, in a command that only plans (`startup_cache.plan_only`) before anything imported torch or
    filled METHODS, a loaded registry of the catalog's MethodFacts (the same names, replacements and origins). A
    missing or outdated catalog is written anew from the classes, which are then returned."""
    global _catalog
    if METHODS.loaded:
        return METHODS
    if _catalog is None and startup_cache.usable():
        static = _static()
        _catalog = _read_catalog(static)
        if _catalog is None:
            _write_catalog(static)
    return _catalog if _catalog is not None and not METHODS.loaded else METHODS


_catalog: Registry | None = None


def method_facts(name: str) -> MethodFacts:
    """A method's facts, from the catalog or its class."""
    entry = method_registry().get(name)
    return entry if isinstance(entry, MethodFacts) else MethodFacts.of(entry)


def hashed_when_changed(name: str) -> dict[str, Any]:
    """The method's Config fields added after records existed (see AttentionMethod), {} for an unknown method."""
    registry = method_registry()
    if name not in registry:
        return {}
    entry = registry.get(name)
    return dict(entry.hashed_when_changed)


def default_hparams(name: str) -> dict[str, Any]:
    entry = method_registry().get(name)
    return json.loads(json.dumps(entry.defaults)) if isinstance(entry, MethodFacts) else \
        dataclasses.asdict(entry.Config())


def validated_hparams(name: str, over: dict[str, Any]) -> dict[str, Any]:
    """The method's hyper-parameters with `over` replacing defaults, checked by the method's own validation
    (HyperParameterError when impossible). The catalog answers for the defaults alone (they validated when it was
    written); any other value is checked by the class."""
    registry = method_registry()
    if not over and registry is not METHODS:
        return default_hparams(name)
    cls = METHODS.get(name)
    cfg = dataclasses.replace(cls.Config(), **over)
    cls(cfg)  # validates
    return dataclasses.asdict(cfg)


# -- the catalog ----------------------------------------------------------------------------------------

def _static() -> dict[str, Any]:
    """What the catalog depends on besides files: the interpreter and the entry points that add methods (in the
    order the registry loads them), each with its distribution and version."""
    points = [[ep.name, ep.value, *((ep.dist.name, ep.dist.version) if getattr(ep, "dist", None) else (None, None))]
              for ep in importlib.metadata.entry_points(group=METHODS.entry_point_group)]
    return {**startup_cache.interpreter(), "entry_points": points}


def _read_catalog(static: dict[str, Any]) -> Registry | None:
    stored = startup_cache.read(CATALOG, static)
    if stored is None:
        return None
    try:
        entries = [(name, MethodFacts.from_json(facts), origin) for name, facts, origin in stored["entries"]]
        return Registry.holding(METHODS.kind, entries, key=normalise, replaced=stored["replaced"])
    except (KeyError, TypeError, ValueError):
        return None


def _exact(value: Any) -> bool:
    """A value JSON gives back as it was (same type, same value)."""
    if type(value) in (bool, int, str, type(None)):
        return True
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is dict and all(type(k) is str and _exact(v) for k, v in value.items())


def _write_catalog(static: dict[str, Any]) -> bool:
    """Import the methods (filling METHODS) and keep their facts, unless something cannot be kept exactly."""
    METHODS.load()
    value = catalog_of_methods()
    return value is not None and startup_cache.write(CATALOG, static, startup_cache.loaded_code(), value)


def catalog_of_methods() -> dict[str, Any] | None:
    """What the catalog keeps of METHODS as it is now; None when some of it cannot be kept exactly: a plugin that
    failed to load (it left no file to key on), defaults that do not validate, or facts that JSON would not give
    back as they are (defaults other than JSON scalars)."""
    if METHODS.plugin_errors:
        return None
    entries = []
    for name in METHODS.names(registration_order=True):
        cls = METHODS.get(name)
        try:
            facts = MethodFacts.of(cls)
            cls()  # the defaults validate: the catalog may answer for them
        except Exception:  # noqa: BLE001 (whatever it is, the class itself will raise it where it matters)
            return None
        stored = facts.to_json()
        if not (_exact(facts.defaults) and _exact(facts.hashed_when_changed)
                and MethodFacts.from_json(json.loads(json.dumps(stored))) == facts):
            return None
        entries.append([name, stored, METHODS.origin(name)])
    return {"entries": entries, "replaced": sorted(METHODS.replaced)}
