"""Outputs asked for now of runs that finished before: test-set predictions from each run's saved model, no retraining.

A grid skips a job whose `ok` record exists. When the command asks for `--predict-test` and such a record has none,
the predictions are made from the model the run kept (`--save-model`, `RUN.model/`) and named in the record, which is
rewritten atomically with everything else it held. A run that kept no model cannot give them without retraining,
nor can a model be saved after the fact: each such run is named, with the command that gets them (`--force`).
"""
from __future__ import annotations

from pathlib import Path

from suite.api.errors import BadInput, DataError
from suite.grid.store import Store
from suite.run.layout import own_folder
from suite.run.outputs import RunOutputs, artifact_path
from suite.run.record import InvalidRecord, RunRecord
from suite.run.settings import RunConfig

__all__ = ["complete_outputs"]  # what the rest of the suite uses; other names are this module's own

RETRAIN = "--force reruns it (with --save-model --predict-test)"


def lacking(jobs: list[RunConfig], store: Store, outputs: RunOutputs | None) -> dict[str, list[RunConfig]]:
    """Jobs with an `ok` record that lacks an output asked for now: {"model": [...], "test_predictions": [...]}."""
    wanted = [k for k, on in (("model", outputs and outputs.save_model),
                              ("test_predictions", outputs and outputs.predict_test)) if on]
    found: dict[str, list[RunConfig]] = {k: [] for k in wanted}
    for job in jobs:
        rec = store.read(job.filename)
        if rec is not None and rec.ok:
            for k in wanted:
                if k not in record_artifacts(store, job, rec):
                    found[k].append(job)
    return found


def record_artifacts(store: Store, job: RunConfig, rec: RunRecord) -> dict:
    """The record's `artifacts` ({} when it has none); BadInput naming the record when it holds something else."""
    try:
        return rec.artifact_files(str(store.path(job.filename)))
    except InvalidRecord as exc:
        raise BadInput(f"{exc}: restore the record, or remove it and give the command again to rerun that "
                       "run") from None


def saved_model(store: Store, job: RunConfig) -> tuple[Path | None, str]:
    """(the run's checkpoint folder, "") or (None, why there is none) from the run's record."""
    rec = store.read(job.filename)
    model = None
    if rec is not None:
        record_artifacts(store, job, rec)  # BadInput when its artifacts are not what a run record holds
        model = rec.saved_model
    if not model:
        return None, "its record has no saved model (it ran without --save-model)"
    folder = store.runs / model
    if not folder.is_dir():
        return None, f"its saved model {folder} is gone"
    return folder, ""


def predict_from_saved_model(job: RunConfig, store: Store, folder: Path, data_dir, device) -> dict:
    """Test-set predictions of one finished run from its checkpoint; returns the artifacts added to its record."""
    from suite.grid.preflight import check_checkpoint_fits
    from suite.run.data import task_data_dir
    from suite.run.device import autocast_dtype
    from suite.run.test_predictions import load_checkpoint, predict_test

    check_checkpoint_fits(folder, str(device))  # from its config.json, before any weight loads
    rec = store.read(job.filename)
    digest = rec.artifacts.model_sha256 if rec is not None and rec.artifacts is not None else None
    model, tokenizer, trained, spec = load_checkpoint(folder, device, digest)
    if trained.hash != job.hash:
        raise DataError(f"{folder} holds the model of another run (hash {trained.hash}, not {job.hash})")
    out = own_folder(artifact_path(store.root, job.filename, "test"))  # a link planted there is replaced
    t = trained.train
    found = predict_test(model, tokenizer, spec, task_data_dir(spec, data_dir), out, t.max_length,
                         t.eval_batch_size, device, autocast_dtype(t.precision, device))
    artifacts: dict = {"test_predictions": {name: f"{out.name}/{file}" for name, file in found["files"].items()}}
    if found["absent"]:
        artifacts["test_sets_absent"] = found["absent"]
    return artifacts


def complete_outputs(jobs: list[RunConfig], store: Store, outputs: RunOutputs | None, data_dir, device: str,
                     force: bool = False) -> list[str]:
    """Give finished runs the test predictions asked for now, from their saved models; returns one line per run
    (what was written, or why nothing could be and how to get it). With `force` every job reruns: nothing to do."""
    if force or outputs is None:
        return []
    todo = lacking(jobs, store, outputs)
    lines = [f"{job.label}: its record has no saved model, and a model cannot be saved without retraining: "
             f"{RETRAIN}" for job in todo.get("model", [])]
    pending = todo.get("test_predictions", [])
    if not pending:
        return lines
    from suite.run.device import pick_device

    claims = store.claims()  # no other grid may rewrite these records while their artifacts are added
    try:
        mine, elsewhere = claims.claim(pending)
        lines += [f"{job.label}: being run by another grid: its test predictions are left to it" for job in elsewhere]
        torch_device = pick_device(device) if mine else None
        for job in mine:
            lines.append(_predict_one(job, store, data_dir, torch_device))
    finally:
        claims.close()
    return lines


def _predict_one(job: RunConfig, store: Store, data_dir, device) -> str:
    rec = store.read(job.filename)  # read again under the claim: another grid may have rerun it meanwhile
    if rec is None or not rec.ok or "test_predictions" in record_artifacts(store, job, rec):
        return f"{job.label}: record changed meanwhile; left as it is"
    folder, why = saved_model(store, job)
    if folder is None:
        return f"{job.label}: no test predictions: {why}; {RETRAIN}"
    try:
        artifacts = predict_from_saved_model(job, store, folder, data_dir, device)
    except DataError as exc:
        return f"{job.label}: no test predictions from {folder.name}: {exc}; {RETRAIN}"
    store.add_artifacts(job.filename, artifacts)
    files = ", ".join(artifacts["test_predictions"].values())
    return f"{job.label}: test predictions from its saved model (no retraining): {files}"
