"""Tokenised splits shared across processes: a grid's worker processes (and later invocations) tokenise a task's
subset once; the others read it from a disk cache.

The cache key covers everything the tokens depend on: the suite's version, the tokenizer's files, the task, the
content (sha256) of the data files and the settings that pick and cut the rows. Entries are data, not code: a numpy
`.npz` of integer arrays plus a JSON manifest, read with `allow_pickle=False`, so a file dropped into the cache can
never run anything. Each entry carries its key and a checksum of its arrays and its manifest together; an entry that
is truncated, wrongly shaped, edited, written for another key, not a regular file, compressed (the suite stores its
arrays uncompressed, so nothing it reads can expand beyond the file's own size), owned by another user or writable
by others is named in a warning and rebuilt. A checksum shows damage and edits that did not recompute it; like the
code it runs, the suite trusts whoever can write the cache folder, which is why entries another user could have
written are not read. Entries live in `$SUITE_CACHE_DIR` (default `~/.cache/suite/tokenized`) and are written
atomically, so concurrent workers never read half a file. Hub data is not cached here (the `datasets` cache already
keeps the download; tokenising again is what is left). Set `SUITE_CACHE_DIR=off` to turn the cache off.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from suite import __version__

# what the rest of the suite uses; other names are this module's own
__all__ = ["BadEntry", "CACHE_ENV", "cached", "read_entry", "tokenized_key", "write_entry"]

CACHE_ENV = "SUITE_CACHE_DIR"
FORMAT = 3          # the layout of an entry; entries of another format are never read (3: the checksum covers the tree)
SUFFIX = ".npz"
_MANIFEST = "manifest"


class BadEntry(ValueError):
    """A cache entry that cannot be trusted (corrupt, wrongly shaped, edited, or written for another key)."""


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() == "off":
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "suite" / "tokenized"


# (path, inode, size, mtime, ctime) -> sha256: a file is hashed once per process; the change time is set by every
# write and cannot be set back (os.utime can set the modification time back)
_DIGESTS: dict[tuple, str] = {}


def _content_hash(path: Path) -> str:
    stat = path.stat()
    facts = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if facts not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[facts] = digest.hexdigest()
    return _DIGESTS[facts]


def _file_facts(path: Path) -> list[Any]:
    """A file by its content: an edit that keeps its size and modification time still changes the key."""
    return [str(path.resolve()), _content_hash(path)]


def _tokenizer_facts(tokenizer) -> list[Any]:
    """The tokenizer's class, name and its files on disk (a changed vocabulary changes the key)."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or "")
    files = sorted(p for p in folder.glob("*") if p.is_file() and p.suffix in (".json", ".txt", ".model")) \
        if folder.is_dir() else []
    return [type(tokenizer).__name__, str(folder), len(tokenizer), *(_file_facts(p) for p in files)]


def cache_key(spec, tokenizer, data_files: list[Path], settings: dict[str, Any]) -> str:
    blob = json.dumps([__version__, FORMAT, spec.name, repr(spec), _tokenizer_facts(tokenizer),
                       [_file_facts(p) for p in data_files], settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------------------
# Entries as arrays: a tree of dicts, tuples, lists, JSON scalars, numeric arrays and tokenised splits
# (suite.run.data.Encoded)
# ---------------------------------------------------------------------------------------------------------

def _pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The JSON manifest of `value`; the token lists of each tokenised split go into `arrays` (flat + offsets)."""
    from suite.run.data import Encoded

    if isinstance(value, Encoded):
        name = f"e{len(arrays)}"
        keys = sorted(value.features[0]) if value.features else []
        for k in keys:
            arrays[f"{name}/{k}"] = np.concatenate([np.asarray(f[k], dtype=np.int64) for f in value.features]) \
                if value.features else np.zeros(0, np.int64)
        arrays[f"{name}/offsets"] = np.cumsum([0, *(len(f["input_ids"]) for f in value.features)], dtype=np.int64)
        arrays[f"{name}/labels"] = np.asarray(value.labels)
        if value.index is not None:
            arrays[f"{name}/index"] = np.asarray(value.index, dtype=np.int64)
        node = {"encoded": name, "keys": keys, "rows": len(value), "index": value.index is not None}
        if value.groups is not None:  # entries without groups keep their manifest as it was
            arrays[f"{name}/groups"] = np.asarray(value.groups, dtype=np.int64)
            node["groups"] = True
        return node
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf":
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"array": name}
    if isinstance(value, dict):
        return {"dict": {str(k): _pack(v, arrays) for k, v in value.items()}}
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [_pack(v, arrays) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"the tokenised-data cache stores no {type(value).__name__}")


def _unpack(node: Any, arrays) -> Any:
    from suite.run.data import Encoded

    if not isinstance(node, dict) or len(node) < 1:
        raise BadEntry(f"a manifest node {node!r:.60}")
    if "encoded" in node:
        name, rows = node["encoded"], node["rows"]
        offsets = arrays[f"{name}/offsets"]
        labels = arrays[f"{name}/labels"]
        if offsets.shape != (rows + 1,) or labels.shape != (rows,) or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
            raise BadEntry(f"split {name} is not shaped as its {rows} rows")
        columns = {k: arrays[f"{name}/{k}"] for k in node["keys"]}
        if any(c.shape != (int(offsets[-1]),) for c in columns.values()):
            raise BadEntry(f"the tokens of split {name} do not fit their offsets")
        features = [{k: c[offsets[i]:offsets[i + 1]].tolist() for k, c in columns.items()} for i in range(rows)]
        index = arrays[f"{name}/index"].tolist() if node["index"] else None
        if index is not None and len(index) != rows:
            raise BadEntry(f"split {name} has {len(index)} row numbers for {rows} rows")
        groups = arrays[f"{name}/groups"].tolist() if node.get("groups") else None
        if groups is not None and len(groups) != rows:
            raise BadEntry(f"split {name} has {len(groups)} groups for {rows} rows")
        return Encoded(features, labels.tolist(), index, groups)
    if "array" in node:
        return arrays[node["array"]]
    if "dict" in node:
        return {k: _unpack(v, arrays) for k, v in node["dict"].items()}
    if "tuple" in node:
        return tuple(_unpack(v, arrays) for v in node["tuple"])
    if "list" in node:
        return [_unpack(v, arrays) for v in node["list"]]
    if "value" in node:
        return node["value"]
    raise BadEntry(f"a manifest node {node!r:.60}")


def _checksum(arrays: dict[str, np.ndarray], tree: Any) -> str:
    """Of the arrays and the manifest's tree that says which array is which split: pointing a split at another's
    arrays changes it as much as editing the arrays does."""
    digest = hashlib.sha256(json.dumps(tree, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        digest.update(a.tobytes())
    return digest.hexdigest()


def write_entry(file, key: str, value: Any) -> None:
    arrays: dict[str, np.ndarray] = {}
    tree = _pack(value, arrays)
    manifest = {"format": FORMAT, "suite": __version__, "key": key, "tree": tree, "checksum": _checksum(arrays, tree)}
    np.savez(file, **arrays, **{_MANIFEST: np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)})


def _check_file(path: Path) -> None:
    """BadEntry unless `path` is a regular file of this user's, writable by nobody else, whose members are stored
    uncompressed (as `np.savez` writes them) and add up to no more than the file: a FIFO would hang the reader, a
    compressed member could expand to gigabytes, and what another user could write this user's runs must not trust."""
    facts = os.lstat(path)  # FileNotFoundError: no entry yet
    if not stat.S_ISREG(facts.st_mode):
        raise BadEntry("not a regular file")
    if hasattr(os, "getuid") and (facts.st_uid != os.getuid() or facts.st_mode & 0o022):
        raise BadEntry("owned by another user or writable by others")
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
    if any(m.compress_type != zipfile.ZIP_STORED for m in members) or sum(m.file_size for m in members) > \
            facts.st_size:
        raise BadEntry("compressed members (the suite stores its arrays uncompressed)")


def read_entry(path: Path, key: str) -> Any:
    """The value stored in `path` for `key`; BadEntry (or what reading raises) when it cannot be trusted."""
    _check_file(path)
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    raw = arrays.pop(_MANIFEST, None)
    if raw is None or raw.dtype != np.uint8:
        raise BadEntry("no manifest")
    manifest = json.loads(raw.tobytes().decode())
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("key") != key:
        raise BadEntry("written for another key or format")
    if manifest.get("checksum") != _checksum(arrays, manifest.get("tree")):
        raise BadEntry("its arrays and manifest do not match their checksum (edited or corrupt)")
    try:
        return _unpack(manifest.get("tree"), arrays)
    except (KeyError, TypeError, IndexError) as exc:
        raise BadEntry(f"its manifest does not match its arrays ({type(exc).__name__}: {exc})") from None


def cached(key: str | None, compute: Callable[[], Any], fits: Callable[[Any], bool] = lambda value: True) -> Any:
    """`compute()`, or its stored result under `key` (None, or the cache turned off: always compute); `fits`: whether
    a stored value has the shape `compute` returns (one that does not is an entry that cannot be trusted)."""
    folder = cache_dir()
    if key is None or folder is None:
        return compute()
    path = folder / f"{key}{SUFFIX}"
    try:
        value = read_entry(path, key)
        if not fits(value):
            raise BadEntry("its value is not shaped as the data it stands for")
        return value
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, RecursionError, TypeError,
            KeyError, AttributeError) as exc:
        # BadEntry and json's errors are ValueErrors; numpy refuses pickled arrays with a ValueError too
        warnings.warn(f"tokenised-data cache entry {path} cannot be trusted ({type(exc).__name__}: {exc}); "
                      "tokenising again and replacing it", stacklevel=2)
    value = compute()
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=folder)
        with os.fdopen(fd, "wb") as fh:
            write_entry(fh, key, value)
        os.replace(tmp, path)  # replaces a planted link itself, never the file it points to
    except OSError:  # a read-only or full disk only costs the reuse
        if tmp:
            Path(tmp).unlink(missing_ok=True)
    return value


def tokenized_key(spec, tokenizer, data_dir, t) -> str | None:
    """The cache key of a task's tokenised splits for training settings `t`; None for hub data."""
    from suite.run.data import task_data_dir

    folder = task_data_dir(spec, data_dir)
    if folder is None:
        return None
    splits = [spec.train_split, *spec.eval_splits.values()]
    files = [folder / spec.local_dir / spec.local[s].file for s in splits if s in spec.local]
    if len(files) != len(splits) or not all(f.is_file() for f in files):
        return None  # missing files: let the reader raise its own error
    settings = {"max_length": t.max_length, "max_train_samples": t.max_train_samples,
                "max_eval_samples": t.max_eval_samples, "train_eval_samples": t.train_eval_samples,
                "data_seed": t.data_seed}
    return cache_key(spec, tokenizer, files, settings)
