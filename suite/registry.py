"""One generic registry for methods and tasks.

Unknown names raise an error that lists every valid name; `select` understands `all` and shell wildcards
(`scores_*`); third-party packages add entries through an entry-point group, loaded on first use.
"""
from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import re
from typing import Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """An unknown method or task name; the message lists the valid ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def normalise(name: str) -> str:
    """Case-, dash- and underscore-insensitive key: 'SST-2', 'sst2', 'sst_2' all map to 'sst2'."""
    return re.sub(r"[-_\s]", "", name.lower())


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: str, entry_point_group: str,
                 key: Callable[[str], str] = str):
        self.kind = kind
        self._builtins = builtins  # module whose import registers the built-in entries
        self._group = entry_point_group
        self._key = key
        self._entries: dict[str, T] = {}
        self._names: dict[str, str] = {}  # key -> display name
        self._loaded = False
        self.plugin_errors: dict[str, str] = {}

    # -- registration -------------------------------------------------------------------------------
    def add(self, name: str, entry: T) -> T:
        k = self._key(name)
        if k in self._entries and self._names[k] != name:
            raise ValueError(f"{self.kind} {name!r} clashes with already registered {self._names[k]!r}")
        self._entries[k] = entry
        self._names[k] = name
        return entry

    def remove(self, name: str) -> None:
        k = self._key(name)
        self._entries.pop(k, None)
        self._names.pop(k, None)

    # -- loading -------------------------------------------------------------------------------------
    def load(self, reload_plugins: bool = False) -> None:
        if self._loaded and not reload_plugins:
            return
        self._loaded = True
        importlib.import_module(self._builtins)
        for ep in importlib.metadata.entry_points(group=self._group):
            try:
                ep.load()  # importing the plugin module registers its entries
            except Exception as exc:  # a broken plugin must not take the suite down
                self.plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"

    # -- lookup --------------------------------------------------------------------------------------
    def names(self) -> list[str]:
        self.load()
        return sorted(self._names.values())

    def get(self, name: str) -> T:
        self.load()
        k = self._key(name)
        if k not in self._entries:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}. Valid {self.kind}s: {', '.join(self.names())}")
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
                found = [n for n in self.names() if fnmatch.fnmatch(self._key(n), self._key(pattern))
                         or fnmatch.fnmatch(n, pattern)]
                if not found:
                    raise UnknownNameError(
                        f"no {self.kind} matches {pattern!r}. Valid {self.kind}s: {', '.join(self.names())}")
            else:
                found = [self.canonical(pattern)]
            out.extend(n for n in found if n not in out)
        if not out:
            raise UnknownNameError(f"no {self.kind} selected. Valid {self.kind}s: {', '.join(self.names())}")
        return out
