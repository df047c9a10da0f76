"""Logs made for files: no progress bars when stderr is no terminal, `--quiet` keeps the per-run lines with the ETA,
and `--dry-run` prints the warnings a real run prints."""
import io
import math

from suite.commands import main
from suite.grid.executors.status import GridStatus
from suite.run.record import RunRecord
from suite.run.record_parts import Metrics, Timing
from suite.run.settings import RunConfig, TrainSettings
from suite.run.training import _progress


def test_no_training_bar_when_stderr_is_no_terminal(capsys):
    bar = _progress(5, "rte/vanilla/seed1 ep1/1", quiet=False)  # pytest's captured stderr is no terminal
    bar.update(5)
    bar.close()
    assert bar.disable and "\r" not in capsys.readouterr().err
    assert _progress(5, "x", quiet=True).disable


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_drops_the_bar_but_keeps_the_lines_with_their_eta():
    job = RunConfig("minilm", "rte", "vanilla", {}, 1, TrainSettings())
    for stream, quiet in ((Terminal(), True), (io.StringIO(), False)):
        status = GridStatus(2, quiet=quiet, stream=stream)
        assert status._bar is None
        status.started(job)
        status.finished_run(job, RunRecord(job.to_dict(), job.hash, job.label, "ok",
                                           final=Metrics.from_json({"score": 0.5}), wall_s=3.0))
        (line,) = stream.getvalue().splitlines()
        assert line.startswith("  done rte/vanilla/seed1: dev 0.5000") and "[1/2: 1 done" in line
        assert "ETA" in line and "\r" not in stream.getvalue()


def test_a_finished_run_names_the_split_of_each_score():
    """A tuning run shows its tuning-split score first (what the stage chooses by), dev beside it; a run that keeps a
    held-out test split shows that split, not dev."""
    from suite.grid.executors.status import scores

    job = RunConfig("minilm", "rte", "vanilla", {}, 1, TrainSettings())

    def record(**parts):
        return RunRecord(job.to_dict(), job.hash, job.label, "ok", final=Metrics.from_json({"score": 0.5}), **parts)

    assert scores(record()) == "dev 0.5000"
    assert scores(record(tune=Metrics.from_json({"score": 0.7}))) == "tuning split 0.7000 (dev 0.5000)"
    assert scores(record(heldout=Metrics.from_json({"score": 0.6}))) == "heldout 0.6000"


def test_dry_run_prints_the_warnings_of_a_real_run(tmp_path, capsys):
    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--out", str(tmp_path),
            "--set", "scores_dropout.p=0.2", "--dry-run"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "rte/vanilla/seed1" in out
    assert "warning: --set scores_dropout.p=0.2 has no effect" in err


def test_a_run_logging_to_a_file_prints_its_start_and_one_line_per_epoch(tiny_bert_dir, glue_dir, tmp_path, capsys):
    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", tiny_bert_dir,
            "--data-dir", glue_dir, "--epochs", "2", "--batch-size", "8", "--out", str(tmp_path),
            "--precision", "fp32", "--set", "train.holdout=6"]
    assert main(argv) == 0
    err = capsys.readouterr().err  # pytest's captured stderr is no terminal, as a log file under nohup
    lines = [line for line in err.splitlines() if "rte/vanilla/seed1" in line]
    epochs = [line for line in lines if " epoch " in line and "train loss" in line]
    assert any(line.startswith("  start rte/vanilla/seed1: 2 epoch(s) x") for line in lines), err
    phases = [line.split(": ")[1] for line in lines if line.startswith("  rte/vanilla/seed1: ")]
    assert [p.split()[0] for p in phases] == ["data", "model", "attention"], phases  # each stretch outside the epochs
    assert [line.split(":")[0] for line in epochs] == ["  rte/vanilla/seed1 epoch 1/2", "  rte/vanilla/seed1 epoch 2/2"]
    assert all("tuning score" in line and "dev score" in line and "ETA" in line and "grid ETA" in line
               for line in epochs), epochs
    assert "\r" not in err


def test_quiet_keeps_only_the_finished_run_lines(tiny_bert_dir, glue_dir, tmp_path, capsys):
    from conftest import run_cli

    assert run_cli(tiny_bert_dir, glue_dir, tmp_path) == 0  # --quiet
    err = capsys.readouterr().err
    assert "  done rte/vanilla/seed1" in err and " epoch 1/1" not in err and "start rte" not in err


def _event(kind, step, steps=100, elapsed=10.0, epoch=1):
    from suite.run.progress import Progress

    return Progress(kind, epoch, 2, step, steps, elapsed, 40, train_loss=0.5, dev_score=0.6)


def _phase(step):
    from suite.run.progress import Progress

    return Progress("phase", 0, 2, step, 0, 12.0, phase="attention statistics: 4 dev batch(es)")


def test_the_grid_eta_comes_from_the_steps_left_at_the_rate_so_far():
    a = RunConfig("minilm", "rte", "vanilla", {}, 1, TrainSettings())
    b = RunConfig("minilm", "rte", "vanilla", {}, 2, TrainSettings())
    status = GridStatus(2, stream=io.StringIO(), planned={a.hash: 100, b.hash: 300})
    status.start -= 100.0                    # the driver's own setup (workers starting): not the runs' rate
    status.started(a)
    status.progress(a, _event("start", 0))
    status.first_event -= 10.0               # 10 s since the first run reported
    status.progress(a, _event("steps", 50))  # 50 steps in 10 s: 5 steps/s; 50 + 300 left
    assert abs(status.eta() - 350 / 5) < 1.0
    status.progress(a, _phase(50))           # a phase after the steps keeps the steps made
    assert abs(status.eta() - 350 / 5) < 1.0
    status.progress(b, _event("start", 0, steps=200))  # the run's own count replaces the plan's
    assert abs(status.eta() - 250 / 5) < 1.0


def test_the_grid_eta_weighs_each_step_by_what_a_step_of_its_task_costs():
    """A CoLA step (short sentences) costs a fraction of an MRPC step (pairs): the ETA weighs the steps left by each
    kind's seconds per step, the grid's own measure (whole epochs) where it has one, else earlier records' scaled to
    the grid's pace; records of kinds the grid does not run, or of no kind it has measured, are left out."""
    from suite.grid.executors.status import step_kind

    mrpc = RunConfig("minilm", "mrpc", "vanilla", {}, 1, TrainSettings())
    cola = RunConfig("minilm", "cola", "vanilla", {}, 1, TrainSettings())
    other = RunConfig("minilm", "stsb", "vanilla", {}, 1, TrainSettings(max_length=256))   # not in the grid
    planned, kinds = {mrpc.hash: 100, cola.hash: 400}, {j.hash: step_kind(j) for j in (mrpc, cola)}

    def grid(step_cost=None):
        status = GridStatus(2, stream=io.StringIO(), planned=planned, kinds=kinds, step_cost=step_cost)
        status.progress(mrpc, _event("start", 0))
        status.first_event -= 10.0
        status.progress(mrpc, _event("steps", 50))   # 50 MRPC steps in the grid's 10 s
        return status

    earlier = {step_kind(mrpc): 1.0, step_kind(cola): 0.25, step_kind(other): 5.0}
    status = grid(earlier)   # no epoch yet: the records' figures, the irrelevant one left out
    assert abs(status.eta() - (50 * 1.0 + 400 * 0.25) / (50 * 1.0 / 10)) < 1.0   # 30 s, not 450 / 5 = 90 s
    assert GridStatus(2, stream=io.StringIO(), planned=planned).eta() == math.inf   # nothing ran yet

    status.progress(mrpc, _event("epoch", 50, elapsed=25.0))   # the grid's own measure: 0.5 s an MRPC step
    assert abs(status.eta() - (50 * 0.5 + 400 * 0.125) / (50 * 0.5 / 10)) < 1.0   # CoLA's record scaled by 0.5
    status.progress(cola, _event("epoch", 200, steps=400, elapsed=20.0))          # 0.1 s a CoLA step, its own
    done = 50 * 0.5 + 200 * 0.1
    assert abs(status.eta() - (50 * 0.5 + 200 * 0.1) / (done / 10)) < 1.0
    status.retried(cola, "worker died")   # its steps and its rate go; the record's figure comes back
    assert abs(status.eta() - (50 * 0.5 + 400 * 0.125) / (50 * 0.5 / 10)) < 1.0

    foreign = grid({step_kind(cola): 0.25})   # records share no measured kind with the grid: no unit to scale by
    foreign.progress(mrpc, _event("epoch", 50, elapsed=25.0))
    assert abs(foreign.eta() - 450 / 5) < 1.0   # every step at MRPC's measure, as before weights
    foreign.progress(mrpc, _event("epoch", 60, elapsed=0.0))   # no rate from no time: the last one stands
    assert math.isfinite(foreign.eta())

    unweighed = grid()   # no records, one kind measured: bare steps, as before weights
    assert abs(unweighed.eta() - 450 / 5) < 1.0
    finished = RunRecord(mrpc.to_dict(), mrpc.hash, mrpc.label, "ok", final=Metrics.from_json({"score": 0.5}),
                         wall_s=80.0, timing=Timing(steps=100))   # a run that reported no epochs (Ray): its record's
    unweighed.finished_run(mrpc, finished)
    assert unweighed.weights() == {step_kind(mrpc): 0.8}


def test_a_long_epoch_gets_a_line_once_a_minute_and_a_terminal_none():
    from suite.run import progress

    lines = progress.ProgressLines()
    assert lines.line("x", _phase(0)) == "  x: attention statistics: 4 dev batch(es) (run 12s)"  # never silent
    assert lines.line("x", _event("start", 0)).startswith("  start x: 2 epoch(s) x 50 steps on 40 examples")
    assert lines.line("x", _event("steps", 10)) is None       # the start line was just now
    lines._last_line["x"] -= progress.STEP_LINE_S
    line = lines.line("x", _event("steps", 20, elapsed=30.0))
    assert line.startswith("  x epoch 1/2 step 20/100: train loss 0.5000") and "ETA 2m00s" in line
    assert lines.line("x", _event("steps", 30)) is None
    assert "dev score 0.6000" in lines.line("x", _event("epoch", 50))
    terminal = progress.ProgressLines(steps=False)
    terminal._last_line["x"] = -1e9
    assert terminal.line("x", _event("steps", 20)) is None


def _bench(path, device: str, step_ms: float, batch_size: int = 8) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "precision": "fp32", "date": "2026-01-01", "note": "", "rows": [
        {"shape": "minilm", "seq_len": 128, "batch_size": batch_size, "method": "vanilla", "step_ms": step_ms,
         "peak_mb": 100.0, "error": None}]}))


def test_a_dry_run_names_its_data_and_prices_the_grid_per_device(tmp_path, glue_dir, capsys, monkeypatch):
    """Local TSVs: the folder is named and the grid's batches (from the planned budget) are priced at the CPU's
    measured step time scaled to the job's batch size; no GPU measurement: 'unmeasured', no number. From the hub: the
    hub id, and the budget's cap as an upper bound of the batches."""
    from suite.grid.stages import plan_stages
    from suite.run.progress import planned_steps

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SUITE_DATA_DIR", raising=False)
    _bench(tmp_path / "results" / "bench.json", "CPU test machine, 1 torch threads", step_ms=400.0)
    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1,2", "--batch-size", "16", "--epochs", "2",
            "--out", str(tmp_path / "out"), "--dry-run"]
    assert main([*argv, "--data-dir", glue_dir]) == 0
    out = capsys.readouterr().out
    assert f"data: TSV files under {glue_dir}" in out
    from suite.commands import build_parser
    from suite.commands.run_options import run_overrides
    from suite.grid.study import Study

    parsed = build_parser([*argv, "--data-dir", glue_dir]).parse_args([*argv, "--data-dir", glue_dir])
    jobs = plan_stages(Study(), run_overrides(parsed)).plan.jobs
    batches = sum(planned_steps(jobs, glue_dir).values())
    hours = batches * 0.4 * 16 / 8 / 3600   # 400 ms per batch of 8, a job's batch of 16 twice that
    assert f"{batches:,} training batches of 2 job(s) from the planned budget):" in out
    assert f"  CPU: {hours:.2g} CPU-hours (results/bench.json: CPU test machine" in out
    assert "  GPU: unmeasured (no `python -m suite bench --json` file for a GPU" in out

    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "data: the Hugging Face hub (nyu-mll/glue), downloaded on first use" in out
    assert "(2 of them at most: their training set is read only when they run)" in out
