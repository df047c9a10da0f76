"""Experiment tracking: `--report-to tensorboard,mlflow,wandb` logs each run's configuration, per-epoch curves and
final metrics to the trackers people already use.

Everything stays on this machine unless a tracker is configured otherwise: TensorBoard event files under
`OUT/tracking/tensorboard/RUN/`, an MLflow SQLite store at `OUT/tracking/mlflow.db` (set `MLFLOW_TRACKING_URI` to
use a server instead), and Weights & Biases in offline mode under `OUT/tracking/wandb/` (`wandb sync` uploads it
later; set `WANDB_MODE=online` to log live). Each tracker is an optional extra: `pip install '.[tracking]'`.
"""
from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any, Iterable

from suite.api.errors import BadInput

TRACKERS = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}  # name -> module it needs
PROJECT = "suite"  # MLflow experiment and W&B project name


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
    out = {k: entry[k] for k in ("train_loss", "dev_loss", "train_subset_loss", "epoch_time_s",
                                 "train_samples_per_s") if k in entry}
    for group in ("dev", "train_subset"):
        out.update({f"{group}/{k}": v for k, v in (entry.get(group) or {}).items()})
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def final_metrics(record) -> dict[str, float]:
    final = {f"final/{k}": v for k, v in (record.final or {}).items()}
    final["wall_s"] = record.wall_s
    return {k: float(v) for k, v in final.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class TensorBoardTracker:
    def __init__(self, folder: Path, name: str, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard" / name))
        self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in flat_config(config).items()))

    def epoch(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def finish(self, values: dict[str, float], status: str) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, 0)
        self.writer.add_text("status", status)
        self.writer.close()


class MLflowTracker:
    def __init__(self, folder: Path, name: str, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(folder / 'mlflow.db').resolve()}"
        self.client = MlflowClient(uri)
        experiment = self.client.get_experiment_by_name(PROJECT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(PROJECT)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        for key, value in flat_config(config).items():
            self.client.log_param(self.run_id, key, str(value)[:500])  # MLflow caps parameter values

    def epoch(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.client.log_metric(self.run_id, key.replace("/", "."), value, step=step)

    def finish(self, values: dict[str, float], status: str) -> None:
        self.epoch(0, values)
        self.client.set_terminated(self.run_id, status="FINISHED" if status == "ok" else "FAILED")


class WandbTracker:
    def __init__(self, folder: Path, name: str, config: dict[str, Any]):
        import wandb

        (folder / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=PROJECT, name=name, config=config, dir=str(folder / "wandb"),
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")

    def epoch(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def finish(self, values: dict[str, float], status: str) -> None:
        self.run.summary.update({**values, "status": status})
        self.run.finish(exit_code=0 if status == "ok" else 1)


TRACKER_CLASSES = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "wandb": WandbTracker}


class RunTracking:
    """The trackers of one run: opened with the run's configuration, fed each epoch, closed with the record."""

    def __init__(self, names: Iterable[str], folder: str | os.PathLike, name: str, config: dict[str, Any]):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.trackers = [TRACKER_CLASSES[n](folder, name, config) for n in names]

    def epoch(self, entry: dict[str, Any]) -> None:
        values = epoch_metrics(entry)
        for tracker in self.trackers:
            tracker.epoch(int(entry["epoch"]), values)

    def finish(self, record) -> None:
        values = final_metrics(record)
        for tracker in self.trackers:
            tracker.finish(values, record.status)
