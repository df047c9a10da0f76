"""Answers that `list` and dry runs would otherwise import torch for, kept on disk with everything they depend on.

Importing torch takes over a second of a small machine; `python -m suite list` and `run --dry-run` need none of its
computing, only two facts that come out of code importing it: what the method registry holds (names, descriptions,
Config fields and defaults, hash rules: `suite.api.method_facts`) and whether this CPU computes bf16 natively, which
decides what `precision=auto` hashes as (`suite.run.device`). Each is kept as an entry: the answer and its key, the
facts it was computed from. An entry is used only when every one of them still holds; anything else (no entry, an
unreadable one, one key fact changed or unreadable) is a miss: the command imports torch as before and writes a new
entry for the next command.

- `python -m suite plan` keeps its whole answer the same way (`suite.commands.plan`): its key holds, besides the
  code, every file and folder the answer read (the study file, the pilot's records and their prediction sidecars, the
  folders listed to find them: `files_read`), so a new or changed record, or an edited study, recomputes it.
- Only commands that just plan use entries (`plan_only()`: `list`, `run --dry-run`, `plan`); a real run, `check`,
  `bench` and library code ask the code itself. So does any process that has imported torch already (the test suite,
  whose fixtures patch torch's CPU checks): there the real answer costs little.
- A key holds the files of the code that computed the answer: (size, modification and change time, inode) of each,
  and of the folders holding them, whose times change when a file is added, removed or renamed there (so a module
  that would now shadow one of them changes the key too); the interpreter, `sys.path`, the entry points that add
  methods (each with its distribution's version) and the environment variables (a digest, no value written down; a
  shell's own `_`, `OLDPWD`, `SHLVL` left out), which code may read as it registers. Entries are written only when
  all those files and folders are at least 2 s older than the writing process, so an edit made while it ran (or
  within a file system's time resolution) cannot hide under an equal key. What no key sees: a plugin that reads a
  data file when it registers; give it SUITE_CACHE_DIR=off.
- Entries are JSON data (never code) under `$SUITE_CACHE_DIR/startup/` (default `~/.cache/suite/startup/`;
  `SUITE_CACHE_DIR=off` turns them off), written atomically, one file per interpreter, `sys.path` and environment;
  files not rewritten for 30 days are removed when an entry is written.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

# what the rest of the suite uses; other names are this module's own
__all__ = ["files_read", "interpreter", "loaded_code", "plan_only", "read", "remembered", "usable", "write"]

FORMAT = 1
SETTLE_NS = 2_000_000_000   # a file or folder changed this recently (or later) keeps an entry from being written
STALE_S = 30 * 24 * 3600    # entries untouched this long are removed
_IMPORTED_NS = time.time_ns()

_plan_only = False


def plan_only() -> None:
    """This process only plans (`list`, `run --dry-run`): it may answer from entries instead of importing torch."""
    global _plan_only
    _plan_only = True


def usable() -> bool:
    """Whether entries may be read (and written) now: a planning command, torch not imported yet, a cache folder."""
    return _plan_only and "torch" not in sys.modules and folder() is not None


def folder() -> Path | None:
    value = os.environ.get("SUITE_CACHE_DIR", "")
    if value.lower() == "off":
        return None
    return (Path(value).expanduser() if value else Path.home() / ".cache" / "suite") / "startup"


def stat_facts(path: str) -> list[int] | None:
    """What changes whenever a file or folder does: size, modification and change times (the change time cannot be
    set back), inode (a replacement by rename). None when it is absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def loaded_code() -> list[str]:
    """The files of every module this process has imported, the folders holding them, and the folders of
    `sys.path`: what code imported now ran, and where an import would look."""
    files = [spec.origin for module in list(sys.modules.values())
             if (spec := getattr(module, "__spec__", None)) is not None and spec.has_location and spec.origin]
    folders = {os.path.dirname(f) for f in files} | {os.path.abspath(p or os.curdir) for p in sys.path}
    return sorted(set(files)) + sorted(folders)


# the sets of paths each `files_read` in progress has seen opened or listed (the audit hook adds to them)
_reading: list[set[str]] = []
_hooked = False
# paths whose times change by themselves, or that this module writes: never part of a key
_UNKEYED = ("/proc/", "/sys/", "/dev/")


_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


def _audit(event: str, args: tuple) -> None:
    if _reading and event in ("open", "os.listdir", "os.scandir") and args:
        path = args[0]
        # what is written is no input (tempfile's probe of /tmp is one)
        written = event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & _WRITES
        if isinstance(path, (str, bytes, os.PathLike)) and not written:
            full = os.path.abspath(os.fsdecode(path))
            for seen in _reading:
                seen.add(full)


def files_read(compute: Callable[[], Any]) -> tuple[Any, list[str]]:
    """(compute(), every file it opened and folder it listed, with the folders holding them): what an answer kept
    for it depends on besides code. A path absent when read counts too (one that appears later changes the key)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)   # a hook cannot be removed: it records only while a `files_read` runs
        _hooked = True
    seen: set[str] = set()
    _reading.append(seen)
    try:
        value = compute()
    finally:
        _reading.pop()
    own = folder()
    unkeyed = _UNKEYED + ((str(own),) if own is not None else ())
    kept = {p for p in seen if not p.startswith(unkeyed)}
    return value, sorted(kept | {os.path.dirname(p) for p in kept})


# variables a shell changes from one command to the next; every other one is part of a key (code may read it)
SHELL_VARIABLES = ("_", "OLDPWD", "SHLVL")


def interpreter() -> dict[str, Any]:
    """The interpreter, where it imports from, and the environment (as a digest: no value is written down)."""
    environ = sorted((k, v) for k, v in os.environ.items() if k not in SHELL_VARIABLES)
    return {"python": sys.version, "executable": sys.executable, "path": list(sys.path),
            "environ": hashlib.sha256(json.dumps(environ).encode()).hexdigest(),
            "meta_path": [f"{c.__module__}.{c.__qualname__}" for f in sys.meta_path
                          for c in [f if isinstance(f, type) else type(f)]]}


def _path(name: str, static: dict[str, Any]) -> Path | None:
    where = folder()
    if where is None:
        return None
    digest = hashlib.sha256(json.dumps([FORMAT, static], sort_keys=True, default=str).encode()).hexdigest()[:16]
    return where / f"{name}-{digest}.json"


def read(name: str, static: dict[str, Any]) -> Any | None:
    """The answer kept under `name` when its key still holds: the same `static` facts, every file and folder as it
    was (None: a miss)."""
    path = _path(name, static)
    try:
        entry = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    try:
        if entry["format"] != FORMAT or entry["static"] != json.loads(json.dumps(static, default=str)):
            return None
        if any(stat_facts(f) != facts for f, facts in entry["files"].items()):
            return None
        return entry["value"]
    except (KeyError, TypeError, AttributeError):
        return None


def write(name: str, static: dict[str, Any], files: Iterable[str], value: Any) -> bool:
    """Keep `value` under `name`, keyed on `static` and the current state of `files` (an absent one too: one that
    appears later changes the key). Nothing is written when a file changed too recently to be told apart from an edit
    made while this process ran (a file deleted meanwhile changed its folder), or when the folder cannot be written
    (an entry only saves time: failing to write one is no error)."""
    path = _path(name, static)
    if path is None:
        return False
    facts = {f: stat_facts(f) for f in files}
    settled = _process_started_ns() - SETTLE_NS
    if any(x is not None and (x[1] >= settled or x[2] >= settled) for x in facts.values()):
        return False
    entry = {"format": FORMAT, "static": static, "files": facts, "value": value}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(entry, fh, default=str)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, TypeError, ValueError):
        return False
    return True


def remembered(name: str, static: dict[str, Any], compute: Callable[[], tuple[Any, Iterable[str]]]) -> Any:
    """The answer kept under `name` if its key holds; else `compute()` -> (answer, the files it depends on), which
    is kept for next time and returned."""
    value = read(name, static)
    if value is None:
        value, files = compute()
        write(name, static, files, value)
    return value


def _process_started_ns() -> int:
    """When this process started (Linux: from /proc), else when this module was imported; a file changed since,
    or shortly before, may have changed after the process read it."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
        return min(_IMPORTED_NS, int((boot + ticks / os.sysconf("SC_CLK_TCK")) * 1e9))
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_NS


def _remove_stale(where: Path) -> None:
    cutoff = time.time() - STALE_S
    for entry in where.glob("*.json"):
        try:
            if entry.stat().st_mtime < cutoff:
                entry.unlink()
        except OSError:
            pass
