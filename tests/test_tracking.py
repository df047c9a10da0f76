"""Each tracker offline, fed directly (no training): the training loss every few steps, per-epoch curves and final
metrics under one set of names in every back end, TensorBoard's HParams, the MLflow experiment from the environment
or the study, the same tags everywhere, and no MLflow INFO lines."""
import logging
import time

import pytest
from conftest import needs

from suite.run.record_parts import Metrics
from suite.run.tracking import RunTracking, with_grid_tags

CONFIG = {"model": "minilm", "task": "rte", "method": "vanilla", "hparams": {}, "seed": 3,
          "train": {"lr": 2e-5, "max_eval_samples": None}, "data_source": "local"}
GRID = {"study": "glue-minilm", "grid": "0123abcd"}
NAMES = {"step/train_loss", "step/lr", "train_loss", "dev_loss", "dev/score", "dev/accuracy", "final/score",
         "final/accuracy", "wall_s"}


class Record:
    final = Metrics.from_json({"score": 0.61, "accuracy": 0.61})
    wall_s = 12.0
    status = "ok"


def _log(folder, names, grid=GRID):
    tracking = RunTracking(names, folder, "rte__vanilla__seed3", CONFIG, grid)
    for step, loss in ((10, 0.69), (20, 0.64)):
        tracking.step(step, {"step/train_loss": loss, "step/lr": 1e-5, "step/nan": float("nan")})
    tracking.epoch({"epoch": 1, "train_loss": 0.66, "dev_loss": 0.67, "dev": {"score": 0.55, "accuracy": 0.55}})
    tracking.finish(Record())


@needs("tensorboard")
def test_tensorboard_steps_epochs_final_and_hparams(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    _log(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(tmp_path / "tensorboard" / "rte__vanilla__seed3"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == NAMES
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("step/train_loss")] == [(10, 0.69), (20, 0.64)]
    assert events.Scalars("final/score")[0].value == pytest.approx(0.61)
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["method"].string_value == "vanilla" and hparams["study"].string_value == "glue-minilm"
    assert hparams["train.lr"].number_value == pytest.approx(2e-5) and hparams["seed"].string_value == "3"
    assert "final/score" in {m.name.tag for m in plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]).experiment.metric_infos}


def _mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")


@needs("mlflow")
def test_mlflow_experiment_from_environment_or_study_tags_names_and_no_info_lines(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    import mlflow  # noqa: F401  (its import sets up its INFO logging: the tracker must quiet it)

    logging.getLogger("mlflow").setLevel(logging.INFO)
    _log(tmp_path, ["mlflow"])
    assert "INFO" not in capfd.readouterr().err
    client = _mlflow(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("glue-minilm").experiment_id])
    assert {k: run.data.tags[k] for k in ("study", "grid", "method", "task", "seed")} == {
        **GRID, "method": "vanilla", "task": "rte", "seed": "3"}
    assert run.data.tags["suite_version"] and run.data.tags["git_commit"]
    assert set(run.data.metrics) == NAMES and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "step/train_loss")
    assert [(m.step, m.value) for m in history] == [(10, 0.69), (20, 0.64)]
    assert run.data.params["train.lr"] == "2e-05"

    # the experiment: $MLFLOW_EXPERIMENT_NAME first; without it and without a study, the suite's own
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "my-ablation")
    _log(tmp_path, ["mlflow"])
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    _log(tmp_path, ["mlflow"], grid={})
    assert len(client.search_runs([client.get_experiment_by_name("my-ablation").experiment_id])) == 1
    assert len(client.search_runs([client.get_experiment_by_name("suite").experiment_id])) == 1


@needs("wandb")
def test_wandb_offline_gets_the_same_names_tags_and_project(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    _log(tmp_path, ["wandb"])
    (log,) = list((tmp_path / "wandb" / "wandb").glob("offline-run-*/*.wandb"))
    blob, deadline = log.read_bytes(), time.monotonic() + 60
    while b"final/score" not in blob and time.monotonic() < deadline:  # W&B's service writes the log on its own time
        time.sleep(0.5)
        blob = log.read_bytes()
    for name in NAMES | {"optimizer_step", "study:glue-minilm", "method:vanilla", "glue-minilm", "0123abcd"}:
        assert name.encode() in blob, name


def test_grid_tags_name_the_study_and_the_same_grid_for_the_same_jobs(tmp_path):
    from suite.run.outputs import RunOutputs
    from suite.run.settings import RunConfig, TrainSettings

    outputs = RunOutputs(str(tmp_path), report_to=("mlflow",))
    jobs = [RunConfig("minilm", "rte", "vanilla", {}, seed, TrainSettings(), outputs=outputs) for seed in (1, 2)]
    tagged = with_grid_tags(jobs, "studies/glue-minilm.yaml")
    assert dict(tagged[0].outputs.tags)["study"] == "glue-minilm"
    assert with_grid_tags(jobs[::-1], None)[0].outputs.tags[1] == tagged[0].outputs.tags[1]  # order-free grid id
    assert with_grid_tags(jobs[:1], None)[0].outputs.tags[1] != tagged[0].outputs.tags[1]
    assert [j.hash for j in tagged] == [j.hash for j in jobs]  # tags never touch a run's hash
