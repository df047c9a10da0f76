"""Bringing home what a run writes besides its record, for workers that do not share the driver's output folder
(a Ray cluster reached with --address): the run writes into a private folder on its node, the files come back with the
record as one tar archive, and the driver unpacks them into its own output folder before it writes the record, so
the record's `artifacts` name files that exist where the record is.

What comes back: the saved model (`runs/STEM.model/`), the test-set predictions (`runs/STEM.test/`), TensorBoard
event files and offline W&B runs (`tracking/`). An MLflow SQLite store is one file shared by every run and cannot be
merged this way: MLflow on such a cluster needs a tracking server (MLFLOW_TRACKING_URI=http://...), or a shared
output folder (`ship=False`).
"""
from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from suite.api.errors import ExecutorError
from suite.run.layout import TRACKING, own_folder
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["check_outputs_can_come_back", "in_private_folder", "pack", "unpack"]

MLFLOW_SERVER_SCHEMES = ("http://", "https://", "databricks")


def check_outputs_can_come_back(jobs: list[RunConfig], env: dict[str, str] | None = None) -> dict[str, str]:
    """Before anything runs on workers without the driver's output folder: refuse what cannot come back (MLflow's
    local SQLite store). Returns the environment variables the workers need (the MLflow server's address)."""
    env = os.environ if env is None else env
    if not any(j.outputs and "mlflow" in j.outputs.report_to for j in jobs):
        return {}
    uri = env.get("MLFLOW_TRACKING_URI", "")
    if not uri.startswith(MLFLOW_SERVER_SCHEMES):
        raise ExecutorError("--report-to mlflow with --executor ray --address: MLflow's local store is one SQLite "
                            "file shared by all runs, which cannot be brought back from the workers' nodes. Set "
                            "MLFLOW_TRACKING_URI to a tracking server (http://HOST:5000), or give the cluster a "
                            "shared output folder and pass ship=False (the study's executor: ship: false)"
                            + (f" (MLFLOW_TRACKING_URI={uri!r} is not a server)" if uri else ""))
    return {"MLFLOW_TRACKING_URI": uri}


def in_private_folder(job: RunConfig) -> tuple[RunConfig, Path | None]:
    """(the job writing its outputs into a fresh private folder, that folder); the job itself when it writes none."""
    if not (job.outputs and job.outputs.active):
        return job, None
    folder = Path(tempfile.mkdtemp(prefix="suite-outputs-"))
    return dataclasses.replace(job, outputs=dataclasses.replace(job.outputs, root=str(folder))), folder


def pack(folder: Path) -> bytes:
    """Everything the run wrote under `folder` as an uncompressed tar (weights do not compress); the folder is
    removed. Links are left out (W&B's `latest-run`), and so is an MLflow SQLite store (see the module's note)."""
    buffer = io.BytesIO()
    try:
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for path in sorted(folder.rglob("*")):
                if path.is_symlink() or not path.is_file() or path.name.startswith("mlflow.db"):
                    continue
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return buffer.getvalue()


def unpack(blob: bytes, root: str | os.PathLike) -> list[str]:
    """Unpack a run's returned files under the driver's output folder `root`; a model or test folder from an
    earlier run of the same job is replaced, not merged, and a link planted at one (or at OUT/tracking) is replaced,
    never written through. Returns the top-level entries written."""
    root = Path(root)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        names = tar.getnames()
        tops = sorted({"/".join(n.split("/")[:2]) for n in names if n.startswith("runs/")})
        for top in tops:
            if (root / top).is_symlink():  # rmtree refuses a link, and extracting would then go through it
                (root / top).unlink()
            shutil.rmtree(root / top, ignore_errors=True)
        if any(n.startswith(f"{TRACKING}/") for n in names):
            own_folder(root / TRACKING)
        tar.extractall(root, filter="data")  # "data": no absolute paths, no escaping the folder, no devices
    return tops + sorted({"/".join(n.split("/")[:3]) for n in names if n.startswith("tracking/")})
