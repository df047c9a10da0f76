"""The results store: one JSON record per run under `<out>/runs/`, written atomically, found by config hash.

Beside a record, a `.predictions.npz` sidecar holds the run's per-example dev predictions. Every record is read
through `suite.run.record.read_record` (the one reader): a file that is not a valid record counts as "not done" and
is named in a warning, so a grid reruns that job and a report leaves it out, instead of crashing or trusting it.
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

from suite.api.errors import SuiteError
from suite.run.layout import OutputFolder
from suite.run.record import (
    REFUSED,
    TMP_PREFIX,
    InvalidRecord,
    NewerRecord,
    RunRecord,
    predictions_filename,
    read_record,
    record_files,
    save_predictions,
)
from suite.run.record_parts import Artifacts
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["RecordNotSaved", "Store", "atomic_write", "record_json", "run_paces"]

try:
    import fcntl
except ImportError:  # Windows: no record locks (see JobClaims)
    fcntl = None


class OtherJobsRecord(InvalidRecord):
    """A valid record whose contents are of another job than its file name says (its hash differs)."""


def job_hash_of(filename: str) -> str | None:
    """The job hash a record's file name ends with (TASK__METHOD__seedN__MODEL__HASH.json); None for other names."""
    stem = filename[:-len(".json")] if filename.endswith(".json") else filename
    tail = stem.rpartition("__")[2]
    return tail if "__" in stem and len(tail) == 12 and all(c in "0123456789abcdef" for c in tail) else None


@dataclasses.dataclass(frozen=True)
class Skip:
    """Why a grid skips a job: its `ok` record exists, or a record that must be `kept` stands at its name."""
    why: str
    kept: bool = False


class RecordNotSaved(SuiteError, OSError):
    """A finished record could not be written where it belongs; the message says where it was kept instead."""


def _clean(obj):
    """JSON has no NaN/inf: write them as null so every reader can parse the records."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def record_json(data: dict[str, Any]) -> bytes:
    """A record's file: its JSON (`RunRecord.to_dict`) as the store writes it. A record read and written back is the
    same bytes (tests/test_record_reads.py)."""
    return json.dumps(_clean(data), indent=1).encode()


def _file_mode() -> int:
    """The mode an ordinary new file gets (0666 minus the umask): records are readable like any other file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(target: Path, write) -> None:
    """Write through a temporary file in the same folder and rename: a reader never sees half a file, and a kill
    mid-write leaves the previous state intact."""
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=target.suffix, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a full disk on write or fsync names no file
            exc.filename = str(target)
        raise


class Store:
    def __init__(self, out: str | os.PathLike):
        self.root = Path(out)
        self.runs = OutputFolder(out).runs

    def path(self, filename: str) -> Path:
        return self.runs / filename

    def write(self, filename: str, record: RunRecord | dict[str, Any]) -> Path:
        """Write a record (and its predictions sidecar). On failure (unwritable folder, full disk) the record is
        kept in a fallback file and RecordNotSaved says where; earlier records are never touched."""
        data = record.to_dict() if isinstance(record, RunRecord) else dict(record)
        arrays = record.prediction_arrays if isinstance(record, RunRecord) else None
        try:
            self.runs.mkdir(parents=True, exist_ok=True)
            self.set_aside(filename)
            if arrays:
                sidecar, written = predictions_filename(filename), io.BytesIO()
                save_predictions(written, arrays)
                atomic_write(self.path(sidecar), lambda fh: fh.write(written.getvalue()))
                data["predictions"] = sidecar
                data["predictions_sha256"] = hashlib.sha256(written.getvalue()).hexdigest()
            blob = record_json(data)
            atomic_write(self.path(filename), lambda fh: fh.write(blob))
        except OSError as exc:
            raise RecordNotSaved(self._fallback(filename, data, exc)) from exc
        return self.path(filename)

    def set_aside(self, filename: str) -> Path | None:
        """Move a file at a record's name that the reader refuses (edited by hand, truncated, a FIFO) and its
        sidecar to NAME.refused-N.json (and .predictions.npz), so that the job's new record never replaces what may
        be the only copy of a run's numbers; one line names it. Returns where it went (None: nothing refused)."""
        path = self.path(filename)
        if not os.path.lexists(path) or self.kept_reason(filename) is not None:
            return None
        try:
            self._parse(filename)
            return None  # a record: a rerun (--force, a failed run) replaces it as asked
        except InvalidRecord as exc:
            why = str(exc)
        except OSError:
            return None  # a folder or a dangling link: the write says what stands there
        stem, n = filename[:-len(".json")] if filename.endswith(".json") else filename, 1
        while os.path.lexists(self.path(f"{stem}{REFUSED}{n}.json")):
            n += 1
        aside = self.path(f"{stem}{REFUSED}{n}.json")
        _keep_copy(path, aside)
        sidecar = self.path(predictions_filename(filename))
        if os.path.lexists(sidecar):
            _keep_copy(sidecar, self.path(predictions_filename(aside.name)))
        warnings.warn(f"{path} is no record this suite reads ({why.removeprefix(str(path) + ': ')}): set aside as "
                      f"{aside.name} before its job's new record is written", stacklevel=2)
        return aside

    def add_artifacts(self, filename: str, artifacts: dict[str, Any]) -> dict[str, Any]:
        """Add files a finished run left later (test predictions from its saved model) to its record's `artifacts`,
        rewriting the record atomically: every other field, unknown ones included, is written back as read."""
        rec = self._parse(filename)
        rec.artifacts = Artifacts.from_json({**rec.artifact_files(str(self.path(filename))), **artifacts}, "artifacts")
        data = rec.to_dict()
        blob = record_json(data)
        atomic_write(self.path(filename), lambda fh: fh.write(blob))
        return data

    def _fallback(self, filename: str, data: dict[str, Any], exc: OSError) -> str:
        folder = Path(tempfile.gettempdir()) / "suite-unsaved-records"
        why = f"could not write {self.path(filename)}: {exc.strerror or exc}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            blob = record_json(data)
            # a shared temporary folder: a link planted at the name is replaced, never written through
            atomic_write(folder / filename, lambda fh: fh.write(blob))
            return f"{why}. The record was kept in {folder / filename}: copy it into {self.runs}/ once it is writable"
        except OSError:
            return f"{why}, nor in {folder}. The record follows:\n{json.dumps(_clean(data))}"

    def _parse(self, filename: str) -> RunRecord:
        """The record (raises what reading or validating raises), of the job its file name names (else
        OtherJobsRecord)."""
        path = self.path(filename)
        rec = read_record(path)
        named = job_hash_of(filename)
        if named is not None and rec.hash != named:
            raise OtherJobsRecord(f"{path} holds the record of another job ({rec.label!r}, hash "
                                  f"{rec.hash!r}), not of the job its name says (hash {named!r})")
        return rec

    def read(self, filename: str) -> RunRecord | None:
        """The record, or None when absent or not a valid record (warned, by file name)."""
        path = self.path(filename)
        try:
            return self._parse(filename)
        except FileNotFoundError:
            return None
        except (OSError, InvalidRecord) as exc:
            warnings.warn(f"{path} is not a readable run record ({exc}); its job counts as not done (a file the "
                          f"reader refuses is set aside as NAME{REFUSED}N.json before a new record replaces it)",
                          stacklevel=2)
            return None

    def status(self, filename: str) -> str | None:
        rec = self.read(filename)
        return None if rec is None else rec.status

    def skip_reason(self, filename: str, force: bool = False) -> Skip | None:
        """Why a grid skips the job of this record file (None: it runs): the one rule of the real run and of
        `run --dry-run`. A record kept though unusable here (another user's, a newer suite's, another job's) skips
        it even with `force`; an `ok` record skips it unless `force`."""
        kept = self.kept_reason(filename)
        if kept:
            return Skip(f"kept and skipped: {kept}", kept=True)
        return Skip("record exists") if not force and self.status(filename) == "ok" else None

    def kept_reason(self, filename: str) -> str | None:
        """Why an existing record file must be kept although this process cannot use it (None: nothing to keep).

        A record this process cannot open (another user's, permissions) or that a newer suite wrote is a finished
        run all the same: its job is skipped and the file never replaced. A file that is not a record at all
        (truncated, not JSON, missing fields) is not a finished run and counts as not done."""
        path = self.path(filename)
        try:
            self._parse(filename)
        except FileNotFoundError:
            return None
        except NewerRecord as exc:
            return f"{exc}; or move the file away to run the job again"
        except OtherJobsRecord as exc:
            # a valid record under the wrong name (copied or renamed by hand): it may be the only copy of that run,
            # so it is never replaced; this job is not done, and the user decides where the file belongs
            return f"{exc}: kept; rename or move it to run this job"
        except PermissionError as exc:
            return (f"{path} exists but cannot be read ({exc.strerror}): fix its permissions, or move it away to run "
                    "the job again")
        except (OSError, InvalidRecord):
            return None
        return None

    def __iter__(self) -> Iterator[tuple[Path, RunRecord]]:
        return iter_records(self.runs)

    def claims(self) -> "JobClaims":
        """Locks that keep another grid writing into this folder from running the same jobs at the same time."""
        return JobClaims(self.runs)


def _keep_copy(path: Path, copy: Path) -> None:
    """A second name for the file (a hard link; a copy where the file system has none): the original stays until
    the new record replaces it, so a write that fails leaves the folder as it was."""
    try:
        os.link(path, copy, follow_symlinks=False)
    except OSError:
        shutil.copyfile(path, copy, follow_symlinks=False)


def iter_records(*folders: str | os.PathLike) -> Iterator[tuple[Path, RunRecord]]:
    """(file, record) of each valid record; invalid files are skipped with a warning naming them."""
    for folder in folders:
        for path in record_files(folder):
            try:
                rec = read_record(path)
            except (OSError, InvalidRecord) as exc:
                warnings.warn(f"skipping {path}: {exc}", stacklevel=2)
                continue
            yield path, rec


@dataclasses.dataclass(frozen=True)
class RunPace:
    """An ok record's whole-run pace: its device kind ("cpu" or "cuda"), the job as it ran (an older record's missing
    settings filled with what it ran with), its wall seconds per optimizer step (training, evaluation and loading, at
    its machine's threads and load) and its torch threads (None: not recorded)."""

    device: str
    job: RunConfig
    step_s: float
    threads: int | None


def run_paces(out: str | os.PathLike, most: int | None = None) -> list[RunPace]:
    """The paces of the ok records in an output folder's runs/ and its tuning/runs/ (a study's tuning runs belong to
    it); with `most`, at most that many files a folder, every n-th by name, so that every task is sampled (names begin
    with the task). Files that are no readable record are left out: their readers name them."""
    paces = []
    for folder in (OutputFolder(out).runs, OutputFolder(out).tuning.runs):
        files = record_files(folder)
        for path in files[::-(-len(files) // most) or 1] if most else files:
            try:
                rec = read_record(path)
                job = RunConfig.from_dict(rec.config) if rec.ok else None
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if job is not None and rec.timing.steps and rec.wall_s:
                threads = int(rec.env.cpu_threads) if rec.env.cpu_threads.isdigit() else None
                paces.append(RunPace("cuda" if rec.env.device.startswith("cuda") else "cpu", job,
                                     rec.wall_s / rec.timing.steps, threads))
    return paces


# ---------------------------------------------------------------------------------------------------------
# Claims: a job is never trained by two grids at the same time
# ---------------------------------------------------------------------------------------------------------

CLAIMS_FILE = ".claims"


class JobClaims:
    """The jobs this grid runs, each claimed by a POSIX record lock on one byte of `OUT/runs/.claims` (the byte at
    the job's hash). A second grid writing into the same folder finds those bytes locked and skips the jobs.

    The kernel drops the locks when the process ends, however it ends (SIGKILL, a crash), so a claim is never stale.
    The locks belong to the process: two grids in one process do not see each other's claims. On a system without
    `fcntl` (Windows) nothing is locked.
    """

    def __init__(self, runs: Path):
        self.path = Path(runs) / CLAIMS_FILE
        self._fd: int | None = None

    def claim(self, jobs: list) -> tuple[list, list]:
        """(claimed by this grid, claimed by another live grid); claimed jobs stay claimed until `close`."""
        if fcntl is None:
            return list(jobs), []
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_symlink():  # a planted link (dangling or not) must not make a file outside the folder
                self.path.unlink()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), _file_mode())
        mine, elsewhere = [], []
        for job in jobs:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _claim_offset(job.hash))
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                elsewhere.append(job)
            else:
                mine.append(job)
        return mine, elsewhere

    def close(self) -> None:
        """Give every claim up (closing the file releases all of this process's locks on it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "JobClaims":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _claim_offset(job_hash: str) -> int:
    """The byte that stands for a job: its 12-hex-digit hash read as a number (well inside a 64-bit file offset)."""
    return int(job_hash, 16)
