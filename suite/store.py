"""The results store: one JSON record per run under `<out>/runs/`, written atomically, found by config hash."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


def _clean(obj):
    """JSON has no NaN/inf: write them as null so every reader can parse the records."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


class Store:
    def __init__(self, out: str | os.PathLike):
        self.root = Path(out)
        self.runs = self.root / "runs"

    def path(self, filename: str) -> Path:
        return self.runs / filename

    def write(self, filename: str, record: dict[str, Any]) -> Path:
        """Write through a temporary file in the same folder and rename: a reader never sees half a record,
        and a kill mid-write leaves the previous state intact."""
        self.runs.mkdir(parents=True, exist_ok=True)
        target = self.path(filename)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.runs)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(_clean(record), fh, indent=1, sort_keys=False)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def read(self, filename: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.path(filename).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def status(self, filename: str) -> str | None:
        rec = self.read(filename)
        return None if rec is None else rec.get("status")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter_records(self.runs)


def iter_records(*folders: str | os.PathLike) -> Iterator[dict[str, Any]]:
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            try:
                rec = json.loads(path.read_text())
            except json.JSONDecodeError:
                continue
            rec["_path"] = str(path)
            yield rec
