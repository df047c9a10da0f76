"""Tokenised splits shared across processes: a grid's worker processes (and later invocations) tokenise a task's
subset once; the others read it from a disk cache.

The cache key covers everything the tokens depend on: the tokenizer's files, the task, the data files (path, size,
modification time) and the settings that pick and cut the rows. Entries live in `$SUITE_CACHE_DIR` (default
`~/.cache/suite/tokenized`) and are written atomically, so concurrent workers never read half a file. Hub data is not
cached here (the `datasets` cache already keeps the download; tokenising again is what is left). Set
`SUITE_CACHE_DIR=off` to turn the cache off.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

CACHE_ENV = "SUITE_CACHE_DIR"


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() == "off":
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "suite" / "tokenized"


def _file_facts(path: Path) -> list[Any]:
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns]


def _tokenizer_facts(tokenizer) -> list[Any]:
    """The tokenizer's class, name and its files on disk (a changed vocabulary changes the key)."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or "")
    files = sorted(p for p in folder.glob("*") if p.is_file() and p.suffix in (".json", ".txt", ".model")) \
        if folder.is_dir() else []
    return [type(tokenizer).__name__, str(folder), len(tokenizer), *(_file_facts(p) for p in files)]


def cache_key(spec, tokenizer, data_files: list[Path], settings: dict[str, Any]) -> str:
    blob = json.dumps([spec.name, repr(spec), _tokenizer_facts(tokenizer), [_file_facts(p) for p in data_files],
                       settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached(key: str | None, compute: Callable[[], Any]) -> Any:
    """`compute()`, or its stored result under `key` (None, or the cache turned off: always compute)."""
    folder = cache_dir()
    if key is None or folder is None:
        return compute()
    path = folder / f"{key}.pkl"
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError):
        pass
    value = compute()
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
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
