"""Stopping a grid from starting runs while the runs under way finish (`run --stop-by`, SIGUSR1): the deadline's
forms, the estimate a run must fit, the pool and the in-process executor holding runs back, a sequential study
resuming to the decisions of an uninterrupted one, and the command's exit code and record count."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from suite.api.errors import EXIT_NOT_STARTED
from suite.grid.executors import GridStatus, HeldBack, StartGate, run_grid, status_table
from suite.grid.executors.gate import parse_stop_by
from suite.grid.executors.status import step_kind
from suite.grid.plan import build_grid
from suite.grid.store import Store
from suite.grid.until_decided import comparisons, run_until_decided, seed_sequence
from suite.run import stopping
from suite.run.settings import TrainSettings

NOW = datetime(2026, 12, 7, 9, 30, 0).astimezone()
TESTS_DIR = str(Path(__file__).resolve().parent)


@pytest.mark.parametrize("text, after", [("90m", timedelta(minutes=90)), ("2h30m", timedelta(hours=2, minutes=30)),
                                         ("1.5h", timedelta(hours=1.5)), ("+45s", timedelta(seconds=45)),
                                         ("10:20", timedelta(minutes=50)), ("09:00", timedelta(hours=23, minutes=30)),
                                         ("2026-12-08T09:30", timedelta(days=1))])
def test_a_deadline_is_a_duration_a_time_of_day_or_a_date_and_time(text, after):
    assert parse_stop_by(text, now=NOW) == NOW + after


@pytest.mark.parametrize("text, says", [("soon", "a duration from now"), ("25:00", "no time of day"),
                                        ("", "a duration from now"), ("2026-12-07T09:00", "has passed"),
                                        ("0m", "above 0")])
def test_a_deadline_that_names_no_future_time_is_refused_with_the_forms(text, says):
    with pytest.raises(ValueError, match=says):
        parse_stop_by(text, now=NOW)


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="time.tzset: POSIX only")
def test_a_time_of_day_across_a_daylight_saving_change_is_that_day_s_clock_time(monkeypatch):
    """At 23:00 on the eve of Berlin's spring change, 09:00 is 07:00 UTC (+02:00), not today's +01:00's 08:00."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        eve = datetime(2026, 3, 28, 23, 0).astimezone()
        at = parse_stop_by("09:00", now=eve)
        assert (at.hour, at.utcoffset()) == (9, timedelta(hours=2)) and at - eve == timedelta(hours=9)
    finally:
        monkeypatch.undo()
        time.tzset()


def _jobs(tasks=("rte",), seeds=(1, 2, 3)):
    return build_grid(["minilm"], list(tasks), ["vanilla"], list(seeds), TrainSettings())


def test_a_run_starts_only_if_its_estimate_ends_before_the_deadline():
    """The estimate: the planned steps at the slowest rate this grid's runs of the kind have shown."""
    rte, cola = _jobs(seeds=(1, 2)), _jobs(tasks=("cola",), seeds=(1,))
    status = GridStatus(3, quiet=True, planned={j.hash: 100 for j in rte + cola},
                        kinds={j.hash: step_kind(j) for j in rte + cola})
    status.step_s = {rte[0].hash: 1.5, "another": 2.0}   # rte's run: 1.5 s a step -> 150 s for 100 steps
    status.kinds["another"] = step_kind(rte[0])          # a slower run of the same kind: 200 s
    gate = StartGate(NOW + timedelta(seconds=190))
    assert not gate.allows(rte[1], status, now=NOW)
    assert "would not finish" in gate.held[0][1] and "3m20s" in gate.held[0][1]
    assert gate.allows(rte[1], status, now=NOW + timedelta(seconds=-30))   # 220 s left
    assert gate.allows(cola[0], status, now=NOW)        # no rate of its kind known yet: nothing says it overruns
    assert "has come" in StartGate(NOW)._hold(cola[0], status, NOW)
    assert status.total == 2 and status.not_started == 1  # the held run leaves the counts and the ETA


def test_earlier_records_price_a_run_only_when_this_grid_has_measured_how_it_compares_with_them():
    """Earlier records alone may be another machine's (a GPU's folder, a CPU's grid): no unit here, so the run
    starts; once a kind both know shows this grid 2x slower than its earlier runs, every earlier figure doubles."""
    rte, cola = _jobs(seeds=(1,)), _jobs(tasks=("cola",), seeds=(1,))
    earlier = {step_kind(rte[0]): 0.01, step_kind(cola[0]): 0.5}   # a GPU's seconds per step
    status = GridStatus(2, quiet=True, planned={j.hash: 100 for j in rte + cola},
                        kinds={j.hash: step_kind(j) for j in rte + cola}, step_cost=earlier)
    assert status.run_seconds(rte[0]) is None and StartGate(NOW + timedelta(seconds=10)).allows(rte[0], status, NOW)
    status.step_s = {cola[0].hash: 1.0}   # this grid's CoLA run: 2x its earlier figure
    assert status.run_seconds(rte[0]) == pytest.approx(100 * 0.01 * 2)
    sst2 = _jobs(tasks=("sst2",), seeds=(1,))[0]
    status.step_cost[step_kind(sst2)], status.kinds[sst2.hash] = 0.1, step_kind(sst2)
    status.step_s[sst2.hash] = 0.5        # SST-2: 5x its earlier figure; the slowest ratio prices RTE
    assert status.run_seconds(rte[0]) == pytest.approx(100 * 0.01 * 5)


def test_the_rates_one_grid_measured_price_the_first_runs_of_the_command_s_next_grid(fake_runs, tmp_path,
                                                                                      monkeypatch):
    """A study's next round starts a fresh status: the gate it shares with the earlier round prices its first run."""
    monkeypatch.setattr("suite.grid.executors.schedule.planned_steps", lambda todo, *a: {j.hash: 100 for j in todo})
    store, gate = Store(tmp_path / "out"), StartGate(datetime.now().astimezone() + timedelta(hours=1))
    first, second = _jobs(seeds=(1,)), _jobs(seeds=(2,))
    assert len(run_grid(first, store, None, device="cpu", quiet=True, gate=gate).done) == 1  # 600 s: 6 s a step
    gate.deadline = datetime.now().astimezone() + timedelta(seconds=300)
    with pytest.raises(HeldBack) as held:
        run_grid(second, store, None, device="cpu", quiet=True, gate=gate)
    assert "would not finish" in held.value.result.held[0][1] and "10m" in held.value.result.held[0][1]


def test_a_gate_for_ray_never_drains():
    from suite.grid.executors.schedule import _gate_for

    with stopping.drain_signal():
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert stopping.draining() and _gate_for("ray", None, {}).closed() is None
        assert _gate_for("local", None, {}).closed() is not None


@pytest.mark.parametrize("sig, kept", [(signal.SIGTERM, False), (signal.SIGSEGV, True)])
def test_a_capture_self_test_stopped_from_outside_is_not_kept_but_a_crash_is(sig, kept, monkeypatch):
    from suite.grid.executors import workers

    monkeypatch.setattr(workers, "_SELF_TEST", f"import os, signal; os.kill(os.getpid(), {int(sig)})")
    answer = workers.run_self_test("cpu")
    assert answer["ok"] is False and answer.get("cache", True) is kept


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_drains_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGUSR1)
    with stopping.drain_signal():
        assert not stopping.draining()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert stopping.draining()
        status = GridStatus(1, quiet=True)
        assert "SIGUSR1" in StartGate()._hold(_jobs()[0], status, None)
    assert not stopping.draining() and signal.getsignal(signal.SIGUSR1) is before
    with stopping.drain_signal(), stopping.stop_signals(can_drain=False):  # Ray: it says it cannot, and goes on
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert not stopping.draining()


@pytest.fixture
def fake_runs(monkeypatch):
    """Training replaced by a record made at once; `drain_after` runs in, SIGUSR1 is taken to have arrived."""
    from test_until_decided import planted_record  # this folder is on sys.path under pytest

    state = SimpleNamespace(trained=[], drain_after=None)

    def run_one(job, *a, **k):
        state.trained.append(job)
        rec = planted_record(job)
        rec.wall_s, rec.timing = 600.0, dataclasses.replace(rec.timing, steps=100)  # 6 s a step, as a gate sees it
        return rec

    monkeypatch.setattr("suite.run.runner.run_one", run_one)
    monkeypatch.setattr("suite.grid.executors.gate.draining",
                        lambda: state.drain_after is not None and len(state.trained) >= state.drain_after)
    return state


def test_in_process_runs_past_the_deadline_are_held_and_listed(fake_runs, tmp_path):
    jobs = _jobs()
    store = Store(tmp_path / "out")
    fake_runs.drain_after = 1
    with pytest.raises(HeldBack) as held:  # raised once the runs under way are recorded
        run_grid(jobs, store, None, device="cpu", quiet=True, gate=StartGate())
    result = held.value.result
    assert len(result.done) == 1 and [j.seed for j, _ in result.held] == [2, 3] and not result.not_run
    assert not result.ok and "2 not started" in status_table(result) and "SIGUSR1" in status_table(result)
    assert len(list(store.runs.glob("*.json"))) == 1
    fake_runs.drain_after = None
    again = run_grid(jobs, store, None, device="cpu", quiet=True, gate=StartGate())  # the same command resumes
    assert len(again.done) == 2 and len(again.skipped) == 1 and again.ok


def test_a_closed_gate_holds_every_run_before_anything_is_planned_or_trained(fake_runs, tmp_path, monkeypatch):
    monkeypatch.setattr("suite.grid.executors.schedule.planned_steps",
                        lambda todo, *a: pytest.fail("planned") if todo else {})
    with pytest.raises(HeldBack) as held:
        run_grid(_jobs(), Store(tmp_path / "out"), None, device="cpu", quiet=True,
                 gate=StartGate(datetime.now().astimezone() - timedelta(seconds=1)))
    assert len(held.value.result.held) == 3 and "has come" in held.value.result.held[0][1]
    assert fake_runs.trained == []


def test_a_drained_sequential_study_takes_no_look_on_a_cut_round_and_resumes_to_the_same_decisions(fake_runs,
                                                                                                   tmp_path):
    from test_until_decided import PLANTED, paired_t

    from suite.grid.until_decided import Schedule

    schedule = Schedule(start=3, step=3, cap=12)
    seeds = seed_sequence([1, 2, 3], schedule.cap)
    jobs = build_grid(["minilm"], ["sst2"], ["vanilla", *PLANTED], seeds, TrainSettings())
    primary = comparisons(jobs, "vanilla")

    def study(out: Path, gate: StartGate | None):
        store = Store(out)

        return run_until_decided(jobs, store, schedule, seeds, primary, paired_t, 0.05,
                                 lambda todo: run_grid(todo, store, None, device="cpu", quiet=True, gate=gate),
                                 say=lambda line: None)

    whole = study(tmp_path / "whole", None)
    fake_runs.trained.clear()
    fake_runs.drain_after = 14   # the first round's 12 runs and 2 of the second's
    with pytest.raises(HeldBack) as held:
        study(tmp_path / "cut", StartGate())
    assert len(held.value.result.done) == 2 and held.value.result.held
    fake_runs.drain_after = None
    resumed = study(tmp_path / "cut", StartGate())
    assert [t.to_dict() for t in resumed.tracks] == [t.to_dict() for t in whole.tracks]


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_to_the_process_group_lets_the_runs_under_way_finish_and_exits_75(tiny_bert_dir, glue_dir, tmp_path):
    """Two pool workers hold a run each when the whole group gets SIGUSR1 (as `scancel --signal` sends it): the
    workers ignore it, both runs finish and are recorded, the third is not started, the command exits 75."""
    marker, out = tmp_path / "waits.attempts", tmp_path / "out"
    argv = ["run", "--methods", "test_waits", "--tasks", "rte", "--seeds", "1,2,3", "--model", tiny_bert_dir,
            "--data-dir", glue_dir, "--epochs", "1", "--max-train-samples", "16", "--out", str(out), "--quiet",
            "--workers", "2", "--set", f"test_waits.marker={marker}"]
    code = f"import sys, executor_faults; from suite import commands; sys.exit(commands.main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH")) if p)}
    driver = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and len(marker.read_text().splitlines()) == 2):  # both workers inside a run
            assert driver.poll() is None and time.monotonic() < deadline, driver.stderr.read() if driver.poll() else ""
            time.sleep(0.2)
        os.killpg(driver.pid, signal.SIGUSR1)
        time.sleep(0.5)
        Path(f"{marker}.go").write_text("")
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == EXIT_NOT_STARTED, stderr[-2000:]
    assert len(list((out / "runs").glob("*.json"))) == 2
    assert len(marker.read_text().splitlines()) == 2   # neither worker died of the signal: no run was retried
    assert "signal USR1" in stderr and "1 run(s) not started" in stderr and "not started" in stdout
    assert "Traceback" not in stderr and "died unexpectedly" not in stderr, stderr[-3000:]  # no helper died


@pytest.mark.parametrize("extra, message", [
    (["--executor", "ray", "--stop-by", "1h"], "--stop-by holds runs back before they start"),
    (["--stop-by", "soon"], "give a duration from now"),
])
def test_a_deadline_the_grid_cannot_keep_is_refused_before_anything_runs(extra, message, tiny_bert_dir, glue_dir,
                                                                         tmp_path, capsys):
    from suite import commands
    from suite.api.errors import EXIT_BAD_INPUT

    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--model", tiny_bert_dir, "--data-dir", glue_dir,
            "--out", str(tmp_path / "out"), *extra]
    try:
        code = commands.main(argv)
    except SystemExit as exc:  # argparse's refusal of the flag's value
        code = exc.code
    assert code == EXIT_BAD_INPUT and message in capsys.readouterr().err
    assert not (tmp_path / "out" / "runs").exists() or not list((tmp_path / "out" / "runs").glob("*.json"))
