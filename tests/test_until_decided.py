"""`run --until-decided` on fake runs: the executor's training returns planted scores at once, so the loop's rounds,
records, state file and stopping reasons are checked without training."""
from __future__ import annotations

import dataclasses
import json
import math
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from suite.api.errors import BadInput
from suite.grid.executors import run_grid
from suite.grid.plan import build_grid
from suite.grid.store import Store
from suite.grid.until_decided import (
    Comparison,
    Schedule,
    closing_lines,
    comparisons,
    run_until_decided,
    seed_sequence,
)
from suite.run.layout import UNTIL_DECIDED
from suite.run.record_parts import Epoch, Metrics
from suite.run.settings import TrainSettings
from suite.stats.sign import sign_p

# planted scores (x100): method -> (shift over vanilla, spread of a seed's difference)
PLANTED = {"no_dropout": (3.0, 0.5), "drophead": (0.0, 0.2), "topk": (0.0, 6.0)}


def planted_record(job):
    from conftest import fake_ok_record

    rec = fake_ok_record(job)
    rng = np.random.default_rng(zlib.crc32(f"{job.method}/{job.seed}".encode()))
    shift, spread = PLANTED.get(job.method, (0.0, 0.0))
    score = 80.0 + rng.normal(0, 0.1) * (job.method != "vanilla") + shift + rng.normal(0, spread)
    rec.final = Metrics.from_json({"score": score / 100, "accuracy": score / 100})
    rec.history = (Epoch(epoch=1, dev=rec.final),)
    return rec


def paired_t(cmp, ours: dict, theirs: dict, margin: float = 1.0):
    """A look's evidence by a paired t-test over seeds, with the paired sign test a difference claim also needs
    (the shape of suite.stats.evidence.Evidence)."""
    d = np.array([ours[s].final.score - theirs[s].final.score for s in ours]) * 100
    n, diff = len(d), float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(n))
    p = float(2 * stats.t.sf(abs(diff / se), n - 1))
    p_equiv = float(max(stats.t.sf((diff + margin) / se, n - 1), stats.t.cdf((diff - margin) / se, n - 1)))
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    return SimpleNamespace(diff=diff, se=se, df=n - 1.0, low=diff - 2 * se, high=diff + 2 * se, p=p,
                           p_equiv=p_equiv, margin=margin, p_sign=float(sign_p(wins, losses)),
                           sign_excess=wins - losses)


@pytest.fixture
def grid(monkeypatch, tmp_path):
    trained = []
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: trained.append(job) or planted_record(job))
    schedule = Schedule(start=3, step=3, cap=12)
    seeds = seed_sequence([1, 2, 3], schedule.cap)
    jobs = build_grid(["minilm"], ["sst2"], ["vanilla", *PLANTED], seeds, TrainSettings())
    store = Store(tmp_path / "out")
    run_round = lambda todo: run_grid(todo, store, None, device="cpu", quiet=True)  # noqa: E731
    return SimpleNamespace(jobs=jobs, store=store, schedule=schedule, seeds=seeds, trained=trained,
                           run_round=run_round)


def test_seeds_are_added_only_to_undecided_comparisons_and_each_stops_with_its_reason(grid):
    primary = comparisons(grid.jobs, "vanilla")
    outcome = run_until_decided(grid.jobs, grid.store, grid.schedule, grid.seeds, primary, paired_t, 0.05,
                                grid.run_round, say=lambda line: None)
    tracks = {t.comparison.method: t for t in outcome.tracks}
    assert (tracks["no_dropout"].reason, tracks["no_dropout"].verdict) == ("efficacy", "better")
    assert (tracks["drophead"].reason, tracks["drophead"].verdict) == ("equivalence", "equivalent")
    assert tracks["topk"].reason in ("futility", "cap") and tracks["topk"].verdict == "undecided"
    seeds_run = {m: sorted(j.seed for j in grid.trained if j.method == m) for m in ["vanilla", *PLANTED]}
    for method, track in tracks.items():  # each method ran exactly the seeds of its own looks
        assert seeds_run[method] == grid.seeds[:track.looks[-1]["planned_seeds"]]
    assert len(tracks["no_dropout"].looks) < len(tracks["topk"].looks) or tracks["topk"].reason == "futility"
    assert seeds_run["vanilla"] == grid.seeds[:max(t.looks[-1]["planned_seeds"] for t in tracks.values())]

    state = json.loads((grid.store.root / UNTIL_DECIDED).read_text())
    by_method = {c["method"]: c for c in state["comparisons"]}
    assert by_method["no_dropout"]["reason"] == "efficacy" and state["alpha_each"] == pytest.approx(0.05 / 3)
    assert [lk["n"] for lk in by_method["topk"]["looks"]] == [3, 6, 9, 12][:len(by_method["topk"]["looks"])]
    assert "no_dropout vs vanilla" in closing_lines(outcome) and "stopped for efficacy, better" in closing_lines(
        outcome)


def test_the_same_command_again_replays_the_looks_from_the_records_without_training(grid):
    primary = comparisons(grid.jobs, "vanilla")
    first = run_until_decided(grid.jobs, grid.store, grid.schedule, grid.seeds, primary, paired_t, 0.05,
                              grid.run_round, say=lambda line: None)
    grid.trained.clear()
    again = run_until_decided(grid.jobs, grid.store, grid.schedule, grid.seeds, primary, paired_t, 0.05,
                              grid.run_round, say=lambda line: None)
    assert grid.trained == [] and not again.result.done
    assert [t.to_dict() for t in again.tracks] == [t.to_dict() for t in first.tracks]


def test_a_look_uses_only_its_own_seeds_even_when_records_of_later_seeds_exist(grid):
    grid.run_round(grid.jobs)  # every seed up to the cap already has a record (a fixed-size run before)
    primary = comparisons(grid.jobs, "vanilla")
    outcome = run_until_decided(grid.jobs, grid.store, grid.schedule, grid.seeds, primary, paired_t, 0.05,
                                grid.run_round, say=lambda line: None)
    assert outcome.tracks[0].looks[0]["n"] == grid.schedule.start


def test_only_primary_comparisons_get_looks_and_the_family_shares_alpha(grid):
    primary = comparisons(grid.jobs, "vanilla", primary=lambda c: c.method == "topk")
    outcome = run_until_decided(grid.jobs, grid.store, grid.schedule, grid.seeds, primary, paired_t, 0.05,
                                grid.run_round, say=lambda line: None)
    assert [t.comparison.method for t in outcome.tracks] == ["topk"]
    extra = {j.method for j in grid.trained if j.seed not in grid.seeds[:grid.schedule.start]}
    assert extra <= {"topk", "vanilla"}
    assert json.loads((grid.store.root / UNTIL_DECIDED).read_text())["alpha_each"] == pytest.approx(0.05)


def test_a_cells_other_settings_run_in_the_first_round_and_never_enter_a_look(grid, monkeypatch):
    """A data-efficiency curve on the same cells (another train-set size, seeds of its own, one outside the starting
    seeds) is not a sweep: it runs once, in the first round, and its scores (planted 20 points lower) never reach a
    look, which would otherwise pair them with the main grid's at the same seeds."""
    def planted(job, *a, **k):
        rec = planted_record(job)
        if job.train.max_train_samples == 250:
            rec.final = Metrics.from_json({"score": rec.final.score - 0.2, "accuracy": rec.final.score - 0.2})
        return grid.trained.append(job) or rec

    monkeypatch.setattr("suite.run.runner.run_one", planted)
    curve = build_grid(["minilm"], ["sst2"], ["vanilla", "no_dropout"], [1, 2, 30],
                       TrainSettings(max_train_samples=250))
    jobs = grid.jobs + curve
    primary = comparisons(jobs, "vanilla", seeds=grid.seeds)
    assert [c.method for c in primary] == list(PLANTED)
    outcome = run_until_decided(jobs, grid.store, grid.schedule, grid.seeds, primary, paired_t, 0.05,
                                grid.run_round, say=lambda line: None)
    curve_hashes = {j.hash for j in curve}
    assert sorted(j.seed for j in grid.trained if j.hash in curve_hashes) == [1, 1, 2, 2, 30, 30]
    first_round = grid.trained[:next(i for i, j in enumerate(grid.trained) if j.seed > grid.schedule.start
                                     and j.hash not in curve_hashes)]
    assert curve_hashes <= {j.hash for j in first_round}
    tracks = {t.comparison.method: t for t in outcome.tracks}
    assert 2 < tracks["no_dropout"].looks[0]["diff"] < 4 and tracks["no_dropout"].verdict == "better"
    with pytest.raises(BadInput, match="run several at every seed"):  # a curve at every seed is a sweep
        comparisons(grid.jobs + build_grid(["minilm"], ["sst2"], ["vanilla"], grid.seeds,
                                           TrainSettings(max_train_samples=250)), "vanilla", seeds=grid.seeds)


def topk_failing(grid, monkeypatch, fails):
    """topk against vanilla until decided, with topk's runs failing at the seeds `fails` picks."""
    from suite.run.record import RunRecord

    def flaky(job, *a, **k):
        if job.method == "topk" and fails(job.seed):
            return RunRecord.failed(job, "planted failure")
        return planted_record(job)

    monkeypatch.setattr("suite.run.runner.run_one", flaky)
    primary = [Comparison("minilm", "sst2", "topk", "vanilla")]
    return run_until_decided(grid.jobs, grid.store, Schedule(3, 3, 12, futility=0.0), grid.seeds, primary,
                             paired_t, 0.05, grid.run_round, say=lambda line: None)


def test_failed_runs_leave_a_look_without_new_evidence_and_spend_nothing(grid, monkeypatch):
    outcome = topk_failing(grid, monkeypatch, lambda seed: seed > 3)
    looks = outcome.tracks[0].looks
    assert [lk["n"] for lk in looks] == [3, 3, 3, 3] and "no new evidence" in looks[1]["note"]
    assert outcome.tracks[0].reason == "cap" and len(outcome.result.failed) == 9


def test_a_swept_method_or_a_missing_reference_is_refused_before_training():
    jobs = build_grid(["minilm"], ["sst2"], ["vanilla", "topk"], [1, 2], TrainSettings(), sweeps=["topk.k=4,8"])
    with pytest.raises(BadInput, match="sst2/topk run several"):
        comparisons(jobs, "vanilla")
    with pytest.raises(BadInput, match="reference 'vanilla'"):
        comparisons(build_grid(["minilm"], ["sst2"], ["topk"], [1, 2], TrainSettings()), "vanilla")
    with pytest.raises(BadInput, match="start >= 2"):
        Schedule(start=1)
    assert seed_sequence([3, 1], 5) == [3, 1, 4, 5, 6]


def write_study(path, glue_dir, model, out, until: str, extra: str = "") -> str:
    path.write_text(f"methods: [vanilla, {', '.join(PLANTED)}]\ntasks: [sst2]\nseeds: [1, 2, 3]\nmodels: [{model}]\n"
                    f"data_dir: {glue_dir}\nout: {out}\nuntil_decided: {until}\n{extra}")
    return str(path)


def test_run_until_decided_from_a_study_prints_each_comparison_and_the_report_states_it(
        monkeypatch, tmp_path, glue_dir, tiny_bert_dir, capsys):
    from suite import commands
    from suite.report.load import load
    from suite.report.stage_sections import sequential

    trained = []
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: trained.append(job) or planted_record(job))
    out = tmp_path / "out"
    study = write_study(tmp_path / "s.yaml", glue_dir, tiny_bert_dir, out, "{start: 3, step: 3, cap: 9}",
                        "report: {primary: [no_dropout, topk]}\n")
    assert commands.main(["run", "--study", study, "--until-decided", "--quiet"]) == 0
    printed = capsys.readouterr()
    assert "until decided: looks at 3, 6, 9 seeds" in printed.out and "over 2 primary comparison(s)" in printed.out
    assert "sst2/no_dropout vs vanilla" in printed.out and "drophead vs" not in printed.out
    assert "look 1 of 3: 12 run(s)" in printed.err
    assert {j.seed for j in trained if j.method == "drophead"} == {1, 2, 3}  # exploratory: the starting seeds only
    section = "\n".join(sequential(SimpleNamespace(loaded=load([out])), None).lines)
    assert "## Seeds added until decided" in section and "| sst2 | no_dropout vs vanilla |" in section
    assert "efficacy (a difference) | **better**" in section

    from suite.report import ReportOptions, build_report
    from suite.report.markdown import unwrap_prose

    reads, read_text = [], Path.read_text   # the state file was read twice per report (verdicts, then the section)
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or read_text(self, *a, **k))
    md = build_report([out], ReportOptions(figures=False, aso=False, allow_uncommitted=True)).read_text()
    assert reads.count("until_decided.json") == 1 and unwrap_prose(section.strip()) in unwrap_prose(md)


def test_a_dry_run_prices_only_what_the_loop_can_still_run(monkeypatch, tmp_path, glue_dir, tiny_bert_dir, capsys):
    """After the loop has stopped, nothing is left for a dry run to price: a stopped comparison's later seeds and an
    exploratory method's are not runs the loop will make. Without a state file every primary comparison is open."""
    from suite import commands

    def timed(job, *a, **k):
        rec = planted_record(job)
        rec.wall_s, rec.timing = 30.0, dataclasses.replace(rec.timing, steps=10)
        return trained.append(job) or rec

    trained = []
    monkeypatch.setattr("suite.run.runner.run_one", timed)
    out = tmp_path / "out"
    study = write_study(tmp_path / "s.yaml", glue_dir, tiny_bert_dir, out, "{start: 3, step: 3, cap: 30}",
                        "report: {primary: [no_dropout, topk]}\n")
    assert commands.main(["run", "--study", study, "--until-decided", "--quiet"]) == 0
    assert commands.main(["run", "--study", study, "--until-decided", "--dry-run"]) == 0
    assert "\nleft: nothing: every job has an ok (or kept) record or is a later seed of a comparison the looks " \
           "stopped; a real run trains nothing" in capsys.readouterr().out
    (out / UNTIL_DECIDED).unlink()
    assert commands.main(["run", "--study", study, "--until-decided", "--dry-run"]) == 0
    never = {(m, s) for m in ("vanilla", "no_dropout", "topk") for s in range(1, 31)} - {(j.method, j.seed)
                                                                                         for j in trained}
    assert never and f"\nleft: {len(never)} job(s) without an ok record (at most: " in capsys.readouterr().out


def test_an_impossible_schedule_is_refused_before_training(monkeypatch, tmp_path, glue_dir, tiny_bert_dir, capsys):
    from suite import commands
    from suite.api.errors import EXIT_BAD_INPUT

    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: pytest.fail("trained"))
    study = write_study(tmp_path / "s.yaml", glue_dir, tiny_bert_dir, tmp_path / "out", "{start: 1, cap: 9}")
    assert commands.main(["run", "--study", study, "--until-decided"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "s.yaml: until_decided: the looks need start >= 2" in err and "Traceback" not in err


@pytest.mark.parametrize("extra, message", [
    ("report: {primary: [uniform]}\n", "found no primary comparison"),
    ("report: {baseline: uniform}\n", "reference 'uniform'"),
    ("sweep: {topk.k: [4, 8]}\n", "sst2/topk run several"),
    ("report: {primary: [uniform]}\n"
     "tune: {holdout: 0.2, seeds: [101], budget: 1, space: {default: {train.lr: [1.0e-4]}}}\n",
     "found no primary comparison"),  # before the tuning stage too
])
def test_a_grid_the_loop_cannot_compare_is_refused_before_training(monkeypatch, tmp_path, glue_dir, tiny_bert_dir,
                                                                   capsys, extra, message):
    from suite import commands
    from suite.api.errors import EXIT_BAD_INPUT

    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: pytest.fail("trained"))
    study = write_study(tmp_path / "s.yaml", glue_dir, tiny_bert_dir, tmp_path / "out", "{start: 3, cap: 9}", extra)
    assert commands.main(["run", "--study", study, "--until-decided"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out" / "runs").is_dir() or not list((tmp_path / "out" / "runs").glob("*.json"))


def test_a_first_look_without_any_paired_seed_spends_nothing_and_the_loop_goes_on(grid, monkeypatch):
    """Every run of one arm failed at the starting seeds: that look has n = 0, and the next look's boundaries used
    to raise (an information fraction of 0) instead of treating the empty look as one that spends nothing."""
    looks = topk_failing(grid, monkeypatch, lambda seed: seed <= 3).tracks[0].looks
    assert looks[0]["n"] == 0 and "no new evidence" in looks[0]["note"]
    assert len(looks) >= 2 and looks[1]["n"] == 3 and math.isfinite(looks[1]["level"])


def test_boundaries_of_a_design_whose_first_look_had_no_seeds():
    from suite.stats.sequential import boundaries

    with_empty = boundaries((0.0, 0.5, 1.0), 0.05)
    assert with_empty[0] == math.inf and with_empty[1:] == pytest.approx(boundaries((0.5, 1.0), 0.05), abs=1e-6)


def test_a_primary_cell_without_a_setting_at_every_seed_is_named_not_dropped_silently(grid):
    """A task that only a data-efficiency curve runs (3 seeds of a 12-seed sequence) has no comparison to extend:
    the command says so before training instead of leaving it out unannounced."""
    curve = build_grid(["minilm"], ["mrpc"], ["vanilla", "no_dropout"], [1, 2, 3], TrainSettings(max_train_samples=250))
    heard = []
    primary = comparisons(grid.jobs + curve, "vanilla", seeds=grid.seeds, note=heard.append)
    assert [(c.task, c.method) for c in primary] == [("sst2", m) for m in PLANTED]
    assert len(heard) == 1 and "not compared" in heard[0] and "mrpc/no_dropout vs vanilla (minilm)" in heard[0]
    comparisons(grid.jobs + curve, "vanilla", primary=lambda c: c.task == "sst2", seeds=grid.seeds, note=heard.append)
    assert len(heard) == 1  # a cell outside the primary family is not announced


def test_a_look_compares_the_seeds_where_neither_run_degenerated_and_counts_the_rest(tmp_path):
    """A look scores the method among healthy seeds (its information is their number) and records how often each
    arm degenerated; a record with a held-out test split is read on it, as the report reads it."""
    from suite.grid.until_decided import Comparison, Track, _look, record_evaluator
    from suite.run.record import RunRecord, save_predictions
    from suite.stats.sequential import Design

    store = Store(tmp_path)
    store.runs.mkdir(parents=True)
    gold = (np.arange(200) % 3 == 0).astype(int)
    rng = np.random.default_rng(0)

    def record(name, pred, dev_score):
        save_predictions(store.runs / f"{name}.npz", {"": {"index": np.arange(200), "label": gold,
                                                           "logits": np.eye(2)[pred]},
                                                      "heldout": {"index": np.arange(200), "label": gold,
                                                                  "logits": np.eye(2)[pred]}})
        return RunRecord({"task": "sst2", "method": name, "seed": 1}, name, name, "ok",
                         final=Metrics.from_json({"score": dev_score}), predictions=f"{name}.npz",
                         heldout=Metrics.from_json({"score": float((pred == gold).mean())}))

    ours, theirs = {}, {}
    for seed in range(1, 7):
        healthy = np.where(rng.random(200) < 0.8, gold, 1 - gold)
        ours[seed] = record(f"m{seed}", np.zeros(200, dtype=int) if seed <= 2 else healthy, 0.5)
        theirs[seed] = record(f"r{seed}", np.where(rng.random(200) < 0.8, gold, 1 - gold), 0.5)
    track = Track(Comparison("minilm", "sst2", "topk", "vanilla"))
    records = {("minilm", "sst2", "topk"): ours, ("minilm", "sst2", "vanilla"): theirs}
    _look(track, Design((6, 12), 0.05), records, record_evaluator(store), 0, list(range(1, 7)))
    entry = track.looks[0]
    assert entry["paired"] == 6 and entry["n"] == 4 and entry["seeds"] == [3, 4, 5, 6]
    assert entry["degenerate"] == 2 and entry["degenerate_reference"] == 0
    held = np.mean([ours[s].heldout.score - theirs[s].heldout.score for s in (3, 4, 5, 6)]) * 100
    assert entry["diff"] == pytest.approx(held)   # the held-out scores, not the dev ones (all 0.5)


def test_the_reports_looks_name_compared_seeds_and_the_paired_seeds_beside_them_where_a_run_degenerated():
    """The t-test and TOST use the compared seeds (neither run degenerate), the sign test every paired seed: the
    report's looks column shows both where they differ, so a reader can check the sign test's level."""
    from suite.report.stage_sections import _row
    from suite.run.layout import Look, TrackedComparison

    looks = [Look(look=1, planned_seeds=5, n=5, seeds=[1, 2, 3, 4, 5], reason="continue", verdict="undecided",
                  paired=5),
             Look(look=2, planned_seeds=10, n=8, seeds=[1, 2, 3, 4, 5, 6, 7, 9], reason="continue",
                  verdict="undecided", paired=10)]
    row = _row(TrackedComparison(model="m", task="mrpc", method="topk", reference="vanilla", reason="continue",
                                 verdict="undecided", looks=looks))
    assert "| 2 | 5 → 8 of 10 |" in row


def test_replay_decides_again_from_the_records_and_leaves_a_comparison_open_where_seeds_were_never_run(
        monkeypatch, tmp_path, glue_dir, tiny_bert_dir, capsys):
    """`run --until-decided --replay` trains nothing: on the records of a finished loop it gives back the same
    state; with the records of seeds 4-6 of one arm gone, that comparison stays open at its first look instead of
    being decided on fewer seeds."""
    from suite import commands
    from suite.api.errors import EXIT_BAD_INPUT

    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: planted_record(job))
    out = tmp_path / "out"
    study = write_study(tmp_path / "s.yaml", glue_dir, tiny_bert_dir, out,
                        "{start: 3, step: 3, cap: 9, futility: 0}", "report: {primary: [no_dropout, topk]}\n")
    assert commands.main(["run", "--study", study, "--until-decided", "--quiet"]) == 0
    state = json.loads((out / UNTIL_DECIDED).read_text())
    monkeypatch.setattr("suite.run.runner.run_one", lambda job, *a, **k: pytest.fail("trained"))
    assert commands.main(["run", "--study", study, "--until-decided", "--replay", "--quiet"]) == 0
    again = json.loads((out / UNTIL_DECIDED).read_text())
    assert [c["looks"] for c in again["comparisons"]] == [c["looks"] for c in state["comparisons"]]
    topk = next(c for c in state["comparisons"] if c["method"] == "topk")
    assert len(topk["looks"]) > 1   # a noisy null without futility: it needed seeds 4-6
    for path in (out / "runs").glob("sst2__topk__seed[4-6]__*.json"):
        path.unlink()
    assert commands.main(["run", "--study", study, "--until-decided", "--replay", "--quiet"]) == 0
    left = next(c for c in json.loads((out / UNTIL_DECIDED).read_text())["comparisons"] if c["method"] == "topk")
    assert left["reason"] == "continue" and len(left["looks"]) == 1
    capsys.readouterr()
    assert commands.main(["run", "--study", study, "--replay"]) == EXIT_BAD_INPUT
    # a replay whose plan names its jobs otherwise (here another learning rate; a Ray driver's guessed padding did
    # it) finds none of the records: it refuses, and the decided state is left as it was
    before = (out / UNTIL_DECIDED).read_bytes()
    capsys.readouterr()
    assert commands.main(["run", "--study", study, "--until-decided", "--replay", "--quiet", "--lr", "3e-4"]) == \
        EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--replay found none of the records its looks were taken on" in err and "Traceback" not in err
    assert (out / UNTIL_DECIDED).read_bytes() == before


def test_a_look_where_every_pair_degenerated_spends_nothing_and_keeps_the_last_information():
    """Every method run degenerated at the first look: no evidence, nothing spent (n 0), the degenerate runs and
    McNemar's p recorded; the next look, with healthy seeds, is tested at a first look's level."""
    from suite.grid.until_decided import Comparison, Track, _look
    from suite.stats.evidence import Evidence
    from suite.stats.sequential import Design

    design = Design((6, 12), 0.05, spending="pocock")
    track = Track(Comparison("minilm", "sst2", "topk", "vanilla"))
    records = {("minilm", "sst2", "topk"): {s: {} for s in range(1, 7)},
               ("minilm", "sst2", "vanilla"): {s: {} for s in range(1, 7)}}
    down = Evidence(0, *[math.nan] * 7, margin=1.0, n_paired=6, degenerate=6, collapse_p=0.03125, compared=())
    _look(track, design, records, lambda c, a, b: down, 0, list(range(1, 7)))
    first = track.looks[0]
    assert (first["n"], first["seeds"], first["reason"], first["degenerate"]) == (0, [], "continue", 6)
    assert first["collapse_p"] == pytest.approx(0.03125)
    records = {arm: {s: {} for s in range(1, 13)} for arm in records}
    healthy = Evidence(6, 1.0, 0.5, 5.0, 0.0, 2.0, 0.5, 0.5, 1.0, n_paired=12, degenerate=6,
                       compared=tuple(range(7, 13)))
    _look(track, design, records, lambda c, a, b: healthy, 1, list(range(1, 13)))
    assert track.looks[1]["n"] == 6 and track.looks[1]["level"] == pytest.approx(design.levels([0, 6])[0])
    assert design.levels([0, 6])[0] > 0


def test_a_tuned_study_cut_during_tuning_resumes_to_the_decisions_of_an_uninterrupted_one(
        monkeypatch, tmp_path, glue_dir, tiny_bert_dir):
    """The standard study's campaign in small: a tuning stage, then seeds added until decided, stopped from starting
    runs mid-tuning (as --stop-by does at a session's end) and resumed by the same command. The finals train at each
    cell's rate chosen on the tuning split, and the looks decide as they do in a study that was never cut."""
    from suite import commands
    from suite.api.errors import EXIT_NOT_STARTED

    state = SimpleNamespace(trained=[], drain_after=None)

    def run_one(job, *a, **k):
        state.trained.append(job)
        rec = planted_record(job)
        best = {"vanilla": 2e-4, "no_dropout": 1e-4}.get(job.method, 2e-4)   # each cell's planted best rate
        rec.tune = Metrics.from_json({"score": 0.8 - abs(job.train.lr - best) * 100})
        return rec

    monkeypatch.setattr("suite.run.runner.run_one", run_one)
    monkeypatch.setattr("suite.grid.executors.gate.draining",
                        lambda: state.drain_after is not None and len(state.trained) >= state.drain_after)
    tune = "tune: {holdout: 6, seeds: [101, 102], budget: all, space: {default: {train.lr: [1.0e-4, 2.0e-4]}}}\n"

    def study(out: Path) -> str:
        return write_study(out.with_suffix(".yaml"), glue_dir, tiny_bert_dir, out, "{start: 3, step: 3, cap: 9}",
                           "report: {primary: [no_dropout, topk]}\n" + tune)

    assert commands.main(["run", "--study", study(tmp_path / "whole"), "--until-decided", "--quiet"]) == 0
    tuning_runs = 4 * 2 * 2   # 4 methods x 2 rates x 2 tuning seeds
    state.trained.clear()
    state.drain_after = 5   # five tuning runs, then the session ends
    cut = study(tmp_path / "cut")
    assert commands.main(["run", "--study", cut, "--until-decided", "--quiet"]) == EXIT_NOT_STARTED
    assert len(list((tmp_path / "cut" / "tuning" / "runs").glob("*.json"))) == 5
    assert not list((tmp_path / "cut" / "runs").glob("*.json")) and not (tmp_path / "cut" / UNTIL_DECIDED).exists()
    state.drain_after = None
    assert commands.main(["run", "--study", cut, "--until-decided", "--quiet"]) == 0
    assert sum(j.train.holdout == 6 and j.seed in (101, 102) for j in state.trained) == tuning_runs

    def outcome(out: Path):
        finals = [json.loads(p.read_text())["config"] for p in (out / "runs").glob("*.json")]
        tracks = json.loads((out / UNTIL_DECIDED).read_text())["comparisons"]
        return sorted((c["method"], c["seed"], c["train"]["lr"]) for c in finals), tracks

    whole, resumed = outcome(tmp_path / "whole"), outcome(tmp_path / "cut")
    assert resumed == whole
    rates = {method: lr for method, _, lr in whole[0]}
    assert rates["vanilla"] == 2e-4 and rates["no_dropout"] == 1e-4   # chosen on the tuning split
    assert len(whole[1]) == 2 and all(len(t["looks"]) == 3 and t["reason"] for t in whole[1])   # every look taken
