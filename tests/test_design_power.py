"""Power before running (suite.stats.design_power, `python -m suite plan`): the simulated design claims a difference at
its level when there is none, always when the difference is huge; equivalence gets likelier with seeds until the dev
set's shared noise is the limit; the plan command prints the table from declared noise or pilot records."""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from suite.commands import main
from suite.grid.store import Store
from suite.stats.design_power import (
    Noise,
    equivalence_limit,
    margin_to_decide,
    monte_carlo_error,
    seeds_to_decide,
    simulate,
)
from suite.stats.sequential import Design


def test_a_fixed_design_claims_a_difference_that_is_not_there_at_its_level():
    """One look at 5 seeds at alpha 0.05: the report's test, simulated, rejects a true difference of 0 at the nominal
    rate (within 4 Monte-Carlo standard errors) when the seeds are the only noise. With a shared dev-set part of
    comparable size, Cochran-Cox's weighted critical value is conservative at few seeds (about 3.3% here): the
    simulation shows the test as it is."""
    sims = 20000
    tolerance = 4 * monte_carlo_error(0.05, sims)
    seeds_only = simulate(Noise(1.0, 0.0), Design((5,), 0.05), 0.0, margin=1.0, sims=sims, seed=3)
    assert abs(seeds_only.difference - 0.05) < tolerance, seeds_only
    assert seeds_only.futility == 0 and seeds_only.mean_seeds == 5
    assert math.isclose(seeds_only.difference + seeds_only.equivalent + seeds_only.undecided, 1.0)
    mixed = simulate(Noise(1.0, 0.5), Design((5,), 0.05), 0.0, margin=1.0, sims=sims, seed=3)
    assert 0.025 < mixed.difference < 0.05 + tolerance, mixed


def test_a_sequential_design_keeps_its_false_claims_under_alpha():
    sims = 8000
    design = Design((5, 10, 15, 20), 0.05, futility=0.1)
    chances = simulate(Noise(1.0, 0.3), design, 0.0, margin=1.0, sims=sims, seed=4)
    assert chances.difference < 0.05 + 3 * monte_carlo_error(0.05, sims), chances
    assert chances.futility > 0 and 5 <= chances.mean_seeds < 20


@pytest.mark.parametrize("design", [Design((5,), 0.01), Design((5, 10, 15, 20), 0.01)], ids=["fixed", "sequential"])
def test_a_huge_difference_is_claimed_almost_always(design):
    chances = simulate(Noise(1.0, 0.2), design, 20.0, margin=1.0, sims=2000)
    assert chances.difference > 0.99 and chances.equivalent == 0, chances


def test_equivalence_grows_with_seeds_and_a_fixed_seed_repeats_the_table():
    noise = Noise(1.0, 0.1)
    shown = [simulate(noise, Design((n,), 0.05), 0.0, margin=1.0, sims=4000, seed=7).equivalent for n in (3, 6, 12, 24)]
    assert all(a < b for a, b in zip(shown, shown[1:])), shown
    assert shown[0] < 0.2 and shown[-1] > 0.8, shown
    assert simulate(noise, Design((6,), 0.05), 0.0, 1.0, 4000, seed=7) == \
        simulate(noise, Design((6,), 0.05), 0.0, 1.0, 4000, seed=7)


def test_the_seeds_to_decide_are_the_fewest_that_reach_the_target():
    noise, design = Noise(1.0, 0.1), Design((5,), 0.05)
    n = seeds_to_decide(noise, design, margin=1.0, target=0.8, sims=2000, seed=1)
    assert 2 < n < 100
    at = {k: simulate(noise, Design((k,), 0.05), 0.0, 1.0, 2000, seed=1).decided for k in (int(n) - 1, int(n))}
    assert at[n - 1] < 0.8 <= at[n]


def test_the_dev_set_can_put_a_decision_out_of_reach_of_any_number_of_seeds():
    """A shared dev-set offset of sd 0.8 against a margin of 1: with infinitely many seeds equivalence still needs
    |offset| + 1.96 x 0.8 < 1, which never happens; a wider margin decides it at the planned seeds."""
    noise = Noise(1.0, 0.8)
    assert equivalence_limit(noise, Design((5,), 0.05), margin=1.0) == 0
    assert seeds_to_decide(noise, Design((5,), 0.05), margin=1.0, sims=1000) == math.inf
    # a limit is a limit: with a small shared part the simulated chance at many seeds approaches it from below
    small = Noise(1.0, 0.3)
    limit = equivalence_limit(small, Design((400,), 0.05), margin=1.0)
    assert 0.8 < limit < 0.95
    assert limit - 0.05 < simulate(small, Design((400,), 0.05), 0.0, 1.0, 2000, seed=2).equivalent <= limit + 0.02
    wide = margin_to_decide(noise, Design((5,), 0.05), target=0.8, sims=2000, seed=2)
    assert 1.0 < wide < 10
    assert simulate(noise, Design((5,), 0.05), 0.0, wide, 2000, seed=2).decided >= 0.8
    assert simulate(noise, Design((5,), 0.05), 0.0, 0.95 * wide, 2000, seed=2).decided < 0.8


def test_a_sequential_search_keeps_the_looks_fractions():
    noise = Noise(1.0, 0.1)
    cap = seeds_to_decide(noise, Design((5, 10, 15, 20), 0.05), margin=1.0, sims=1000)
    assert cap % 4 == 0 and cap >= 8   # looks at m, 2m, 3m, 4m seeds


def _study(tmp_path, extra: str = "") -> str:
    path = tmp_path / "study.yaml"
    path.write_text("methods: [vanilla, no_dropout, drophead]\ntasks: [rte]\nseeds: [1, 2, 3, 4, 5]\n"
                    f"out: {tmp_path / 'out'}\nreport: {{primary: [no_dropout, drophead], margin: 2.0}}\n"
                    "until_decided: {start: 3, step: 3, cap: 9}\n" + extra)
    return str(path)


def test_plan_prints_the_table_from_declared_noise(tmp_path, capsys):
    study = _study(tmp_path, "power: {tasks: {rte: {seed_sd: 1.5, example_se: 0.3}}, target: 0.7}\n")
    assert main(["plan", "--study", study]) == 0
    out = capsys.readouterr().out
    assert "2 primary comparison(s), alpha 0.05 over the family, Holm" in out and "0.025 each" in out
    assert "one look at 5 seeds" in out and "split: planned on dev (each task's dev set)" in out
    assert "declared (power: tasks:)" in out and "seeds for 70% at 0" in out
    assert "\ndata: " in out and "\ncost estimate (training steps only" in out and "\n  GPU: " in out  # as a dry run
    rows = [line.split() for line in out.splitlines() if line.startswith("rte ")]
    assert [r[1] for r in rows[1:]] == ["0", "2", "4"]   # 0, the margin, twice the margin
    claims = [float(next(w for w in r if w.endswith("%")).rstrip("%")) for r in rows[1:]]
    assert claims[0] < 10 < claims[1] < claims[2], claims   # claims grow with the true difference
    assert "add --until-decided" in out
    assert main(["run", "--study", study, "--dry-run"]) == 0   # the dry run names the command, it does not simulate
    out = capsys.readouterr().out
    assert "`python -m suite plan` with the same options" in out and "simulated" not in out

    assert main(["plan", "--study", study, "--until-decided"]) == 0
    out = capsys.readouterr().out
    assert "looks at 3, 6, 9 seeds" in out and "of which futility" in out and "cap for 70% at 0" in out


def test_plan_estimates_the_noise_from_pilot_records(tmp_path, capsys):
    """Without declared noise: the pilot's comparisons (seed sd of their paired differences, their median), or the
    reference's seeds in two halves when no comparison ran; no records at all is said, not simulated."""
    from test_report import make_record

    study = _study(tmp_path)
    assert main(["plan", "--study", study]) == 0
    assert "no records in" in capsys.readouterr().out

    pilot = Store(tmp_path / "pilot")
    rng = np.random.default_rng(0)
    reference = {s: 0.6 + 0.01 * rng.normal() for s in range(1, 9)}
    for s in (1, 2, 3):  # the README's 3-seed grid: records, but too few seeds for either estimate
        pilot.write(*make_record("rte", "vanilla", s, {"accuracy": reference[s]}))
    assert main(["plan", "--study", study, "--pilot", str(tmp_path / "pilot")]) == 0
    out = capsys.readouterr().out
    assert "too few seeds (3, need 4) of vanilla on rte, and 0 paired with a primary method (need 2)" in out
    assert "no records" not in out
    for s, score in reference.items():
        pilot.write(*make_record("rte", "vanilla", s, {"accuracy": score}))
    assert main(["plan", "--study", study, "--pilot", str(tmp_path / "pilot")]) == 0
    out = capsys.readouterr().out
    halves = [100 * (reference[a] - reference[b]) for a, b in zip((1, 2, 3, 4), (5, 6, 7, 8))]
    assert f"{np.std(halves, ddof=1):.2f}" in out and "vanilla's 8 seeds in two halves" in out

    diffs = {"no_dropout": [0.01, -0.02, 0.015, 0.0, -0.01], "drophead": [0.03, -0.03, 0.02, 0.0, -0.02]}
    for method, ds in diffs.items():
        for s, d in enumerate(ds, 1):
            pilot.write(*make_record("rte", method, s, {"accuracy": reference[s] + d}))
    assert main(["plan", "--study", study, "--pilot", str(tmp_path / "pilot")]) == 0
    out = capsys.readouterr().out
    sd = math.sqrt(np.median([np.var(100 * np.array(ds), ddof=1) for ds in diffs.values()]))
    assert f"{sd:.2f}" in out and "2 comparison(s), 5 seeds" in out and "none (no prediction sidecars)" in out
    # each comparison at its own noise, and the averages over them
    for method, ds in diffs.items():
        own = np.std(100 * np.array(ds), ddof=1)
        assert any(line.split()[:4] == ["rte", method, "5", f"{own:.2f}"] for line in out.splitlines())
    assert "power averaged over each task's comparisons" in out and "no number of seeds decides" in out
    assert "rte 0.10 (0.10-0.10, 18 runs)" in out   # each record's seconds per step (make_record's 0.1)
    # the grid priced at the pilot's whole runs too (make_record: wall_s 1 over 10 steps, 2 torch threads)
    assert "  CPU, as the pilot's 18 run(s) in " in out
    assert "process-hours (the pilot's runs had 2 torch threads)" in out


def test_a_pilot_prices_each_job_at_its_own_runs_else_its_tasks_and_never_guesses_a_task():
    """Fastest and median whole-run seconds per step, per (model, task, method) at the job's settings; a method the
    pilot did not run takes its task's runs of the others; another model, batch size or device kind is never
    borrowed; a job priced at its `max_train_samples` cap is counted as an upper bound."""
    import dataclasses
    from types import SimpleNamespace

    from suite.run.progress import capped_steps, cost_settings, pilot_cost_lines
    from suite.run.settings import TrainSettings

    t32, t16 = TrainSettings(), TrainSettings(batch_size=16)

    def job(name, task, method, model="minilm", train=t32):
        return SimpleNamespace(hash=name, model=model, task=task, method=method, train=train)

    hub = job("e", "mrpc", "vanilla", train=dataclasses.replace(t32, max_train_samples=640))
    jobs = [job("a", "mrpc", "vanilla"), job("b", "mrpc", "topk"), job("c", "cola", "vanilla"),
            job("d", "stsb", "vanilla"), job("f", "mrpc", "vanilla", model="bert-base"),
            job("g", "mrpc", "topk", train=t16), hub]
    steps = {"a": 3000, "b": 1000, "c": 5000, "f": 100, "g": 100}
    cell = ("CPU", "minilm", "mrpc")
    measured = {(*cell, "vanilla", cost_settings(t32)): [2.0, 1.0, 9.0],      # min 1, median 2 (mean 4)
                (*cell, "drophead", cost_settings(t32)): [4.0, 8.0],          # not the job's method: borrowed by b
                ("GPU", "minilm", "mrpc", "vanilla", cost_settings(t32)): [0.1]}
    cpu, gpu = pilot_cost_lines(jobs, steps, measured, {1}, "pilot")
    n_hub = capped_steps(hub)
    fastest = (3000 * 1.0 + 1000 * 1.0 + n_hub * 1.0) / 3600   # b: mrpc's runs of vanilla and drophead, min 1
    median = (3000 * 2.0 + 1000 * 4.0 + n_hub * 2.0) / 3600   # b: the median of 1, 2, 4, 8, 9
    assert cpu.startswith("  CPU, as the pilot's 5 run(s) in pilot"), cpu
    assert f": {fastest:,.1f} (at each job's fastest of those runs) to {median:,.1f} (at its median run) CPU-hours " \
           "(one torch thread a run) for 3 job(s), 1 of them at their task's runs of the pilot's other methods, 1 of " \
           "them at most" in cpu, cpu
    assert ("not priced (no CPU runs there of their task at their batch size, length, precision and "
            "accumulation): bert-base/mrpc/vanilla, minilm/cola/vanilla, minilm/mrpc/topk, minilm/stsb/vanilla") in cpu
    assert gpu.startswith("  GPU, as the pilot's 1 run(s)") and f"{(3000 + n_hub) * 0.1 / 3600:,.1f} (at each" in gpu
    assert "process-hours (the pilot's runs had 1, unrecorded torch threads)" in \
        pilot_cost_lines(jobs, steps, measured, {1, None}, "pilot")[0]
    assert pilot_cost_lines(jobs, steps, {}, set(), "pilot") == []   # no pilot runs: no line


def test_each_comparison_is_planned_at_its_own_noise_and_the_unreachable_are_named():
    """The per-comparison table: the seed sd's chi-square interval on n - 1 df, a clipped-at-0 dev-set part
    flagged, the dev-set part's interval where known, degenerate runs with exact intervals; the task's averages are
    the comparisons' mean probabilities; a comparison whose shared dev-set part alone keeps equivalence at 0 below
    the target is named."""
    from types import SimpleNamespace

    from suite.grid.power_comparisons import COMPARISON_SIMULATIONS, ComparisonNoise, comparison_lines

    design = Design((5, 10), 0.05, futility=0.0)
    calm = ComparisonNoise("calm", Noise(1.0, 0.0), 10, 10, True, 0, 0)
    shared = ComparisonNoise("shared", Noise(1.0, 0.8), 10, 12, False, 2, 0, (0.55, 1.02))
    task = SimpleNamespace(task="rte", margin=1.0, comparisons_noise=(calm, shared), step_s=(2.0, 3.0, 7.0))
    out = "\n".join(comparison_lines([task], design, 0.8, seed=3))
    low, high = (1.0 * math.sqrt(9 / stats.chi2.ppf(q, 9)) for q in (0.975, 0.025))
    assert f"1.00 [{low:.2f}, {high:.2f}] df 9" in out and "0.00 (clipped at 0)" in out
    assert "0.80 [0.55, 1.02]" in out and "example_se [95%]" in out   # the dev-set part's interval where known
    ci = stats.binomtest(2, 12).proportion_ci(0.95, method="exact")
    assert f"2/12 [{100 * ci.low:.0f}%, {100 * ci.high:.0f}%]" in out
    assert out.splitlines()[-1].endswith(": shared on rte.")   # 2 Phi(1/0.8 - z) - 1 is far below 0.8
    assert "rte 3.00 (2.00-7.00, 3 runs)" in out   # seconds per optimizer step
    equivalent = [simulate(c.noise, design, 0.0, 1.0, COMPARISON_SIMULATIONS, 3).equivalent for c in (calm, shared)]
    mean = f"{100 * np.mean(equivalent):.1f}% ({100 * min(equivalent):.1f}%-{100 * max(equivalent):.1f}%)"
    row = next(line for line in out.splitlines() if line.startswith("rte") and line.split()[1] == "0")
    assert mean in row   # the equivalent column of the averages at a true difference of 0


def test_plan_refuses_a_grid_without_primary_comparisons_and_impossible_noise(tmp_path, capsys):
    path = tmp_path / "one.yaml"
    path.write_text("methods: [vanilla]\ntasks: [rte]\n")
    assert main(["plan", "--study", str(path)]) == 2
    assert "plan: no power table" in capsys.readouterr().err
    assert main(["plan", "--study", _study(tmp_path, "power: {tasks: {rte: {seed_sd: 0}}}\n")]) == 2
    assert "power.tasks.rte.seed_sd" in capsys.readouterr().err


@pytest.mark.parametrize("tasks, says", [
    ("{nosuchtask: {seed_sd: 1.0}}", "unknown task 'nosuchtask'. Valid tasks: cola"),
    ("{mrpc: {seed_sd: 1.0}}", "'mrpc' is not a task of the study's primary comparisons; declare the noise of rte"),
])
def test_power_noise_for_a_task_the_study_does_not_compare_is_refused(tmp_path, capsys, tasks, says):
    """`power: tasks: {nosuchtask: ...}` was ignored while the table printed `?` for the real task."""
    assert main(["plan", "--study", _study(tmp_path, f"power: {{tasks: {tasks}}}\n")]) == 2
    err = capsys.readouterr().err
    assert says in err and "power: tasks" in err and "Traceback" not in err


def test_power_noise_may_name_a_task_as_glue_spells_it(tmp_path, capsys):
    assert main(["plan", "--study", _study(tmp_path, "power: {tasks: {RTE: {seed_sd: 1.5}}}\n")]) == 0
    assert "declared (power: tasks:)" in capsys.readouterr().out


def test_plan_takes_the_noise_on_the_split_the_verdicts_read(tmp_path, capsys):
    """A study that keeps a held-out test split is decided on it (`RunRecord.scored`), so its plan says so and takes
    the noise from the pilot's held-out scores; pilot records scored on dev only are not its noise, and are named."""
    from test_report import make_record

    study = _study(tmp_path, "train: {test_holdout: 40}\n")
    pilot = Store(tmp_path / "pilot")
    rng = np.random.default_rng(1)
    held = {s: 0.6 + 0.02 * rng.normal() for s in range(1, 9)}
    for s, score in held.items():
        name, rec = make_record("rte", "vanilla", s, {"accuracy": 0.5}, train={"test_holdout": 40})
        pilot.write(name, {**rec, "heldout": {"accuracy": score, "score": score}})
    assert main(["plan", "--study", study, "--pilot", str(tmp_path / "pilot")]) == 0
    out = capsys.readouterr().out
    assert "split: planned on the held-out test split carved from train (train.test_holdout)" in out
    halves = [100 * (held[a] - held[b]) for a, b in zip((1, 2, 3, 4), (5, 6, 7, 8))]
    assert f"{np.std(halves, ddof=1):.2f}" in out    # the held-out scores' noise; every dev score is 0.5

    on_dev = Store(tmp_path / "dev_pilot")
    for s in range(1, 9):
        on_dev.write(*make_record("rte", "vanilla", s, {"accuracy": held[s]}))
    assert main(["plan", "--study", study, "--pilot", str(tmp_path / "dev_pilot")]) == 0
    assert "its records of rte are scored on dev, the verdicts on heldout" in capsys.readouterr().out


@pytest.mark.slow  # the slow tier: `python -m pytest -m slow`
def test_plan_keeps_its_answer_until_a_record_or_the_study_changes(tmp_path):
    """A second `plan` with the same options, code, study and records prints the kept answer (suite.api.startup_cache:
    marked here, so that the test sees it was read, not computed); a new pilot record, or an edited study, is
    computed anew and prints what a run without the cache prints."""
    import json

    from test_cli_startup import run_fresh
    from test_report import make_record

    study = _study(tmp_path)
    pilot = Store(tmp_path / "pilot")
    for s in range(1, 9):
        pilot.write(*make_record("rte", "vanilla", s, {"accuracy": 0.6 + 0.01 * ((s * 7) % 5)}))
    argv, cache = ["plan", "--study", study, "--pilot", str(tmp_path / "pilot")], tmp_path / "cache"

    def kept_answer() -> tuple[str, str]:
        """(what plan printed, what its next run prints once the kept answer is marked); a run within 2 s of a
        change to a file it read keeps no answer, and the first one creates the cache folder: a few runs."""
        for _ in range(4):
            time.sleep(2.1)
            out, _ = run_fresh(argv, cache)
            for entry in (cache / "startup").glob("plan-*.json"):
                kept = json.loads(entry.read_text())
                kept["value"]["lines"].append("(kept)")
                entry.write_text(json.dumps(kept))
                marked, _ = run_fresh(argv, cache)
                entry.unlink()
                return out, marked
        raise AssertionError("plan kept no answer")

    first, marked = kept_answer()
    assert marked == first + "(kept)\n" and "vanilla's 8 seeds in two halves" in first
    run_fresh(argv, cache)   # kept again
    for s in range(1, 6):   # a comparison's records: the noise now comes from it
        pilot.write(*make_record("rte", "no_dropout", s, {"accuracy": 0.61 + 0.01 * ((s * 3) % 4)}))
    time.sleep(2.1)
    new, _ = run_fresh(argv, cache)
    assert new != first and "1 comparison(s), 5 seeds" in new
    Path(study).write_text(Path(study).read_text().replace("margin: 2.0", "margin: 3.0"))
    time.sleep(2.1)
    edited, _ = run_fresh(argv, cache)
    assert edited != new and edited == run_fresh(argv, "off")[0]


def test_plan_shows_power_for_the_primary_family_as_declared_and_beside_a_small_one():
    """Each comparison of a family of m is tested at alpha / m: at a true difference of one seed sd a family of 36
    claims it less often than one of SMALL_FAMILY, which the line shows beside it; a small family shows itself only."""
    from types import SimpleNamespace

    from suite.grid.power_comparisons import family_lines
    from suite.stats.sequential import SMALL_FAMILY

    task = SimpleNamespace(task="rte", margin=1.0, noise=Noise(1.0, 0.1))
    design = Design((5, 10, 15, 20), 0.05 / 36, futility=0.0)
    line = family_lines([task], design, 36, 0.05, 2000, seed=4)[0]
    declared = simulate(task.noise, design, 1.0, 1.0, 2000, 4).difference
    small = simulate(task.noise, Design((5, 10, 15, 20), 0.05 / SMALL_FAMILY, futility=0.0), 1.0, 1.0, 2000, 4)
    assert "36 comparisons, each at 0.05 / 36" in line and declared < small.difference
    assert f"rte {100 * declared:.1f}% ({100 * small.difference:.1f}% with {SMALL_FAMILY})" in line
    kept = family_lines([task], dataclasses.replace(design, alpha=0.05 / 9), 9, 0.05, 2000, seed=4)[0]
    assert "with 9" not in kept and "costs" not in kept


def test_a_dry_run_of_a_grid_under_way_prices_what_is_left_at_its_own_runs(monkeypatch, tmp_path, glue_dir,
                                                                            tiny_bert_dir, capsys):
    """A resumed campaign says what it has left: the jobs without an ok record, priced at the output folder's own
    whole runs (a method not run yet at its task's runs of the others); a finished grid says nothing is left, and a
    grid with no record says nothing of it."""
    import re

    from conftest import fake_ok_record

    def trained(job, *a, **k):
        rec = fake_ok_record(job)
        rec.wall_s, rec.timing = 36.0, dataclasses.replace(rec.timing, steps=10)   # 3.6 s a step
        return rec

    monkeypatch.setattr("suite.run.runner.run_one", trained)
    common = ["--tasks", "rte", "--model", tiny_bert_dir, "--data-dir", glue_dir, "--out", str(tmp_path / "out")]
    assert main(["run", *common, "--methods", "vanilla", "--seeds", "1,2", "--dry-run"]) == 0
    assert "\nleft: " not in capsys.readouterr().out   # no record yet: the measured step times are all there is
    assert main(["run", *common, "--methods", "vanilla", "--seeds", "1,2", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", *common, "--methods", "vanilla,drophead", "--seeds", "1,2,3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "\nleft: 4 job(s) without an ok record, priced at this output folder's own runs:" in out
    line = next(s for s in out.splitlines() if s.startswith("  CPU, as this folder's 2 run(s) in "))
    fastest, median = re.search(r": ([\d.]+) \(at each job's fastest of those runs\) to ([\d.]+) \(at", line).groups()
    assert fastest == median and "for 4 job(s), 3 of them at their task's runs of this folder's other methods" in line
    assert main(["run", *common, "--methods", "vanilla", "--seeds", "1,2", "--dry-run"]) == 0
    assert "\nleft: nothing: every job has an ok (or kept) record; a real run trains nothing" in capsys.readouterr().out
    assert main(["run", *common, "--methods", "vanilla", "--seeds", "3,4", "--dry-run"]) == 0
    assert "\nleft: " not in capsys.readouterr().out   # the folder's records are another grid's: not under way
