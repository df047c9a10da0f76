"""One generic registry for every kind of named entry (methods, tasks, metrics, presets, executors).

Unknown names raise an error that lists every valid name; `select` understands `all` and shell wildcards
(`scores_*`). The kinds a user extends from another package end to end (methods, tasks with their metrics) also
load an entry-point group on first use (`suite.methods`, `suite.tasks`: docs/adding-a-method.md, docs/adding-a-task.md;
a task plugin registers its metrics as it is imported); presets and executors are the suite's own (a study file
declares a recipe).
"""
from __future__ import annotations

import difflib
import fnmatch
import importlib
import importlib.metadata
import re
from typing import Callable, Generic, Iterable, TypeVar

from suite.api.errors import Terminated, UnknownNameError  # UnknownNameError: the registry raises it

__all__ = ["Registry", "normalise"]  # what the rest of the suite uses; other names are this module's own

T = TypeVar("T")


SUITE_DISTRIBUTION = "attention-suite"  # pyproject.toml's project name, which installs the top-level `suite`


def _distribution_of(top_module: str) -> dict[str, str | None]:
    if top_module == "suite":  # by name: the general search below reads every installed distribution's file list
        try:
            return {"distribution": SUITE_DISTRIBUTION, "version": importlib.metadata.version(SUITE_DISTRIBUTION)}
        except importlib.metadata.PackageNotFoundError:
            return {"distribution": None, "version": None}
    names = importlib.metadata.packages_distributions().get(top_module, [])
    if not names:
        return {"distribution": None, "version": None}
    return {"distribution": names[0], "version": importlib.metadata.version(names[0])}


class _DistributionOf:
    """The distribution of a top-level module, looked up when first asked for: `packages_distributions` reads the
    file list of every installed distribution (0.4-0.6 s here, seconds in a fresh environment of 170 packages),
    which listing and planning never need."""

    def __init__(self, top_module: str):
        self._top, self._found = top_module, None

    def get(self) -> dict[str, str | None]:
        if self._found is None:
            self._found = _distribution_of(self._top)
        return self._found


def normalise(name: str) -> str:
    """Case-, dash- and underscore-insensitive key: 'SST-2', 'sst2', 'sst_2' all map to 'sst2'."""
    return re.sub(r"[-_\s]", "", name.lower())


def _wildcard_matches(name: str, pattern: str, key: Callable[[str], str]) -> bool:
    """Case- and dash-insensitive, but a separator the pattern spells out must be there: `scores_dropout_*` (or
    `Scores-Dropout-*`) selects the variants, not scores_dropout itself."""
    def loose(text: str) -> str:
        return re.sub(r"[-\s]", "_", text.lower())

    if fnmatch.fnmatchcase(loose(name), loose(pattern)):
        return True
    return not re.search(r"[-_\s]", pattern) and fnmatch.fnmatchcase(key(name), key(pattern))


def _same_definition(old: object, new: object) -> bool:
    """The same code registering again (a re-imported module, a re-run notebook cell): same module and name."""
    if old is new:
        return True
    return (isinstance(old, type) and isinstance(new, type)
            and (old.__module__, old.__qualname__) == (new.__module__, new.__qualname__))


def _failure(exc: BaseException) -> str:
    """One line for a plugin that failed to import."""
    if isinstance(exc, SystemExit):
        return f"its import called sys.exit({exc.code!r})"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}" if text else type(exc).__name__


def _where(entry: object) -> str:
    return f"{entry.__module__}.{entry.__qualname__}" if isinstance(entry, type) else repr(entry)


NAME_FORBIDDEN = ("/", "\\", "\0", "..")
# A registered name's most bytes (UTF-8): a record is named TASK__METHOD__seedN__MODEL__HASH.predictions.npz, and a
# file name holds 255 bytes, so a task and a method of 64 each leave the model's folder name about 90.
MAX_NAME_BYTES = 64


def check_name_part(kind: str, name: str) -> str:
    """`name` (a method's, a task's) as a safe part of a file name: records are named TASK__METHOD__..., so a name
    with a path separator, `..`, a NUL or a leading dot would write outside the output folder or hide its file, and
    one longer than MAX_NAME_BYTES would give a record that cannot be written after its run has trained."""
    if not isinstance(name, str):
        raise ValueError(f"{kind} name {name!r} is not a string: give the name as text")
    if not name or name.startswith(".") or any(bad in name for bad in NAME_FORBIDDEN):
        raise ValueError(f"{kind} name {name!r} cannot name files: use letters, digits, '_' and '-' (no '/', '\\', "
                         "'..' or leading '.')")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{kind} name {name[:40]!r}... is {size} bytes long; a {kind} name may have at most "
                         f"{MAX_NAME_BYTES} (its runs' records are named after it, and a file name holds 255 bytes): "
                         "register it under a shorter name")
    return name


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: str, entry_point_group: str | None = None,
                 key: Callable[[str], str] = str, guard_replacement: bool = False):
        self.kind = kind
        # guarded: a name registered by other code is replaced only when the new registration says so (replace=True)
        self._guard = guard_replacement
        self.replaced: set[str] = set()  # keys whose entry replaced another's on purpose
        self._builtins = builtins  # module whose import registers the built-in entries
        self._group = entry_point_group
        self._key = key
        self._entries: dict[str, T] = {}
        self._names: dict[str, str] = {}  # key -> display name
        self._loaded = False
        # key -> the distribution that registered it (the built-ins': looked up when first asked for)
        self._origins: dict[str, dict[str, str | None] | _DistributionOf] = {}
        self._loading: dict[str, str | None] | _DistributionOf | None = None  # the distribution importing now
        self.plugin_errors: dict[str, str] = {}

    @classmethod
    def holding(cls, kind: str, entries: Iterable[tuple[str, T, dict[str, str | None]]],
                key: Callable[[str], str] = str, replaced: Iterable[str] = ()) -> "Registry[T]":
        """A loaded registry of `entries` (name, entry, origin; in registration order), whose loading imports
        nothing: a stand-in for another registry's contents (suite.api.method_facts)."""
        registry = cls(kind, "", "", key=key)
        registry._loaded = True
        for name, entry, origin in entries:
            registry._loading = origin
            registry.add(name, entry)
        registry._loading = None
        registry.replaced = set(replaced)
        return registry

    @property
    def loaded(self) -> bool:
        """Whether entries are here: loaded, or registered by a script or a test."""
        return self._loaded or bool(self._entries)

    @property
    def entry_point_group(self) -> str | None:
        return self._group

    # -- registration -------------------------------------------------------------------------------
    def add(self, name: str, entry: T, replace: bool = False) -> T:
        check_name_part(self.kind, name)
        k = self._key(name)
        if k in self._entries and self._names[k] != name:
            raise ValueError(f"{self.kind} {name!r} clashes with already registered {self._names[k]!r}")
        if self._guard and k in self._entries and not _same_definition(self._entries[k], entry):
            if not replace:
                old = self._entries[k]
                raise ValueError(f"{self.kind} {name!r} is already registered (by {_where(old)}); a second "
                                 f"registration from {_where(entry)} would silently replace it. Choose another "
                                 "name, or pass replace=True to replace it on purpose (runs then record and hash "
                                 "the replacing package)")
            self.replaced.add(k)
        self._entries[k] = entry
        self._names[k] = name
        self._origins[k] = self._loading or {"distribution": None, "version": None}
        return entry

    def is_replacement(self, name: str) -> bool:
        """Whether `name`'s entry replaced another registration on purpose (replace=True)."""
        return self._key(name) in self.replaced

    def remove(self, name: str) -> None:
        k = self._key(name)
        self.replaced.discard(k)
        self._entries.pop(k, None)
        self._names.pop(k, None)

    # -- loading -------------------------------------------------------------------------------------
    def load(self, reload_plugins: bool = False) -> None:
        if self._loaded and not reload_plugins:
            return
        self._loaded = True
        self._import(self._builtins, _DistributionOf("suite"))
        for ep in importlib.metadata.entry_points(group=self._group) if self._group else ():
            dist = getattr(ep, "dist", None)
            origin = ({"distribution": dist.name, "version": dist.version} if dist else
                      _distribution_of(ep.value.split(":")[0].split(".")[0]))
            saved = self._state()
            try:
                self._import(ep.load, origin)  # importing the plugin module registers its entries
            except (KeyboardInterrupt, Terminated):  # a stop, not the plugin's failure
                raise
            except BaseException as exc:  # noqa: BLE001  a broken plugin (even one calling sys.exit) is left out
                self._restore(saved)  # with whatever it registered before it failed
                self.plugin_errors[ep.name] = _failure(exc)

    def _state(self) -> tuple:
        return dict(self._entries), dict(self._names), dict(self._origins), set(self.replaced)

    def _restore(self, state: tuple) -> None:
        entries, names, origins, replaced = state
        self._entries, self._names, self._origins, self.replaced = dict(entries), dict(names), dict(origins), \
            set(replaced)

    def _import(self, what: str | Callable[[], object], origin: dict[str, str | None] | _DistributionOf) -> None:
        """Import a module (or load an entry point); entries it registers are attributed to `origin`.
        A module imported earlier registers nothing new here: its entries keep the origin they got then."""
        self._loading = origin
        try:
            importlib.import_module(what) if isinstance(what, str) else what()
        finally:
            self._loading = None

    def origin(self, name: str) -> dict[str, str | None]:
        """Which installed distribution (name, version) registered `name`; both None for entries registered at
        run time by a script or a test."""
        entry = self.get(name)
        origin = self._origins.get(self._key(name), {"distribution": None, "version": None})
        origin = dict(origin.get() if isinstance(origin, _DistributionOf) else origin)
        if origin["distribution"] is None and isinstance(entry, type):  # a class imported before the registry loaded
            origin = _distribution_of(entry.__module__.split(".")[0])
        return origin

    # -- lookup --------------------------------------------------------------------------------------
    def names(self, registration_order: bool = False) -> list[str]:
        self.load()
        names = list(self._names.values())
        return names if registration_order else sorted(names)

    def get(self, name: str) -> T:
        self.load()
        k = self._key(name)
        if k not in self._entries:
            close = difflib.get_close_matches(k, list(self._entries), n=1, cutoff=0.6)  # typos: "did you mean"
            hint = f". Did you mean {self._names[close[0]]!r}?" if close else ""
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}. Valid {self.kind}s: {', '.join(self.names())}{hint}")
        return self._entries[k]

    def canonical(self, name: str) -> str:
        self.get(name)
        return self._names[self._key(name)]

    def __contains__(self, name: str) -> bool:
        self.load()
        return self._key(name) in self._entries

    def select(self, patterns: Iterable[str] | str, groups: dict[str, list[str]] | None = None) -> list[str]:
        """Names matching a comma list of names, wildcards, `all`, or group names; order kept, no repeats."""
        if isinstance(patterns, str):
            patterns = [p for p in patterns.split(",") if p.strip()]
        groups = {self._key(g): v for g, v in (groups or {}).items()}
        out: list[str] = []
        for pattern in (p.strip() for p in patterns):
            if pattern.lower() == "all":
                found = self.names()
            elif self._key(pattern) in groups:
                found = [self.canonical(n) for n in groups[self._key(pattern)]]
            elif any(c in pattern for c in "*?["):
                found = [n for n in self.names() if _wildcard_matches(n, pattern, self._key)]
                if not found:
                    raise UnknownNameError(
                        f"no {self.kind} matches {pattern!r}. Valid {self.kind}s: {', '.join(self.names())}")
            else:
                found = [self.canonical(pattern)]
            out.extend(n for n in found if n not in out)
        if not out:
            raise UnknownNameError(f"no {self.kind} selected. Valid {self.kind}s: {', '.join(self.names())}")
        return out
