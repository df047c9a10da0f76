"""`python -m suite predict`: test-set predictions (GLUE server format) from checkpoints saved by `run --save-model`."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.api.errors import BadInput

COMMAND = "predict"


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, help="test-set predictions in the GLUE server's format from saved checkpoints",
                       description="Loads each checkpoint (a RUN.model/ folder written by `run --save-model`, or the "
                                   "run's record RUN.json) and writes one TSV per test set of its task "
                                   "(index, prediction) into --out: a folder ready to zip for the GLUE server.")
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help="RUN.model/ folders or their RUN.json records")
    p.add_argument("--out", required=True, help="folder for the TSVs (CoLA.tsv, MNLI-m.tsv, AX.tsv, ...)")
    p.add_argument("--data-dir", help="folder of task data with the test files (else $SUITE_DATA_DIR, else the hub)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda ...")
    p.add_argument("--batch-size", type=positive_int, help="examples per batch (default: the run's eval batch size)")


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse turns the error into a usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return value


def checkpoint_folder(path: str) -> tuple[Path, str | None]:
    """(the checkpoint folder as given or as a record's `artifacts.model` names it, the digest of its files that the
    run's record keeps, or None). A folder given directly is held against the record beside it when there is one."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        record = _record(p)
        if record is None or not record.saved_model:
            raise BadInput(f"{p}: this run kept no model (it ran without --save-model); rerun it with "
                           "`python -m suite run ... --save-model --force`")
        return p.parent / record.saved_model, record.artifacts.model_sha256
    if not p.is_dir():
        raise BadInput(f"{p}: no such checkpoint folder or record")
    beside = p.parent / (p.name.removesuffix(".model") + ".json")
    record = _record(beside, quiet=True) if p.name.endswith(".model") and beside.is_file() else None
    if record is None and p.name.endswith(".model") and beside.is_file():
        print(f"warning: {beside} is not a readable run record: {p} is held against its own description only "
              "(weights swapped together with it would go unnoticed)", file=sys.stderr)
    kept = record is not None and record.saved_model == p.name
    return p, record.artifacts.model_sha256 if kept else None


def _record(path: Path, quiet: bool = False):
    """The run record at `path`; BadInput when it cannot be read (None instead when `quiet`)."""
    from suite.run.record import read_record

    try:
        return read_record(path)
    except (OSError, ValueError) as exc:  # InvalidRecord is a ValueError
        if quiet:
            return None
        raise BadInput(f"{path}: not a readable run record ({type(exc).__name__}: {exc}); give a RUN.json "
                       "written by `python -m suite run`, or its RUN.model/ folder") from None


def main(args) -> int:
    from suite.grid.preflight import check_checkpoint_fits
    from suite.run.data import resolve_data_dir, task_data_dir
    from suite.run.device import autocast_dtype, pick_device
    from suite.run.layout import check_folder_name
    from suite.run.test_predictions import load_checkpoint, predict_test

    check_folder_name("--out", args.out)
    checkpoints = [checkpoint_folder(c) for c in args.checkpoints]
    device, data_dir, out = pick_device(args.device), resolve_data_dir(args.data_dir), Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot make the submission folder there ({exc.strerror or exc}); give a "
                       "folder") from None
    seen: dict[str, Path] = {}
    for folder, digest in checkpoints:
        check_checkpoint_fits(folder, str(device))  # run's memory preflight, from config.json before any weight
        model, tokenizer, job, spec = load_checkpoint(folder, device, digest)
        if spec.name in seen:
            raise BadInput(f"{folder} and {seen[spec.name]} are both {spec.display} runs: one submission holds one "
                           "run per task; write them to separate --out folders")
        seen[spec.name] = folder
        t = job.train
        found = predict_test(model, tokenizer, spec, task_data_dir(spec, data_dir), out, t.max_length,
                             args.batch_size or t.eval_batch_size, device, autocast_dtype(t.precision, device))
        for name, file in found["files"].items():
            print(f"{spec.display} ({job.label}): {out / file}")
        for absent in found["absent"]:
            print(f"{spec.display}: test set not found, skipped: {absent}", file=sys.stderr)
    return 0
