"""Experiment tracking: `--report-to tensorboard,mlflow,wandb` logs each run's configuration, its training loss every
few steps, per-epoch curves and final metrics to the trackers people already use (docs/tracking.md).

Everything stays on this machine unless a tracker is configured otherwise: TensorBoard event files under
`OUT/tracking/tensorboard/RUN/`, an MLflow SQLite store at `OUT/tracking/mlflow.db` (set `MLFLOW_TRACKING_URI` to
use a server instead), and Weights & Biases in offline mode under `OUT/tracking/wandb/` (`wandb sync` uploads it
later; set `WANDB_MODE=online` to log live). Each tracker is an optional extra: `pip install '.[tracking]'`.

Every tracker gets the same metric names (`step/train_loss`, `dev/score`, `final/score`, ...: `metric_names`), the
same tags (study, grid, method, task, model, seed, code version: `run_tags`) and the same grouping: the MLflow
experiment and the W&B project are `$MLFLOW_EXPERIMENT_NAME` / `$WANDB_PROJECT`, else the study's name, else `suite`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable

from suite.api.errors import BadInput
from suite.run.layout import own_folder

# what the rest of the suite uses; other names are this module's own
__all__ = ["RunTracking", "check_trackers", "with_grid_tags"]

TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}  # name -> module it needs
PROJECT = "suite"  # MLflow experiment and W&B project name when neither the environment nor a study names one
# x axes: optimizer steps for step/* (logged every suite.run.training.STEP_LOG_BATCHES batches), epochs for the rest
STEP_AXIS, EPOCH_AXIS = "optimizer_step", "epoch"


def check_trackers(names: Iterable[str]) -> tuple[str, ...]:
    """Validate `--report-to` names before anything trains: known, and their library installed."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in names if n.strip()))
    for name in names:
        if name not in TRACKERS:
            raise BadInput(f"--report-to {name!r}: unknown tracker. Valid: {', '.join(TRACKERS)}")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise BadInput(f"--report-to {name} needs the {TRACKERS[name]!r} package, which is not installed: "
                           f"pip install '.[tracking]' (or pip install {TRACKERS[name]})")
    return names


def flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """{'train': {'lr': 1e-5}} -> {'train.lr': 1e-5}: trackers show flat parameters."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in flat_config(value).items()})
        else:
            out[key] = value
    return out


def epoch_metrics(entry: dict[str, Any]) -> dict[str, float]:
    """The numbers of one history entry as tracker metrics: losses, dev/*, train_subset/*, speed."""
    out = {k: entry[k] for k in ("train_loss", "dev_loss", "train_subset_loss", "tune_loss", "epoch_time_s",
                                 "train_samples_per_s") if k in entry}
    for group in ("dev", "train_subset", "tune"):
        out.update({f"{group}/{k}": v for k, v in (entry.get(group) or {}).items()})
    return _finite(out)


def final_metrics(record) -> dict[str, float]:
    final = {f"final/{k}": v for k, v in record.final.values.items()}
    final["wall_s"] = record.wall_s
    return _finite(final)


def _finite(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def with_grid_tags(jobs: list, study: str | None) -> list:
    """The grid's jobs, their outputs carrying what groups them in the trackers: the study's name (its file's stem)
    and the grid's id (the same jobs give the same id, so a resumed grid keeps it)."""
    grid = hashlib.sha256(",".join(sorted(job.hash for job in jobs)).encode()).hexdigest()[:12]
    tags = (("study", Path(study).stem if study else ""), ("grid", grid))
    return [dataclasses.replace(job, outputs=dataclasses.replace(job.outputs, tags=tags)) if job.outputs else job
            for job in jobs]


def run_tags(config: dict[str, Any], grid_tags: dict[str, str]) -> dict[str, str]:
    """The tags every tracker gives a run: its study and grid, method, task, model, seed, and the code that ran it."""
    import suite
    from suite.run.device import git_commit

    return {"study": grid_tags.get("study") or "", "grid": grid_tags.get("grid") or "", "method": config["method"],
            "task": config["task"], "model": str(config["model"]), "seed": str(config["seed"]),
            "suite_version": suite.__version__, "git_commit": git_commit() or "unknown"}


def experiment_name(tags: dict[str, str], variable: str) -> str:
    """`$variable` (MLFLOW_EXPERIMENT_NAME, WANDB_PROJECT), else the study's name, else `suite`."""
    return os.environ.get(variable) or tags.get("study") or PROJECT


def hparam_value(value: Any) -> int | float | str | bool:
    """TensorBoard's HParams take numbers, strings and booleans only."""
    return value if isinstance(value, (int, float, str, bool)) else str(value)


class TensorBoardTracker:
    def __init__(self, folder: Path, name: str, config: dict[str, Any], tags: dict[str, str]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard" / name))
        self.hparams = {k: hparam_value(v) for k, v in {**flat_config(config), **tags}.items()}
        self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in self.hparams.items()))

    def step(self, step: int, values: dict[str, float]) -> None:
        self.epoch(step, values)

    def epoch(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, values: dict[str, float], status: str) -> None:
        # the HParams tab: this run's configuration and tags with its final metrics (written in the run's own folder,
        # which also gets the final/* scalars)
        self.writer.add_hparams(self.hparams, values, run_name=".", global_step=0)
        self.writer.add_text("status", status)
        self.writer.close()


def quiet_mlflow() -> None:
    """MLflow and the database migrations it runs log at INFO ("Creating initial MLflow database tables", alembic's
    "Context impl SQLiteImpl"): lines that interleave with the grid's own."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


class MLflowTracker:
    def __init__(self, folder: Path, name: str, config: dict[str, Any], tags: dict[str, str]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        quiet_mlflow()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
        self.client = MlflowClient(uri)
        experiment = experiment_name(tags, "MLFLOW_EXPERIMENT_NAME")
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in flat_config(config).items()]  # MLflow caps parameter values
        for i in range(0, len(params), 100):  # at most 100 parameters per call
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def step(self, step: int, values: dict[str, float]) -> None:
        self.epoch(step, values)

    def epoch(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def finish(self, values: dict[str, float], status: str) -> None:
        self.epoch(0, values)
        self.client.set_terminated(self.run_id, status="FINISHED" if status == "ok" else "FAILED")


class WandbTracker:
    def __init__(self, folder: Path, name: str, config: dict[str, Any], tags: dict[str, str]):
        import wandb

        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=experiment_name(tags, "WANDB_PROJECT"), group=tags.get("grid") or None,
                              name=name, config={**config, "tags": tags}, dir=str(folder / "wandb"),
                              tags=[f"{k}:{v}"[:64] for k, v in tags.items() if v],
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")
        self.run.define_metric(STEP_AXIS)
        self.run.define_metric(EPOCH_AXIS)
        self.run.define_metric("step/*", step_metric=STEP_AXIS)
        self._defined: set[str] = set()

    def step(self, step: int, values: dict[str, float]) -> None:
        self.run.log({**values, STEP_AXIS: step})

    def epoch(self, step: int, values: dict[str, float]) -> None:
        for key in set(values) - self._defined:  # W&B needs one increasing step: each axis is a metric of its own
            self.run.define_metric(key, step_metric=EPOCH_AXIS)
            self._defined.add(key)
        self.run.log({**values, EPOCH_AXIS: step})

    def finish(self, values: dict[str, float], status: str) -> None:
        self.run.summary.update({**values, "status": status})
        self.run.finish(exit_code=0 if status == "ok" else 1)


TRACKER_CLASSES = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "wandb": WandbTracker}


class RunTracking:
    """The trackers of one run: opened with the run's configuration and tags, fed every few steps and each epoch,
    closed with the record."""

    def __init__(self, names: Iterable[str], folder: str | os.PathLike, name: str, config: dict[str, Any],
                 grid_tags: dict[str, str] | None = None):
        folder = own_folder(folder)  # OUT/tracking: a link planted there is replaced, never written through
        tags = run_tags(config, grid_tags or {})
        self.trackers = [TRACKER_CLASSES[n](folder, name, config, tags) for n in names]

    def step(self, step: int, values: dict[str, float]) -> None:
        values = _finite(values)
        for tracker in self.trackers:
            tracker.step(step, values)

    def epoch(self, entry: dict[str, Any]) -> None:
        values = epoch_metrics(entry)
        for tracker in self.trackers:
            tracker.epoch(int(entry["epoch"]), values)

    def finish(self, record) -> None:
        values = final_metrics(record)
        for tracker in self.trackers:
            tracker.finish(values, record.status)
