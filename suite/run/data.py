"""A task's data: loading its splits from the hub or a local folder, seeded subsets and tokenisation.

Both sources are normalised to the hub's schema: the task's text columns, `label` (hub label ids, or a float for
regression) and `idx`. What a task is lives in `suite.api.tasks`; how examples become batches in
`suite.run.batching`.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from suite.api.errors import DataError
from suite.api.tasks import LocalSplit, TaskSpec
from suite.run.batching import collate

# what the rest of the suite uses; other names are this module's own
__all__ = ["DATA_DIR_ENV", "Encoded", "check_width", "encode", "header_columns", "load_splits", "read_local_split",
           "resolve_data_dir", "seeded_subset", "task_data_dir", "tsv_rows"]

DATA_DIR_ENV = "SUITE_DATA_DIR"


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------

def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The local data folder: the explicit argument, else $SUITE_DATA_DIR, else None (use the hub)."""
    d = data_dir or os.environ.get(DATA_DIR_ENV) or None
    return Path(d).expanduser() if d else None


def split_path(spec: TaskSpec, split: str, data_dir: Path) -> Path:
    if split not in spec.local:
        raise DataError(f"task {spec.display} has no local file layout for split {split!r}")
    return data_dir / spec.local_dir / spec.local[split].file


def check_local(spec: TaskSpec, data_dir: Path) -> None:
    """Fail early, before any training, when a split the run needs is absent."""
    if not data_dir.is_dir():
        raise DataError(f"data folder {data_dir} does not exist. Pass --data-dir with a folder of GLUE TSVs "
                        f"(or set ${DATA_DIR_ENV})" + (f", or leave both unset to load {spec.hub[0]} from the hub."
                                                       if spec.hub else "."))
    for split in [spec.train_split, *spec.eval_splits.values()]:
        path = split_path(spec, split, data_dir)
        if not path.is_file():
            raise DataError(
                f"{spec.display}: missing file {path} (split {split!r}). Either load the task from the hub "
                f"(omit --data-dir and unset ${DATA_DIR_ENV}; needs internet), or point --data-dir at another "
                f"folder that holds {spec.local_dir}/{spec.local[split].file}.")


def read_local_split(spec: TaskSpec, split: str, data_dir: Path) -> dict[str, list]:
    """Read one split of a GLUE-format TSV: no CSV quoting, no NA coercion, BOMs stripped, labels mapped to hub ids.
    A file that is not UTF-8 text (another encoding, UTF-16, binary) or a line too long for a TSV field raises
    DataError with file and line."""
    layout = spec.local[split]
    path = split_path(spec, split, data_dir)
    if not path.is_file():
        check_local(spec, data_dir)
    out = _read_rows(spec, layout, tsv_rows(path), path)
    if not out["idx"]:
        raise DataError(f"{path}: no rows. Re-download the task's data.")
    return out


def tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each line of a GLUE-format TSV (no quoting; a leading BOM dropped), read one bounded
    line at a time. Anything that is no such file (not UTF-8, binary, a line or field longer than any GLUE text)
    raises DataError with file and line, before the line is held in memory whole. The train, dev and test readers
    all read through here."""
    with open(path, encoding="utf-8-sig", newline="") as fh:  # utf-8-sig drops MRPC's leading BOM
        reader = csv.reader(_text_lines(fh, path), delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            for row in reader:
                yield reader.line_num, row
        except UnicodeDecodeError:
            raise _encoding_error(path) from None
        except csv.Error as exc:
            raise _csv_error(path, reader.line_num, exc) from None


def header_columns(path: Path, header: list[str] | None, names: Iterable[str], what: str) -> dict[str, int]:
    """{name: its position in the header line} of each of `names`; DataError (file:1) when the file is empty or a
    column is missing."""
    if header is None:
        raise DataError(f"{path}: the file is empty; expected a header line. Re-download the task's data.")
    missing = [n for n in names if n not in header]
    if missing:
        raise DataError(f"{path}:1: header has no column {', '.join(map(repr, missing))} (found {header}). "
                        f"Is this the {what} file in the GLUE layout?")
    return {n: header.index(n) for n in names}


def check_width(path: Path, line: int, row: list[str], width: int | None, need: int) -> None:
    """A row with the header's number of fields (`width`; None: no header) and at least `need` of them."""
    if (width is not None and len(row) != width) or len(row) < need:
        raise DataError(f"{path}:{line}: expected {width or need} tab-separated fields, found {len(row)}. "
                        "The file is malformed (an unescaped tab or a truncated line); repair that line "
                        "or re-download the task's data.")


def _read_rows(spec: TaskSpec, layout: LocalSplit, rows: Iterator[tuple[int, list[str]]],
               path: Path) -> dict[str, list]:
    out: dict[str, list] = {c: [] for c in (*spec.text_fields, "label", "idx")}
    width = None
    if layout.header:
        header = next(rows, (1, None))[1]
        width = len(header) if header is not None else None
        at = header_columns(path, header, layout.columns.values(), spec.display)
        index = {col: at[name] for col, name in layout.columns.items()}
    else:
        index = {col: int(i) for col, i in layout.columns.items()}
    need = max(index.values()) + 1
    for line, row in rows:
        if not row or row == [""]:
            continue
        check_width(path, line, row, width, need)
        for col in spec.text_fields:
            out[col].append(row[index[col]].replace("\ufeff", "").strip())
        out["label"].append(_label(spec, layout, row[index["label"]].strip(), path, line))
        out["idx"].append(len(out["idx"]))
    return out


# a line of a task file, all its fields together (each one is held to csv.field_size_limit(), 131,072): GLUE's
# longest is 1,451 characters (QNLI's test set); a longer one is corrupt (lost line breaks, binary data), and
# reading it whole could take the machine's memory (a 50 MB test line took 13.6 GB once tokenised)
MAX_LINE_CHARS = 2_000_000


def _text_lines(fh, path: Path):
    """The file's lines, each read to at most MAX_LINE_CHARS characters; a NUL character means binary data (or
    UTF-16 without a byte-order mark), never text."""
    number = 0
    while text := fh.readline(MAX_LINE_CHARS + 1):
        number += 1
        if len(text) > MAX_LINE_CHARS:
            raise DataError(f"{path}:{number}: a line longer than {MAX_LINE_CHARS:,} characters: no GLUE text is "
                            "that long, so the line is corrupt (lost line breaks, or binary data). Repair that line "
                            "or re-download the task's data.")
        if "\x00" in text:
            raise DataError(f"{path}:{number}: NUL bytes: this is not a UTF-8 text file (binary data, or UTF-16). "
                            f"Convert it to UTF-8 text (iconv -f UTF-16 -t UTF-8 for UTF-16) or re-download the "
                            "task's data.")
        yield text


def _encoding_error(path: Path) -> DataError:
    """Where the file stops being UTF-8, found by reading it again as bytes (the text reader decodes in chunks and
    cannot say which line)."""
    with open(path, "rb") as fh:
        if fh.read(2) in (b"\xff\xfe", b"\xfe\xff"):
            return DataError(f"{path}:1: the file is UTF-16 encoded (it starts with a UTF-16 byte-order mark); the "
                             f"reader takes UTF-8. Convert it: iconv -f UTF-16 -t UTF-8 {path} > {path.name}.utf8, "
                             "then put the converted file in its place.")
        fh.seek(0)
        for number, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return DataError(f"{path}:{number}: bytes {raw[exc.start:exc.start + 4]!r} at column {exc.start + 1} "
                                 "are not UTF-8 (binary data, or text saved in another encoding). Re-save the file "
                                 "as UTF-8 (e.g. iconv -f latin1 -t utf-8) or re-download the task's data.")
    return DataError(f"{path}: not UTF-8 text. Re-save the file as UTF-8 or re-download the task's data.")


def _csv_error(path: Path, line: int, exc: csv.Error) -> DataError:
    if "field limit" in str(exc):
        return DataError(f"{path}:{line}: a field longer than {csv.field_size_limit()} characters: no GLUE text is "
                         "that long, so the line is corrupt (lost line breaks, or binary data). Repair that line or "
                         "re-download the task's data.")
    return DataError(f"{path}:{line}: {exc}. Repair that line or re-download the task's data.")


def _label(spec: TaskSpec, layout: LocalSplit, raw: str, path: Path, line: int):
    try:
        if spec.is_regression:
            return _score(spec, float(raw), raw, path, line)
        if layout.labels is not None:
            return layout.labels[raw]
        value = int(raw)
        if not 0 <= value < spec.num_labels:
            raise ValueError
        return value
    except (KeyError, ValueError):
        valid = sorted(layout.labels) if layout.labels else list(range(spec.num_labels))
        kind = "a float score" if spec.is_regression else f"one of {valid}"
        raise DataError(f"{path}:{line}: label {raw!r} is not {kind}. Repair that line or re-download the data.")


def _score(spec: TaskSpec, value: float, raw: str, path: Path, line: int) -> float:
    """A regression label must be finite (NaN would fail training or give a null score) and in the task's range."""
    if not math.isfinite(value):
        raise DataError(f"{path}:{line}: score {raw!r} is not a finite number. Repair that line or re-download "
                        "the data.")
    if spec.score_range is not None and not spec.score_range[0] <= value <= spec.score_range[1]:
        low, high = spec.score_range
        raise DataError(f"{path}:{line}: score {raw!r} is outside {spec.display}'s range [{low:g}, {high:g}]. "
                        "Repair that line or re-download the data.")
    return value


def load_splits(spec: TaskSpec, data_dir: str | os.PathLike | None) -> dict[str, dict[str, list]]:
    """All splits a run needs, as column dicts keyed by hub split name."""
    splits = [spec.train_split, *spec.eval_splits.values()]
    local = task_data_dir(spec, data_dir)
    if local is None and spec.hub is None:
        raise DataError(f"task {spec.display} has local files only: pass --data-dir (or set ${DATA_DIR_ENV}) with "
                        f"a folder that holds {spec.local_dir or '.'}/, or give the task a data_dir")
    if local is not None:
        check_local(spec, local)
        return {s: read_local_split(spec, s, local) for s in splits}
    return {s: _hub_split(spec, s) for s in splits}


def _hub_split(spec: TaskSpec, split: str) -> dict[str, list]:
    import datasets

    try:
        ds = datasets.load_dataset(*spec.hub, split=split)
    except Exception as exc:
        raise DataError(
            f"could not load {spec.hub[0]}/{spec.hub[1]} split {split!r} from the hub ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Offline? Point --data-dir (or ${DATA_DIR_ENV}) at a folder of GLUE TSVs.") from exc
    return {c: list(ds[c]) for c in (*spec.text_fields, "label", "idx")}


def task_data_dir(spec: TaskSpec, data_dir: str | os.PathLike | None) -> Path | None:
    """Where a task's files are: its own `data_dir` when it has one, else the grid's folder (or None: the hub)."""
    return Path(spec.data_dir).expanduser() if spec.data_dir else resolve_data_dir(data_dir)




# ---------------------------------------------------------------------------------------------------------
# Tokenisation and subsets
# ---------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Encoded:
    """A tokenised split: unpadded token lists (padded per batch) and labels."""

    features: list[dict[str, list[int]]]
    labels: list
    index: list[int] | None = None  # each example's row in its split (the `idx` column): predictions keep it
    groups: list[int] | None = None  # the held-out split's: each row's carving group (its example se is by group)

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.features]

    def subset(self, indices) -> "Encoded":
        index = None if self.index is None else [self.index[i] for i in indices]
        groups = None if self.groups is None else [self.groups[i] for i in indices]
        return Encoded([self.features[i] for i in indices], [self.labels[i] for i in indices], index, groups)

    def batch(self, indices, pad_id: int, regression: bool, width: int | None = None) -> dict:
        """The tensors of the examples at `indices` (labels included), padded to `width` (None: the longest)."""
        return collate([self.features[i] for i in indices], [self.labels[i] for i in indices], pad_id, regression,
                       width)


def seeded_subset(n: int, limit: int | None, seed: int) -> list[int]:
    """Indices of a seeded random subset of size `limit` (all, in order, when limit is None or >= n)."""
    import numpy as np

    if limit is None or limit >= n:
        return list(range(n))
    return sorted(np.random.default_rng(seed).choice(n, size=limit, replace=False).tolist())


def encode(spec: TaskSpec, columns: dict[str, list], tokenizer, max_length: int) -> Encoded:
    texts = [columns[f] for f in spec.text_fields]
    enc = tokenizer(*texts, truncation=True, max_length=max_length)
    keys = [k for k in ("input_ids", "token_type_ids") if k in enc]
    features = [{k: enc[k][i] for k in keys} for i in range(len(columns["label"]))]
    index = list(columns["idx"]) if "idx" in columns else None
    return Encoded(features, list(columns["label"]), index)
