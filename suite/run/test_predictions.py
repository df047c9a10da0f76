"""Test-set predictions in the format the GLUE server takes, and fine-tuned checkpoints that can be loaded again.

A submission is one TSV per test set, `index<TAB>prediction`, named as the server expects (`CoLA.tsv`, `MNLI-m.tsv`,
`MNLI-mm.tsv`, `AX.tsv`, ...): label ids for CoLA, SST-2, MRPC, QQP and WNLI, label names for the NLI tasks (MNLI,
AX, QNLI, RTE), a score in [0, 5] for STS-B. The diagnostic set AX is predicted by the MNLI model. Test sets whose
file is not in the data folder are skipped (and named). Tasks declare theirs in `TaskSpec.test_sets` (or with
`suite.register_test_set`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from suite.api.errors import BadInput, DataError
from suite.api.tasks import TaskSpec, TestSet
from suite.run.batching import collate, sorted_batches, to_device
from suite.run.data import check_width, header_columns, tsv_rows

# what the rest of the suite uses; other names are this module's own
__all__ = ["available_test_sets", "checkpoint_job", "format_predictions", "load_checkpoint", "predict_test",
           "save_checkpoint"]

CHECKPOINT_INFO = "suite_run.json"  # the job a checkpoint folder was trained by (config of its record)


# ---------------------------------------------------------------------------------------------------------
# Reading test sets
# ---------------------------------------------------------------------------------------------------------

def available_test_sets(spec: TaskSpec, data_dir: Path | None) -> tuple[list[TestSet], list[str]]:
    """(test sets that can be read, names of the ones whose file is absent). A local file that is present is read
    now, so that a malformed one stops the grid before training (DataError with file and line). From the hub, all
    are available."""
    sets = list(spec.test_sets)
    if data_dir is None:
        return [s for s in sets if s.hub], [s.name for s in sets if not s.hub]
    found = [s for s in sets if (Path(data_dir) / s.file).is_file()]
    for test_set in found:
        read_test_set(spec, test_set, data_dir)
    return found, [f"{s.name} ({Path(data_dir) / s.file})" for s in sets if s not in found]


def read_test_set(spec: TaskSpec, test_set: TestSet, data_dir: Path | None) -> dict[str, list]:
    """{text field: [...], "index": [...]} from a local TSV, read as strictly as the train and dev files
    (`suite.run.data.tsv_rows`: bounded lines, every row the header's width, file:line in each error), or the hub."""
    if data_dir is None:
        import datasets

        ds = datasets.load_dataset(*test_set.hub[:2], split=test_set.hub[2])
        return {**{f: list(ds[f]) for f in spec.text_fields}, "index": list(ds["idx"])}
    path = Path(data_dir) / test_set.file
    rows = tsv_rows(path)
    header = next(rows, (1, None))[1]
    at = header_columns(path, header, [test_set.index, *test_set.columns.values()], f"{spec.display} test")
    out: dict[str, list] = {**{f: [] for f in test_set.columns}, "index": []}
    for line, row in rows:
        if not row or row == [""]:
            continue
        check_width(path, line, row, len(header), len(header))
        for field, column in test_set.columns.items():
            out[field].append(row[at[column]].replace("\ufeff", "").strip())
        out["index"].append(_row_number(path, line, test_set.index, row[at[test_set.index]]))
    return out


def _row_number(path: Path, line: int, column: str, raw: str) -> int:
    """The index column's value as an integer; a value that is none names its file and line."""
    try:
        return int(raw)
    except ValueError:
        raise DataError(f"{path}:{line}: {column} {raw!r} is not an integer row number. Repair that line or "
                        "re-download the task's data.") from None


# ---------------------------------------------------------------------------------------------------------
# Predicting and writing
# ---------------------------------------------------------------------------------------------------------

def predict_logits(model, tokenizer, spec: TaskSpec, columns: dict[str, list], max_length: int, batch_size: int,
                   device, amp_dtype=None) -> np.ndarray:
    """Logits of every row, in the rows' order, with the model in eval mode."""
    import torch

    encoded = tokenizer(*[columns[f] for f in spec.text_fields], truncation=True, max_length=max_length)
    keys = [k for k in ("input_ids", "token_type_ids") if k in encoded]
    features = [{k: encoded[k][i] for k in keys} for i in range(len(columns["index"]))]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    logits = np.zeros((len(features), spec.num_labels), dtype=np.float32)
    was_training = model.training
    model.eval()
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    with torch.no_grad(), autocast:
        for rows in sorted_batches([len(f["input_ids"]) for f in features], batch_size):
            batch = collate([features[i] for i in rows], [0] * len(rows), pad_id, spec.is_regression)
            batch.pop("labels")
            logits[rows] = model(**to_device(batch, device)).logits.float().cpu().numpy()
    model.train(was_training)
    return logits


def format_predictions(spec: TaskSpec, test_set: TestSet, logits: np.ndarray) -> list[str]:
    """The prediction column as the GLUE server reads it."""
    if test_set.output == "score":
        low, high = spec.score_range or (-np.inf, np.inf)
        return [f"{v:.3f}" for v in np.clip(logits[:, 0], low, high)]
    ids = logits.argmax(-1)
    return [spec.label_names[i] for i in ids] if test_set.output == "names" else [str(int(i)) for i in ids]


def write_submission(path: Path, index: list[int], predictions: list[str]) -> None:
    """Written through a temporary file and renamed: a link planted at `path` is replaced, never written through."""
    order = np.argsort(index, kind="stable")
    lines = ["index\tprediction"] + [f"{index[i]}\t{predictions[i]}" for i in order]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".tsv", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def predict_test(model, tokenizer, spec: TaskSpec, data_dir: Path | None, out: Path, max_length: int,
                 batch_size: int, device, amp_dtype=None) -> dict[str, Any]:
    """Write `out/NAME.tsv` for each test set of the task; {"files": {name: file}, "absent": [...]}."""
    found, absent = available_test_sets(spec, data_dir)
    if not found:
        raise DataError(f"{spec.display} has no test set to predict" + (f": not found {', '.join(absent)}"
                                                                          if absent else " declared"))
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for test_set in found:
        columns = read_test_set(spec, test_set, data_dir)
        logits = predict_logits(model, tokenizer, spec, columns, max_length, batch_size, device, amp_dtype)
        write_submission(out / f"{test_set.name}.tsv", columns["index"], format_predictions(spec, test_set, logits))
        files[test_set.name] = f"{test_set.name}.tsv"
    return {"files": files, "absent": absent}


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------

def save_checkpoint(folder: Path, model, tokenizer, job) -> str:
    """Weights (the method's own parameters included), tokenizer and the job that trained them, with each file's
    sha256; returns the digest of them all, which the run's record keeps (`artifacts.model_sha256`)."""
    from suite.run.layout import own_folder

    own_folder(folder)  # links planted in the output folder are replaced, never written through
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    files = checkpoint_files(folder)
    (folder / CHECKPOINT_INFO).write_text(json.dumps({"config": job.to_dict(), "files": files}, indent=1,
                                                     default=str))
    return files_digest(files)


def checkpoint_files(folder: Path) -> dict[str, str]:
    """sha256 of every file in a checkpoint folder but its description, by path relative to the folder."""
    found = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != CHECKPOINT_INFO):
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        found[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return found


def files_digest(files: dict[str, str]) -> str:
    """One digest of a checkpoint's files (names and contents): what the run's record keeps."""
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


def verify_checkpoint(folder: Path, expected: str | None = None) -> None:
    """DataError naming the files when a checkpoint's files are not the ones its run saved: against the digests its
    description wrote, and against `expected` (its record's `artifacts.model_sha256`) when there is a record. A
    checkpoint saved before digests were written, with no record to hold it against, loads with a warning."""
    found = checkpoint_files(folder)
    try:
        written = json.loads((Path(folder) / CHECKPOINT_INFO).read_text()).get("files")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        written = None  # checkpoint_job has already named an unreadable description
    fix = "save the model again with `python -m suite run ... --save-model --force`"
    if isinstance(written, dict):
        changed = sorted(name for name in set(found) | set(written) if found.get(name) != written.get(name))
        if changed:
            raise DataError(f"{folder}: {', '.join(changed[:5])} differ from what the run saved (sha256 in "
                            f"{CHECKPOINT_INFO}): the files were replaced, added or damaged since; {fix}")
    if expected is not None and files_digest(found) != expected:
        raise DataError(f"{folder}: its files are not the ones its record's run saved (digest "
                        f"{files_digest(found)[:12]}, the record keeps {str(expected)[:12]}): another run's model, "
                        f"or files replaced since; {fix}")
    if expected is None and not isinstance(written, dict):
        warnings.warn(f"{folder}: saved before checkpoints held digests and no record holds one: its weights are "
                      "loaded unverified", stacklevel=2)


def checkpoint_job(folder: Path):
    """The RunConfig a checkpoint folder's description names; DataError (one line, the file) when it is not one."""
    from suite.run.record import RECORD_VERSION
    from suite.run.settings import RunConfig

    info = Path(folder) / CHECKPOINT_INFO
    if not info.is_file():
        raise DataError(f"{folder} is not a checkpoint of the suite (no {CHECKPOINT_INFO}): give a folder written "
                        "by `python -m suite run --save-model`, or the record of such a run")
    try:
        described = json.loads(info.read_text())
        config = described["config"]
        job = RunConfig.from_dict(config)
        job.hash  # noqa: B018  an unknown method or malformed settings fail here, not half-way through loading
        return job
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataError(f"{info}: not a readable checkpoint description ({type(exc).__name__}: {exc})") from None
    except TypeError as exc:
        if "unexpected keyword" in str(exc):  # a field this suite does not know: written by a newer one
            raise DataError(f"{info}: written by a newer suite than this one (record version {RECORD_VERSION}; "
                            f"{exc}): upgrade the suite to load this checkpoint") from None
        raise DataError(f"{info}: not a checkpoint description of the suite ({exc})") from None
    except (KeyError, AttributeError, ValueError) as exc:
        if isinstance(exc, BadInput):  # e.g. an unknown method: its own message says how to fix it
            raise DataError(f"{info}: {exc}") from None
        raise DataError(f"{info}: not a checkpoint description of the suite ({type(exc).__name__}: {exc}); "
                        "expected {\"config\": {...}} as `run --save-model` writes it") from None


def _weights_problem(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "weights_only" in str(exc).lower() or "Weights only load failed" in str(exc):
        return ("pytorch_model.bin holds code, not only tensors, and was refused (torch.load weights_only): it is "
                "not a file this suite wrote; do not load it")
    return f"{type(exc).__name__}: {text[:300]}"


def load_checkpoint(folder: str | Path, device, expected_digest: str | None = None):
    """(model with its method attached and the trained weights, tokenizer, RunConfig, TaskSpec), once its files are
    the ones its run saved (`verify_checkpoint`; `expected_digest`: its record's). The commands check first that its
    weights fit in memory (`suite.grid.preflight.check_checkpoint_fits`)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    from suite.api.tasks import get_task
    from suite.run.models import build_method, checked_tokenizer, quiet_transformers

    folder = Path(folder)
    job = checkpoint_job(folder)
    verify_checkpoint(folder, expected_digest)
    try:
        with quiet_transformers():
            model = AutoModelForSequenceClassification.from_pretrained(folder, attn_implementation="sdpa")
        build_method(job).attach(model)  # the method may add parameters: load every saved tensor once it has
        weights = load_file(folder / "model.safetensors")
    except BadInput:
        raise
    except Exception as exc:  # noqa: BLE001  truncated or foreign weights: one line, not a traceback
        raise DataError(f"{folder}: cannot load the saved model ({_weights_problem(exc)}). Save it again with "
                        "`python -m suite run ... --save-model --force`") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise DataError(f"{folder}: the saved weights do not fit {job.method} on this model "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    try:
        tokenizer = checked_tokenizer(str(folder), folder)  # the check a training model passes, before any row
    except BadInput as exc:
        raise DataError(f"{folder}: the saved model cannot predict: {exc}") from None
    return model.to(device).eval(), tokenizer, job, get_task(job.task)
