"""Report sections that must not mislead on uneven designs: the attention table compares methods on the same tasks
and seeds, the test against the majority class counts every run and the dev examples' noise, and a data-efficiency
curve's runs are left to the curve, not shown as ablations."""
from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats
from test_report import MODEL, attention_stats, comparison_rows, make_record, parse_table

from suite.grid.store import Store
from suite.report import ReportOptions, build_report
from suite.report.markdown import unwrap_prose


def write(root, runs):
    store = Store(root)
    for task, method, seed, shift in runs:
        store.write(*make_record(task, method, seed, {"accuracy": 0.6}, attention=attention_stats(shift)))
    return root


def test_attention_means_cover_the_shared_tasks_and_seeds(tmp_path):
    # sparsity per run: 0.15 + shift. On RTE and MRPC seeds 1-3 both methods average (3 x 0.15 + 3 x 1.15) / 6;
    # vanilla's two extra MRPC seeds (as a sequential design gives the reference) and its WNLI runs, which the
    # other method lacks, would pull its pooled mean to 2.09 if they counted.
    runs = [(t, m, s, shift) for m in ("vanilla", "scores_dropout") for t, shift in (("rte", 0.0), ("mrpc", 1.0))
            for s in (1, 2, 3)]
    runs += [("mrpc", "vanilla", s, 5.0) for s in (4, 5)] + [("wnli", "vanilla", s, 3.0) for s in (1, 2, 3)]
    md = build_report([write(tmp_path, runs)], ReportOptions(figures=False)).read_text()
    att = parse_table(md, "### Attention")
    assert att["vanilla"]["sparsity"] == att["scores_dropout"]["sparsity"] == "0.650"
    assert att["vanilla"]["runs"] == att["scores_dropout"]["runs"] == "6"
    assert "every method shown ran (MRPC: 3 seed(s), RTE: 3 seed(s))" in unwrap_prose(md)


def test_attention_without_shared_runs_says_the_rows_are_not_comparable(tmp_path):
    runs = [("rte", "vanilla", s, 0.0) for s in (1, 2)] + [("mrpc", "scores_dropout", s, 1.0) for s in (1, 2)]
    md = build_report([write(tmp_path, runs)], ReportOptions(figures=False)).read_text()
    att = parse_table(md, "### Attention")
    assert att["vanilla"]["sparsity"] == "0.150" and att["scores_dropout"]["sparsity"] == "1.150"
    assert "the rows are not comparable" in md


def reference_line(md: str) -> str:
    return next(line for line in unwrap_prose(md).splitlines() if line.startswith("- The reference `vanilla` against"))


def test_reference_margin_counts_runs_without_a_score_and_a_single_seed_as_the_leaderboard_does(tmp_path):
    base = {"majority": {"pearson": 0.0, "spearman": 0.0, "score": 0.0}, "chance": {"score": 0.0}}
    store = Store(tmp_path)
    for seed, r in zip((1, 2, 3, 4, 5), (0.8, 0.82, 0.84, math.nan, math.nan)):  # two runs predicted a constant
        store.write(*make_record("stsb", "vanilla", seed, {"pearson": r, "spearman": r}, baselines=base))
    rte = {"majority": {"accuracy": 0.5, "score": 0.5}, "chance": {"accuracy": 0.5, "score": 0.5}}
    store.write(*make_record("rte", "vanilla", 1, {"accuracy": 0.7}, baselines=rte))
    line = reference_line(build_report([tmp_path], ReportOptions(figures=False)).read_text())
    p = stats.ttest_1samp([80, 82, 84, 0, 0], 0, alternative="greater").pvalue
    # (3 seeds alone: p = 1e-4; a regression task's constant has no correlation to resample: over seeds only)
    assert f"STS-B +49.20 (5 seeds, 2 without a score, p = {p:.2g}, over seeds only);" in line
    assert "RTE +20.00 (1 seed, no test);" in line or line.endswith("RTE +20.00 (1 seed, no test).")


def test_the_mark_and_the_reference_note_count_runs_without_a_score_alike(tmp_path):
    # two scored seeds far above the constant, three that predicted a constant: scored runs alone would beat the
    # predictor (p ~ 0.003); all five do not (p ~ 0.09), so the cell is marked and the note says so
    base = {"majority": {"pearson": 0.0, "spearman": 0.0, "score": 0.0}, "chance": {"score": 0.0}}
    store = Store(tmp_path)
    for seed, r in zip((1, 2, 3, 4, 5), (0.8, 0.81, math.nan, math.nan, math.nan)):
        store.write(*make_record("stsb", "vanilla", seed, {"pearson": r, "spearman": r}, baselines=base))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    p = stats.ttest_1samp([80, 81, 0, 0, 0], 0, alternative="greater").pvalue
    assert 0.05 < p < 0.1
    assert "80.50 ± 0.71° (2), no score (3)" in parse_table(md, "### Leaderboard")["vanilla"]["STS-B"]
    assert f"STS-B +32.20 (5 seeds, 3 without a score, p = {p:.2g}, over seeds only) — not better at p < 0.05" in (
        reference_line(md))


def test_curve_runs_are_left_to_the_curve_and_everything_else_stays_in_the_report(tmp_path):
    store = Store(tmp_path)
    whole = {"max_train_samples": None}   # the leaderboard trains on the whole train set, which is no curve point
    for seed in (1, 2, 3):
        for m in ("vanilla", "scores_dropout", "drophead"):
            store.write(*make_record("rte", m, seed, {"accuracy": 0.6}, hparams={"p": 0.1}, train=whole))
        store.write(*make_record("rte", "vanilla", seed, {"accuracy": 0.62}, hparams={"p": 0.2}, train=whole))
        for size in (16, 32, 64):
            for m in ("vanilla", "scores_dropout"):
                store.write(*make_record("rte", m, seed, {"accuracy": 0.5 + size / 1000}, hparams={"p": 0.1},
                                         train={"max_train_samples": size}))
    store.write(*make_record("rte", "vanilla", 4, hparams={"p": 0.1}, train={"max_train_samples": 32},
                             status="failed"))                 # a failed run of the curve: no ablation row
    store.write(*make_record("rte", "drophead", 1, {"accuracy": 0.55}, hparams={"p": 0.1},
                             train={"max_train_samples": 16}))   # one size: no curve, so an ablation
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    assert set(parse_table(md, "### Data efficiency")) == {"vanilla", "scores_dropout"}
    ablations = md.split("### Ablations")[1].split("\n### ")[0]
    vanilla = ablations.split("#### vanilla")[1].split("####")[0]
    assert "| p " in vanilla and "max_train_samples" not in vanilla and "failed" not in vanilla
    assert "max_train_samples" in ablations.split("#### drophead")[1] and "#### scores_dropout" not in ablations
    assert "Methods with several settings (see the ablation tables): `vanilla`, `drophead`;" in md
    assert "## Runs outside the leaderboard settings" not in md   # every run is in some table


def test_beating_the_majority_class_counts_the_dev_examples_noise(tmp_path):
    # 200 dev examples, 60% in class 1. vanilla is right on 65-65.5% at every seed: over seeds alone it beats the
    # majority class beyond doubt, but a 5-point lead on 200 examples is within the dev set's own noise
    # (se ~ 4.5 points), so the cell is marked and the note says so. scores_dropout, right on 95%, is not marked.
    import numpy as np

    from suite.run.baselines import constant_scores
    from suite.run.record import save_predictions
    from suite.stats.constant import majority_predictions

    rng = np.random.default_rng(0)
    n = 200
    labels = (np.arange(n) < 120).astype(int)
    base = {"majority": {"accuracy": 0.6, "score": 0.6}, "chance": {"accuracy": 0.5, "score": 0.5}}
    store = Store(tmp_path)
    store.runs.mkdir(parents=True, exist_ok=True)
    seeds_only = []
    for method, share in (("vanilla", 0.65), ("scores_dropout", 0.95)):
        for seed in (1, 2, 3, 4, 5):
            right = rng.permutation(n) < round(share * n) + seed % 2   # 65-65.5% right, different examples per seed
            pred = np.where(right, labels, 1 - labels)
            name, rec = make_record("rte", method, seed, {"accuracy": float(right.mean())}, hparams={"p": 0.1},
                                    baselines=base)
            sidecar = name.replace(".json", ".predictions.npz")
            arrays = {"": {"index": np.arange(n), "label": labels, "logits": np.eye(2)[pred].astype(np.float32)}}
            save_predictions(store.runs / sidecar, arrays)
            rec["predictions"] = sidecar
            store.write(name, rec)
            if method == "vanilla":
                seeds_only.append(100 * right.mean())
                constant = majority_predictions(arrays)[""]
                assert constant_scores(["accuracy"], {"": labels}, 2, False, ["accuracy"])["score"] == (
                    constant["logits"].argmax(-1) == labels).mean() == 0.6   # the runner's majority predictor
    assert stats.ttest_1samp(seeds_only, 60, alternative="greater").pvalue < 1e-4
    md = build_report([tmp_path], ReportOptions(aso=False, figures=False)).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"].startswith("65.30 ± 0.27°") and "°" not in board["scores_dropout"]["RTE"]
    line = reference_line(md)
    assert "RTE +5.30 (5 seeds, p = " in line and ", over seeds only)" not in line and "not better at p < 0.05" in line
    p = float(line.split("p = ")[1].split(")")[0])
    assert 0.05 < p < 0.3   # one-sided, z ~ 5.3 / 4.5 -> p ~ 0.12


def test_the_test_against_the_constant_follows_the_metric_direction_and_survives_bad_sidecars(tmp_path):
    import dataclasses

    import numpy as np

    from suite.api.tasks import TASKS, get_task, register_task
    from suite.run.record import save_predictions
    from suite.stats.constant import vs_constant

    rng = np.random.default_rng(1)
    n = 200
    labels = (np.arange(n) < 120).astype(int)
    paths = []
    for seed, share in enumerate((0.66, 0.7, 0.64)):
        pred = np.where(rng.permutation(n) < share * n, labels, 1 - labels)
        paths.append(str(tmp_path / f"run{seed}.npz"))
        save_predictions(paths[-1], {"": {"index": np.arange(n), "label": labels,
                                          "logits": np.eye(2)[pred].astype(np.float32)}})
    scores = np.array([66.0, 70.0, 64.0])
    up = vs_constant("rte", scores, paths, 60.0, 0.05)
    spec = register_task(dataclasses.replace(get_task("rte"), name="rte_lower", higher_is_better=False))
    try:
        down = vs_constant("rte_lower", scores, paths, 60.0, 0.05, higher=False)
    finally:
        TASKS.remove(spec.name)
    # the same runs read in the other direction: the same two-sided evidence, the other tail
    assert up.margin == pytest.approx(6.67, abs=0.01) and down.margin == pytest.approx(-6.67, abs=0.01)
    assert down.p == pytest.approx(1 - up.p) and up.p < 0.5 and not down.better
    assert not up.seeds_only and not down.seeds_only
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    for broken in ([str(tmp_path / "bad.npz")] * 3, [None] * 3, [math.nan] * 3):
        v = vs_constant("rte", scores, broken, 60.0, 0.05)   # no readable predictions: over seeds only, no crash
        p = stats.ttest_1samp([66, 70, 64], 60, alternative="greater").pvalue
        assert v.seeds_only and v.p == pytest.approx(p)


def _sequential_study(tmp_path) -> dict:
    """Records of vanilla and topk on RTE at seeds 1-3 and the state a sequential design (looks at 3 and 6 seeds)
    writes for them: its first look, decided by the loop's own look (`suite.stats.looks`), goes on to the second,
    whose seeds have not run: the comparison is open, undecided."""
    from suite.stats.evidence import RunOutcome, bootstrap_seed, compare_runs
    from suite.stats.looks import next_look
    from suite.stats.sequential import Design

    store = Store(tmp_path)
    arms: dict[str, dict] = {"topk": {}, "vanilla": {}}
    for seed in (1, 2, 3):
        base, ours = 0.60 + 0.01 * seed, 0.65 + 0.001 * seed * seed
        store.write(*make_record("rte", "vanilla", seed, {"accuracy": base}, hparams={"p": 0.1}))
        store.write(*make_record("rte", "topk", seed, {"accuracy": ours}, hparams={"k": 8}))
        arms["vanilla"][seed], arms["topk"][seed] = RunOutcome(100 * base), RunOutcome(100 * ours)
    design = Design((3, 6), 0.05)
    look = next_look([], design, arms["topk"], arms["vanilla"], lambda a, b: compare_runs(
        "rte", a, b, 1.0, seed=bootstrap_seed("rte", "topk", "vanilla")), 0, [1, 2, 3])
    assert (look["reason"], look["verdict"]) == ("continue", "undecided")
    return {"written": "2026-01-01T00:00:00+00:00", "looks": [3, 6], "seed_order": [1, 2, 3, 4, 5, 6],
            "schedule": {"start": 3, "step": 3, "cap": 6, "spending": "obrien-fleming", "futility": 0.1},
            "rule": "test rule", "alpha": 0.05, "primary": 1, "alpha_each": 0.05,
            "comparisons": [{"model": MODEL, "task": "rte", "method": "topk", "reference": "vanilla",
                             "reason": "continue", "verdict": "undecided", "looks": [look]}]}


FORGED = {  # each edit of the attack, and of its class
    "verdict": (lambda s, c: c.update(verdict="better"), "the file says better"),
    "verdict and reason": (lambda s, c: c.update(verdict="worse", reason="efficacy"), "the file says worse"),
    "no looks": (lambda s, c: c.update(looks=[], verdict="better", reason="efficacy"), "the file says better"),
    "no looks, open": (lambda s, c: c.update(looks=[], verdict="undecided", reason="continue"), "holds 0 look"),
    "diff null, p 0, level 1": (lambda s, c: (c["looks"][-1].update(diff=None, p=0.0, level=1.0, reason="efficacy",
                                                                    verdict="worse"),
                                              c.update(reason="efficacy", verdict="worse")), "the file says worse"),
    "forged TOST": (lambda s, c: (c["looks"][-1].update(p_equiv=1e-9, level_equiv=0.5, reason="equivalence",
                                                        verdict="equivalent"),
                                  c.update(reason="equivalence", verdict="equivalent")), "the file says equivalent"),
    "diff": (lambda s, c: c["looks"][-1].update(diff=c["looks"][-1]["diff"] + 0.5), "look 1 holds diff"),
    "p": (lambda s, c: c["looks"][-1].update(p=0.5), "look 1 holds p"),
    "seeds": (lambda s, c: c["looks"][-1].update(seeds=[1, 2, 4]), "look 1 holds seeds"),
    "alpha": (lambda s, c: s.update(alpha=0.5), "its looks spent alpha 0.5"),
    "family": (lambda s, c: s.update(primary=2), "over 2 primary comparison"),
    "cap": (lambda s, c: s["schedule"].update(cap=10**9), "is not one `run --until-decided` writes"),
}


@pytest.mark.parametrize("edit, says", list(FORGED.values()), ids=list(FORGED))
def test_an_edited_or_stale_sequential_state_is_refused_naming_the_file(tmp_path, edit, says):
    """An edited or stale until_decided.json put "better ‡" into the tables against what the records say: every
    look is replayed from the records (the verdict, its reason and every number the section prints)."""
    import json

    from suite.api.errors import ReportError

    state = _sequential_study(tmp_path)
    build_report([tmp_path], ReportOptions(aso=False, figures=False, primary=("topk",)))  # as the design wrote it
    (tmp_path / "until_decided.json").write_text(json.dumps(state))
    build_report([tmp_path], ReportOptions(aso=False, figures=False, primary=["topk"]))
    edit(state, state["comparisons"][0])
    (tmp_path / "until_decided.json").write_text(json.dumps(state))
    with pytest.raises(ReportError, match=says) as refused:
        build_report([tmp_path], ReportOptions(aso=False, figures=False, primary=["topk"]))
    assert str(tmp_path / "until_decided.json") in str(refused.value)


def _mid_round(tmp_path, rest_recorded: bool) -> dict:
    """Two primary comparisons on RTE (topk and drophead vs vanilla; looks at 3 and 6 seeds) after their first look,
    both open, with the second look's runs of topk and vanilla recorded (seeds 4-6) and drophead's only where
    `rest_recorded`: the topk comparison's records replay to a second look the run has not written yet."""
    import json

    from suite.stats.evidence import RunOutcome, bootstrap_seed, compare_runs
    from suite.stats.looks import next_look
    from suite.stats.sequential import Design, family_alpha

    store = Store(tmp_path)
    shift = {"vanilla": lambda s: 0.60 + 0.01 * s, "topk": lambda s: 0.605 + 0.012 * s - 0.004 * (s % 2),
             "drophead": lambda s: 0.60 + 0.011 * s - 0.003 * (s % 3)}
    arms: dict[str, dict] = {m: {} for m in shift}
    for method, score in shift.items():
        for seed in (1, 2, 3, 4, 5, 6) if method != "drophead" or rest_recorded else (1, 2, 3):
            store.write(*make_record("rte", method, seed, {"accuracy": score(seed)}, hparams={"p": 0.1}))
            arms[method][seed] = RunOutcome(100 * score(seed))
    design = Design((3, 6), family_alpha(0.05, 2))
    comparisons = []
    for method in ("topk", "drophead"):
        look = next_look([], design, {s: arms[method][s] for s in (1, 2, 3)},
                         {s: arms["vanilla"][s] for s in (1, 2, 3)}, lambda a, b, m=method: compare_runs(
                             "rte", a, b, 1.0, seed=bootstrap_seed("rte", m, "vanilla")), 0, [1, 2, 3])
        assert look["reason"] == "continue"
        comparisons.append({"model": MODEL, "task": "rte", "method": method, "reference": "vanilla",
                            "reason": "continue", "verdict": "undecided", "looks": [look]})
    state = {"written": "2026-01-01T00:00:00+00:00", "looks": [3, 6], "seed_order": [1, 2, 3, 4, 5, 6],
             "schedule": {"start": 3, "step": 3, "cap": 6, "spending": "obrien-fleming", "futility": 0.1},
             "rule": "test rule", "alpha": 0.05, "primary": 2, "alpha_each": 0.025, "comparisons": comparisons}
    (tmp_path / "until_decided.json").write_text(json.dumps(state))
    return state


def test_a_round_under_way_is_reported_as_of_the_looks_taken_and_a_finished_round_without_its_look_is_refused(
        tmp_path):
    """Mid-round (the campaign's state between two looks) the report was refused as stale: a comparison whose runs
    were all in replayed to a look the run writes only when the round ends. It is now reported as of the looks taken,
    saying the round is incomplete; once every run of the round has a record, a file without the look is stale."""
    import json

    from suite.api.errors import ReportError

    options = ReportOptions(aso=False, figures=False, primary=["topk", "drophead"])
    state = _mid_round(tmp_path / "mid", rest_recorded=False)
    md = unwrap_prose(build_report([tmp_path / "mid"], options).read_text())
    assert "**A round is incomplete:** 6 of the 9 runs look 2 needs (seeds 4–6) have records." in md
    assert "1 of up to 2 looks taken (at 3, 6 seeds); 0 of 2 primary comparison(s) stopped by the rule, 2 open; " \
           "**a round is incomplete** (6 of the 9 runs look 2 needs (seeds 4–6) have records): the open " \
           "comparisons' verdicts are interim" in md
    assert comparison_rows(md)["topk", "RTE"]["verdict"].endswith("‡")
    assert "within reach" not in md   # a fixed-sample count of seeds: the sequential design's rule gives them
    assert "This is a fixed-sample test's power at the seeds reported; the verdicts marked ‡ come from the " \
           "sequential design, whose own power over its looks `python -m suite plan --study FILE --until-decided` " \
           "gives" in md
    assert "of a fixed-sample test, also beside a verdict marked ‡, whose seeds its design's stopping rule gives" in md
    edited = json.loads(json.dumps(state))
    edited["comparisons"][0]["looks"][0]["p"] = 0.5   # the looks taken are still held against the records
    (tmp_path / "mid" / "until_decided.json").write_text(json.dumps(edited))
    with pytest.raises(ReportError, match="look 1 holds p"):
        build_report([tmp_path / "mid"], options)

    # a failed run of the round counts as run (the loop's); runs of another setting are not the round's
    (tmp_path / "mid" / "until_decided.json").write_text(json.dumps(state))
    store = Store(tmp_path / "mid")
    store.write(*make_record("rte", "drophead", 4, hparams={"p": 0.1}, status="failed"))
    for seed in (4, 5, 6):
        store.write(*make_record("rte", "drophead", seed, {"accuracy": 0.7}, hparams={"p": 0.2}))
    md = unwrap_prose(build_report([tmp_path / "mid"], options).read_text())
    assert "**A round is incomplete:** 7 of the 9 runs look 2 needs (seeds 4–6) have records." in md

    _mid_round(tmp_path / "done", rest_recorded=True)
    with pytest.raises(ReportError, match=r"give undecided \(cap, 2 look\(s\)\); the file was edited, or is stale"):
        build_report([tmp_path / "done"], options)


def test_a_margin_mismatch_names_each_tasks_margin_where_the_study_had_several(tmp_path):
    """The folder report of a study with margins per task suggested `--margin 1.5`, which the next comparison refused:
    the flag takes one margin for every task."""
    import json

    from suite.api.errors import ReportError

    state = _mid_round(tmp_path, rest_recorded=False)
    state["comparisons"][1]["task"] = "mrpc"   # refused at its margin, before its looks are replayed
    for look in state["comparisons"][1]["looks"]:
        look["margin"] = 2.0
    (tmp_path / "until_decided.json").write_text(json.dumps(state))
    with pytest.raises(ReportError, match=r"within ±2, this report within ±1: give the study's margins \(rte ±1, "
                                          r"mrpc ±2\): report --study FILE") as refused:
        build_report([tmp_path], ReportOptions(aso=False, figures=False, primary=["topk", "drophead"]))
    assert "--margin 2" not in str(refused.value) and "report --study FILE" in str(refused.value)


def test_a_sequential_designs_verdict_is_the_one_the_difference_table_reports(tmp_path):
    # topk is 4-6 points above vanilla at 3 seeds: alone, a fixed-sample "better". The study's sequential design
    # left the comparison open at its first look, undecided: that verdict, whose error rate holds over the looks, is
    # the one reported; the fixed-sample one is kept beside it.
    import json

    import pandas as pd

    state = _sequential_study(tmp_path)
    (tmp_path / "until_decided.json").write_text(json.dumps(state))
    md = build_report([tmp_path], ReportOptions(aso=False, figures=False, primary=["topk"])).read_text()
    assert parse_table(md, "### Difference to `vanilla`")["topk"]["RTE"].startswith("undecided‡ +")
    assert comparison_rows(md)["topk", "RTE"]["verdict"] == "undecided‡"
    assert "the fixed-sample verdict differs for topk on RTE (better)" in md
    csv = pd.read_csv(tmp_path / "comparisons.csv")
    row = csv[csv["column"] == "rte"].iloc[0]
    assert (row["verdict"], row["fixed_verdict"], row["sequential"]) == ("undecided", "better", "continue")
    (tmp_path / "until_decided.json").unlink()   # without the state file: the fixed-sample verdict, unmarked
    md = build_report([tmp_path], ReportOptions(aso=False, figures=False, primary=["topk"])).read_text()
    assert comparison_rows(md)["topk", "RTE"]["verdict"] == "better" and "‡" not in md


def test_the_header_sums_the_records_wall_time():
    from suite.report.header import compute_note

    df = pd.DataFrame({"wall_s": [3600.0, 1800.0, float("nan")]})
    note = compute_note(df)
    assert "1.5 run-hours" in note and "2 records'" in note
    assert compute_note(pd.DataFrame({"wall_s": [float("nan")]})) == ""


def test_the_report_leaves_degenerate_runs_out_of_the_score_and_tests_them_apart(tmp_path):
    """A method that labels every example with one class at 3 of 8 seeds: its difference is over the 5 healthy
    seeds, the comparisons table counts the degenerate runs and tests them (McNemar), and the Bayesian
    P(|Δ| < margin) stands beside the verdict."""
    import numpy as np

    from suite.run.record import save_predictions

    rng = np.random.default_rng(0)
    n = 300
    labels = (np.arange(n) % 3 == 0).astype(int)
    store = Store(tmp_path)
    store.runs.mkdir(parents=True, exist_ok=True)
    for method in ("vanilla", "scores_dropout"):
        for seed in range(1, 9):
            if method == "scores_dropout" and seed <= 3:
                pred = np.zeros(n, dtype=int)
            else:
                pred = np.where(rng.random(n) < 0.8, labels, 1 - labels)
            name, rec = make_record("rte", method, seed, {"accuracy": float((pred == labels).mean())},
                                    hparams={"p": 0.1})
            sidecar = name.replace(".json", ".predictions.npz")
            save_predictions(store.runs / sidecar, {"": {"index": np.arange(n), "label": labels,
                                                         "logits": np.eye(2)[pred].astype(np.float32)}})
            rec["predictions"] = sidecar
            store.write(name, rec)
    md = build_report([tmp_path], ReportOptions(aso=False, figures=False)).read_text()
    diff = parse_table(md, "### Difference to `vanilla`")["scores_dropout"]["RTE"]
    assert "(5 of 8 seeds; degenerate 3 vs 0)" in diff
    row = comparison_rows(md)["scores_dropout", "RTE"]
    assert row["seeds"] == "5" and row["degenerate"] == "3/8 vs 0/8"
    assert float(row["collapse p adj"]) == pytest.approx(stats.binomtest(3, 3, 0.5).pvalue, abs=1e-4)
    assert 0.0 <= float(row["P(Δ within ±m)"]) <= 1.0
