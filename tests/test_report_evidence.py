"""What a reviewer checks in the report: baseline rows and marks, bold only without ties, stability, baselines from
the data folder for old records, provenance warnings, costs from a bench file, exports, corrections, plugin tasks,
and records that are not records. Numbers are computed by hand from the records written here."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_report import comparison_rows, make_record, parse_table

from suite.api.errors import ReportError
from suite.api.tasks import TASKS, TaskSpec, register_task
from suite.grid.store import Store
from suite.report import ReportOptions, build_report
from suite.report.leaderboard import COSTS
from suite.report.markdown import unwrap_prose

RTE_BASE = {"majority": {"accuracy": 0.505, "score": 0.505}, "chance": {"accuracy": 0.5, "score": 0.5}}
STSB_BASE = {"constant_mean": {"pearson": 0.0, "spearman": 0.0, "score": 0.0},
             "chance": {"pearson": 0.001, "spearman": 0.002, "score": 0.0015}}


def write(root: Path, records) -> Path:
    store = Store(root)
    for name, rec in records:
        store.write(name, rec)
    return root


def collapsed_grid(root: Path) -> Path:
    """vanilla collapses to the majority class on RTE; two methods tie at 62 ± 2; STS-B near the constant mean."""
    recs = []
    for i, s in enumerate((1, 2, 3)):
        recs.append(make_record("rte", "vanilla", s, {"accuracy": 0.505}, hparams={"p": 0.1}, baselines=RTE_BASE))
        for m in ("scores_dropout", "no_dropout"):
            recs.append(make_record("rte", m, s, {"accuracy": [0.60, 0.62, 0.64][i]},
                                    hparams={"p": 0.1} if m == "scores_dropout" else None, baselines=RTE_BASE))
        recs.append(make_record("stsb", "vanilla", s, {"pearson": 0.005, "spearman": 0.005}, hparams={"p": 0.1},
                                baselines=STSB_BASE))
        recs.append(make_record("stsb", "scores_dropout", s, {"pearson": [0.3, 0.4, 0.5][i],
                                                              "spearman": [0.3, 0.4, 0.5][i]},
                                hparams={"p": 0.1}, baselines=STSB_BASE))
    return write(root, recs)


@pytest.fixture(scope="module")
def collapsed(tmp_path_factory):
    root = collapsed_grid(tmp_path_factory.mktemp("collapsed"))
    return root, build_report([root], ReportOptions(aso=False, figures=False)).read_text()


def test_baseline_rows_marks_and_no_bold_on_ties(collapsed):
    _, md = collapsed
    board = parse_table(md, "### Leaderboard")
    assert board["*majority class / constant mean (baseline)*"]["RTE"] == "50.50"
    assert board["*majority class / constant mean (baseline)*"]["STS-B"] == "0.00"
    assert board["*chance (baseline)*"]["STS-B"] == "0.15"
    assert board["vanilla"]["RTE"] == "50.50 ± 0.00° (3)"          # exactly the majority class: marked
    # 60, 62, 64 against 50.5: one-sided t = 10.0, p = 0.005 -> above the majority class, not marked; but tied
    assert board["scores_dropout"]["RTE"] == "62.00 ± 2.00 (3)" and board["no_dropout"]["RTE"] == "62.00 ± 2.00 (3)"
    assert board["vanilla"]["STS-B"] == "0.50 ± 0.00 (3)"           # 0.5 > 0 with zero spread: not marked
    assert board["scores_dropout"]["STS-B"] == "**40.00 ± 10.00** (3)"
    assert "not distinguishable from the majority / constant predictor" in unwrap_prose(md)
    assert "from the records" in md


def test_stability_counts_collapsed_runs_and_worst_seeds(collapsed):
    _, md = collapsed
    table = parse_table(md, "### Stability across seeds")
    assert table["vanilla"]["RTE"] == "3/3 · 0.00 · 50.50"          # at the majority class: all failed
    assert table["scores_dropout"]["RTE"] == "0/3 · 2.00 · 60.00"
    assert table["vanilla"]["STS-B"] == "3/3 · 0.00 · 0.50"         # within 1 point of the constant predictor
    assert table["scores_dropout"]["STS-B"] == "0/3 · 10.00 · 30.00"


def write_rte_dev(data: Path, labels: list[str]) -> None:
    (data / "RTE").mkdir(parents=True)
    lines = ["index\tsentence1\tsentence2\tlabel"] + [f"{i}\ta\tb\t{lab}" for i, lab in enumerate(labels)]
    (data / "RTE" / "dev.tsv").write_text("\n".join(lines) + "\n")


def test_baselines_of_old_records_come_from_the_dev_labels_or_are_declared_unavailable(tmp_path, monkeypatch):
    monkeypatch.delenv("SUITE_DATA_DIR", raising=False)
    root = write(tmp_path / "runs", [make_record("rte", "vanilla", s, {"accuracy": 0.6}, hparams={"p": 0.1})
                                     for s in (1, 2)])
    md = build_report([root], ReportOptions(aso=False, figures=False)).read_text()
    assert "Baseline unavailable for RTE (unavailable: no data folder" in md
    write_rte_dev(tmp_path / "glue", ["entailment"] * 7 + ["not_entailment"] * 3)
    md = build_report([root], ReportOptions(aso=False, figures=False, data_dir=tmp_path / "glue")).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["*majority class (baseline)*"]["RTE"] == "70.00"    # 7 of 10 dev labels are the majority
    assert board["vanilla"]["RTE"] == "60.00 ± 0.00° (2)"            # below the majority class


def test_provenance_warning_counts_versions_dirty_trees_and_machines(tmp_path):
    recs = [make_record("rte", "vanilla", 1, {"accuracy": 0.6}, env={"git_commit": "aaa+dirty", "host": "one"}),
            make_record("rte", "vanilla", 2, {"accuracy": 0.6}, env={"git_commit": "bbb", "host": "two"}),
            make_record("rte", "vanilla", 3, {"accuracy": 0.6}, env={"git_commit": "bbb", "host": "two"})]
    root = write(tmp_path, recs)
    with pytest.raises(ReportError, match="1 run from uncommitted .* and 2 code versions: bbb .2 runs., aaa"):
        build_report([root], ReportOptions(aso=False, figures=False))   # a published table comes from one code version
    md = build_report([root], ReportOptions(aso=False, figures=False, allow_uncommitted=True)).read_text()
    warning = next(line for line in md.splitlines() if line.startswith("> **Warning"))
    assert "2 code versions" in warning and "1 run from uncommitted (`+dirty`) code" in warning
    assert "2 machines or device setups" in warning
    assert "**Code versions:** 2 (allowed by --allow-uncommitted" in md
    clean = build_report([write(tmp_path / "clean", recs[1:])], ReportOptions(aso=False, figures=False)).read_text()
    assert "> **Warning" not in clean and "**Code version of every table:** `bbb` (all 2 runs)" in clean


def test_records_from_two_cpus_name_them_and_warn(tmp_path):
    """Seconds per step depend on the CPU: the Machine lines name each one, and one code version run on two CPUs is
    mixed provenance. A record from before the CPU was recorded names none."""
    cpus = ({"cpu": "AMD EPYC", "cpu_bf16": True}, {"cpu": "Intel Xeon", "cpu_bf16": False}, {})
    recs = [make_record("rte", "vanilla", s, {"accuracy": 0.6}, env={"git_commit": "bbb", "device": "cpu", **cpu})
            for s, cpu in enumerate(cpus, 1)]
    md = build_report([write(tmp_path, recs)], ReportOptions(aso=False, figures=False)).read_text()
    machines = [line for line in md.splitlines() if line.startswith("- **Machine:**")]
    assert [line.split(",")[0] for line in machines] == ["- **Machine:** cpu", "- **Machine:** cpu (AMD EPYC",
                                                         "- **Machine:** cpu (Intel Xeon"]
    assert "bf16 in hardware)" in machines[1] and "bf16 emulated)" in machines[2]
    warning = next(line for line in md.splitlines() if line.startswith("> **Warning"))
    assert "3 machines or device setups (host, device, GPU or CPU, platform, CPU threads)" in warning
    assert ("Devices: CPU: AMD EPYC, bf16 in hardware, Linux-test-x86_64, 2 CPU threads; CPU: Intel Xeon, bf16 "
            "emulated, Linux-test-x86_64, 2 CPU threads; CPU: Linux-test-x86_64, 2 CPU threads.") in " ".join(
        md.split())  # the note wraps
    assert "The runs ran on 3 machines or device setups (the Machine lines above)" in " ".join(md.split())
    one = build_report([write(tmp_path / "one", recs[:1])], ReportOptions(aso=False, figures=False)).read_text()
    assert "machines or device setups" not in one and "- **Machine:** cpu (AMD EPYC, bf16 in hardware)" in one


def test_in_run_step_ratios_are_taken_within_one_machine(tmp_path):
    """The standard study's vanilla runs were mostly on an earlier, slower machine and DropHead's on a newer one: the
    pooled ratio said DropHead's steps took 0.74x vanilla's. A ratio is now taken between runs on the same machine."""
    a, b, c = ({"git_commit": "bbb", "device": "cpu", "cpu": name} for name in ("CPU A", "CPU B", "CPU C"))
    recs = [make_record("rte", "vanilla", 1, {"accuracy": 0.6}, step_s=0.1, env=a),
            make_record("rte", "vanilla", 2, {"accuracy": 0.6}, step_s=0.1, env=a),
            make_record("rte", "vanilla", 3, {"accuracy": 0.6}, step_s=0.2, env=b),
            make_record("rte", "drophead", 1, {"accuracy": 0.6}, step_s=0.3, env=b),
            make_record("rte", "topk", 1, {"accuracy": 0.6}, step_s=0.1, env=c)]
    md = build_report([write(tmp_path, recs)], ReportOptions(aso=False, figures=False)).read_text()
    context = parse_table(md, "#### In-run step times (context, not a cost measurement)")
    assert context["drophead"]["in-run step time vs vanilla"] == "1.50×"   # pooled: 0.3 / 0.133 = 2.25
    assert context["topk"]["in-run step time vs vanilla"] == "–"           # no vanilla run on its machine
    assert "each ratio is taken between runs of the same task on the same machine" in " ".join(md.split())


def test_a_shallow_clones_version_is_listed_with_its_mark(tmp_path):
    """The same commit from a full and a shallow clone: two labels, and the listing shows which is which."""
    full, shallow = "a" * 40, "a" * 40 + "+shallow"
    recs = [make_record("rte", "vanilla", s, {"accuracy": 0.6}, env={"git_commit": v})
            for s, v in ((1, full), (2, shallow))]
    with pytest.raises(ReportError, match=r"2 code versions: aaaaaaaaaaaa \(1 run\), aaaaaaaaaaaa\+shallow \(1 run\)"):
        build_report([write(tmp_path, recs)], ReportOptions(aso=False, figures=False))


def test_allow_uncommitted_from_the_study_file_and_the_command_line(tmp_path):
    from suite import commands

    recs = [make_record("rte", m, s, {"accuracy": 0.6}, env={"git_commit": "aaa+dirty"})
            for m in ("vanilla", "topk") for s in (1, 2)]  # --primary names a method of the records (else refused)
    root = write(tmp_path / "grid", recs)
    assert commands.main(["report", str(root), "--no-figures", "--no-aso"]) == 2
    assert commands.main(["report", str(root), "--no-figures", "--no-aso", "--allow-uncommitted", "--primary", "topk",
                          "--margin", "2", "--collapse-floor", "3"]) == 0
    md = " ".join((root / "leaderboard.md").read_text().split())  # unwrapped: prose breaks at 120 columns
    assert "primary comparisons (topk) by Holm" in md and "within 3 points of the majority-class" in md
    assert "put the difference within ±2.00 points (adjusted" in md   # one margin for every column
    study = tmp_path / "study.yaml"
    study.write_text(f"out: {root}\nreport:\n  allow_uncommitted: true\n  margin: {{rte: 2.5}}\n")
    assert commands.main(["report", "--study", str(study), "--no-figures", "--no-aso"]) == 0
    md = " ".join((root / "leaderboard.md").read_text().split())
    # per-task margins: each column's own, the average's the default (1 point)
    assert "put the difference within the margin (RTE ±2.50, GLUE avg ±1.00 points) (adjusted" in md


def bench_file(path: Path) -> Path:
    rows = [{"shape": "tiny", "seq_len": 128, "batch_size": 8, "method": m, "step_ms": t, "peak_mb": mb}
            for m, t, mb in (("[sdpa]", 9.0, 90.0), ("vanilla", 10.0, 100.0), ("scores_dropout", 15.0, 80.0))]
    rows += [{"shape": "tiny", "seq_len": 512, "batch_size": 8, "method": m, "step_ms": t, "peak_mb": mb}
             for m, t, mb in (("vanilla", 40.0, 400.0), ("scores_dropout", 80.0, 400.0))]
    path.write_text(json.dumps({"device": "cuda (Test GPU)", "note": "bf16", "rows": rows}))
    return path


def test_cost_columns_come_from_the_bench_file_with_its_device(tmp_path):
    root = write(tmp_path / "grid", [make_record("rte", m, 1, {"accuracy": 0.6}, hparams={"p": 0.1}, peak_mb=9e9)
                                     for m in ("vanilla", "scores_dropout")])
    bench = bench_file(tmp_path / "bench.json")
    md = build_report([root], ReportOptions(aso=False, figures=False, costs=bench)).read_text()
    board = parse_table(md, COSTS)
    # time: 1.5 and 2.0 -> geometric mean sqrt(3) = 1.73; memory: 0.8 and 1.0 -> sqrt(0.8) = 0.89
    assert board["scores_dropout"]["step time vs vanilla (bench)"] == "1.73×"
    assert board["scores_dropout"]["step memory vs vanilla (bench)"] == "0.89×"
    assert "on cuda (Test GPU), shape `tiny`" in unwrap_prose(md) and "9000000000" not in md
    (root / "bench.json").write_text(bench_file(tmp_path / "b2.json").read_text())
    # OUT/bench.json: the default
    assert "(bench)" in build_report([root], ReportOptions(aso=False, figures=False)).read_text()
    with pytest.raises(ReportError, match="no such file"):
        build_report([root], ReportOptions(costs=tmp_path / "missing.json"))


def test_exports_hold_the_markdown_tables(collapsed):
    root, md = collapsed
    csv = pd.read_csv(root / "leaderboard.csv", dtype=str, keep_default_na=False)
    assert csv.loc[csv["method"] == "scores_dropout", "STS-B"].item() == "40.00 ± 10.00 (3)"   # bold removed
    assert csv["model"].unique().tolist() == ["tiny-bert"]
    tex = (root / "leaderboard.tex").read_text()
    assert r"\textbf{40.00 $\pm$ 10.00}" in tex and r"scores\_dropout" in tex and r"\begin{tabular}" in tex
    comparisons = pd.read_csv(root / "comparisons.csv")
    row = comparisons[(comparisons["method"] == "scores_dropout") & (comparisons["column"] == "rte")].iloc[0]
    assert row["diff"] == pytest.approx(11.5) and row["n"] == 3           # 62 - 50.5 at every seed
    assert (root / "leaderboard_stability.csv").is_file() and (root / "leaderboard_differences.tex").is_file()
    for path in root.glob("*.tex"):   # every symbol the tables use is escaped: plain pdflatex compiles them
        assert all(ord(ch) < 128 for ch in path.read_text()), path.name


def test_benjamini_hochberg_option(collapsed):
    root, _ = collapsed
    md = build_report([root], ReportOptions(aso=False, figures=False, correction="bh")).read_text()
    assert "all 4 tests of this table (tasks and averages) form one family, adjusted by Benjamini-Hochberg" in md
    with pytest.raises(ReportError, match="valid corrections are holm, bh"):
        build_report([root], ReportOptions(correction="bonferroni"))


@pytest.fixture
def plugin_task():
    spec = register_task(TaskSpec("toxic_probe", "Toxic", ("text",), ("no", "yes"), ("accuracy",),
                                  ("someone/toxic", "default"), benchmark="SAFETY"))
    yield spec
    TASKS.remove(spec.name)


def test_a_plugin_task_is_averaged_under_its_own_benchmark_never_glue(tmp_path, plugin_task):
    recs = [make_record(t, "vanilla", 1, {"accuracy": 0.6}, hparams={"p": 0.1}) for t in ("rte", "toxic_probe")]
    md = build_report([write(tmp_path, recs)], ReportOptions(aso=False, figures=False)).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["GLUE avg"] == "**60.00**" and board["vanilla"]["SAFETY avg"] == "**60.00**"
    assert "GLUE avg: unweighted mean of the per-task means over RTE;" in md
    assert "SAFETY avg: unweighted mean of the per-task means over Toxic;" in md
    assert "GLUE tasks RTE; SAFETY tasks Toxic" in md and "hub: someone/toxic" in md


def test_invalid_records_are_named_with_the_reason_and_temporary_files_ignored(tmp_path):
    root = write(tmp_path, [make_record("rte", "vanilla", 1, {"accuracy": 0.6})])
    (root / "runs" / "no_status.json").write_text(json.dumps({"config": {}, "hash": "x", "label": "y"}))
    (root / "runs" / ".tmp-abc.json").write_text("{half a rec")
    md = build_report([root], ReportOptions(aso=False, figures=False)).read_text()
    assert "1 unreadable record files skipped: no_status.json" in md
    assert "- no_status.json: not a run record: missing status" in md and ".tmp-abc" not in md
    assert not (root / "figures").exists()          # figures=False: tables only


def write_predicted(root: Path, labels: np.ndarray, right: dict[tuple[str, int], np.ndarray]) -> None:
    """RTE records with prediction sidecars: (method, seed) -> which dev examples that run gets right."""
    from suite.run.record import save_predictions

    store = Store(root)
    store.runs.mkdir(parents=True, exist_ok=True)
    for (method, seed), r in right.items():
        name, rec = make_record("rte", method, seed, {"accuracy": float(r.mean())}, hparams={"p": 0.1})
        pred = np.where(r, labels, 1 - labels)
        sidecar = name.replace(".json", ".predictions.npz")
        save_predictions(store.runs / sidecar, {"": {"index": np.arange(len(labels)), "label": labels,
                                                      "logits": np.eye(2)[pred].astype(np.float32)}})
        rec["predictions"] = sidecar
        store.write(name, rec)


def test_example_level_interval_from_prediction_sidecars(tmp_path):
    """Accuracy differences over resampled examples: the interval is about mean ± 1.96 standard errors of the
    per-example correctness difference (normal approximation), and exactly +100 when one method is always right."""
    rng = np.random.default_rng(5)
    n = 400
    labels = rng.integers(0, 2, n)
    right_a, right_b = rng.random(n) < 0.75, rng.random(n) < 0.65
    write_predicted(tmp_path, labels, {(method, s): right for method, right in (("vanilla", right_b),
                                                                                ("scores_dropout", right_a))
                                       for s in (1, 2)})
    md = build_report([tmp_path], ReportOptions(aso=False, figures=False)).read_text()
    row = comparison_rows(md)["scores_dropout", "RTE"]
    low, high = (float(x) for x in row["95% interval"].strip("[]").split(", "))
    d = right_a.astype(float) - right_b.astype(float)
    se = d.std(ddof=1) / np.sqrt(n) * 100
    # the two seeds agree exactly, so all the noise is the dev examples': a normal interval of their bootstrap
    assert float(row["dev-example se"]) == pytest.approx(se, rel=0.2)
    assert low == pytest.approx(d.mean() * 100 - 1.96 * se, abs=0.6 * se)
    assert high == pytest.approx(d.mean() * 100 + 1.96 * se, abs=0.6 * se)
    assert not parse_table(md, "### Difference to `vanilla`")["scores_dropout"]["RTE"].endswith("ˢ")
    assert "Dev-example part estimated at 0" not in md


def test_an_interval_whose_dev_example_part_is_estimated_at_zero_is_named(tmp_path):
    """Example-by-example differences that (mostly) reverse from one seed to the next share nothing across seeds:
    the dev-example part is estimated below 0 and clipped, and the notes under the difference table say so."""
    rng = np.random.default_rng(7)
    n = 400
    labels = rng.integers(0, 2, n)
    method_1, reference_1 = rng.random(n) < 0.75, rng.random(n) < 0.65
    flip = rng.random(n) < 0.1   # seed 2 swaps which examples each method gets right, but for a tenth of them
    write_predicted(tmp_path, labels, {("scores_dropout", 1): method_1, ("vanilla", 1): reference_1,
                                       ("scores_dropout", 2): reference_1 ^ flip, ("vanilla", 2): method_1})
    md = build_report([tmp_path], ReportOptions(aso=False, figures=False)).read_text()
    assert comparison_rows(md)["scores_dropout", "RTE"]["dev-example se"] == "0.00"
    assert "Dev-example part estimated at 0 (clipped; the Further statistics' dev-example se) for scores_dropout on " \
           "RTE: those intervals rest on the seeds' spread" in unwrap_prose(md)


def test_the_bench_json_writer_and_the_report_reader_agree(tmp_path):
    import torch

    from suite.profiling import write_json

    rows = [{"shape": "tiny", "seq_len": 64, "batch_size": 4, "method": m, "step_ms": t, "peak_mb": 10.0,
             "error": None} for m, t in (("vanilla", 20.0), ("scores_dropout", 30.0))]
    write_json(str(tmp_path / "bench.json"), rows, torch.device("cpu"), None, "python -m suite bench --shapes tiny")
    root = write(tmp_path / "grid", [make_record("rte", m, 1, {"accuracy": 0.6}, hparams={"p": 0.1})
                                     for m in ("vanilla", "scores_dropout")])
    md = build_report([root], ReportOptions(aso=False, figures=False, costs=tmp_path / "bench.json")).read_text()
    assert parse_table(md, COSTS)["scores_dropout"]["step time vs vanilla (bench)"] == "1.50×"
    assert "with `python -m suite bench --shapes tiny`" in unwrap_prose(md) and "on CPU" in md


def test_seeds_needed_from_each_comparisons_own_variance_and_comparisons_within_reach(tmp_path):
    """RTE: scores_dropout - vanilla = +4, +1, +5 points (mean 3.33, sd 2.08; p = 0.11 at 3 seeds); no_dropout equals
    vanilla at every seed (no spread, so no test of equivalence: undecided). Seeds needed: statsmodels' paired t-test
    power at Holm's first step over the 4 tests with scores_dropout's own sd (not pooled with no_dropout's zeros, which
    would shrink it)."""
    from statsmodels.stats.power import TTestPower

    recs = []
    for s, v, x in zip((1, 2, 3), (0.60, 0.62, 0.61), (0.64, 0.63, 0.66)):
        recs.append(make_record("rte", "vanilla", s, {"accuracy": v}, hparams={"p": 0.1}, baselines=RTE_BASE))
        recs.append(make_record("rte", "scores_dropout", s, {"accuracy": x}, hparams={"p": 0.1},
                                baselines=RTE_BASE))
        recs.append(make_record("rte", "no_dropout", s, {"accuracy": v}, baselines=RTE_BASE))
    md = build_report([write(tmp_path, recs)], ReportOptions(aso=False, figures=False)).read_text()
    assert "all 4 tests of this table" in md
    effect = (10 / 3) / np.std([4, 1, 5], ddof=1)
    expected = int(np.ceil(TTestPower().solve_power(effect_size=effect, alpha=0.05 / 4, power=0.8)))
    rows = comparison_rows(md)
    assert rows["scores_dropout", "RTE"]["seeds needed"] == str(expected)
    # identical scores at every seed without prediction sidecars: no estimate of the noise, so no equivalence claim
    assert rows["no_dropout", "RTE"]["verdict"] == "undecided" and rows["no_dropout", "RTE"]["p equiv"] == "–"
    assert 3 < expected <= 10
    assert "Undecided but within reach" in md and f"scores_dropout on RTE ({expected})" in md


def test_bimodal_cells_show_the_median_and_collapse_counts_use_the_declared_floor(tmp_path):
    """vanilla on RTE: one of five seeds collapsed to the majority class (50.5): the cell shows the median, the
    stability table counts it, and almost stochastic order is computed for its comparisons (5 seeds, bimodal)."""
    recs = []
    for s, v, x in zip((1, 2, 3, 4, 5), (0.505, 0.62, 0.64, 0.63, 0.61), (0.60, 0.62, 0.61, 0.66, 0.63)):
        recs.append(make_record("rte", "vanilla", s, {"accuracy": v}, hparams={"p": 0.1}, baselines=RTE_BASE))
        recs.append(make_record("rte", "scores_dropout", s, {"accuracy": x}, hparams={"p": 0.1},
                                baselines=RTE_BASE))
    root = write(tmp_path, recs)
    md = build_report([root], ReportOptions(figures=False)).read_text()
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "median 62.00, 1 of 5 collapsed (5)"
    assert board["scores_dropout"]["RTE"] == "**62.40 ± 2.30** (5)"          # healthy: mean ± sd
    assert parse_table(md, "### Stability across seeds")["vanilla"]["RTE"].startswith("1/5 ·")
    # "failed" means one thing, did not finish: the collapsed run is counted as collapsed, never called failed
    prose = " ".join(md.split())
    assert "failed (k): runs that did not finish" in prose and "Failed: did not finish" in prose
    assert "counts as failed" not in prose and "failed runs / runs" not in prose
    assert parse_table(md, "#### RTE")["vanilla"]["failed"] == "0"
    assert comparison_rows(md)["scores_dropout", "RTE"]["ASO ε"] != "–"
    # a floor 12 points above the majority class (62.5) makes three of vanilla's five runs collapsed
    md = build_report([root], ReportOptions(figures=False, aso=False, collapse_floor=12.0)).read_text()
    assert parse_table(md, "### Stability across seeds")["vanilla"]["RTE"].startswith("3/5 ·")


def test_a_method_named_primary_covers_its_tasks_and_the_average_only_when_named(tmp_path):
    # the sequential design spends alpha over methods x tasks; the benchmark average is derived from those cells
    from suite.report.comparisons import family_of

    assert family_of("topk", "rte", ["topk"], {"GLUE avg"}) == "primary"
    assert family_of("topk", "GLUE avg", ["topk"], {"GLUE avg"}) == "exploratory"
    assert family_of("topk", "GLUE avg", ["topk", "GLUE avg"], {"GLUE avg"}) == "primary"
    assert family_of("topk", "GLUE avg", ["topk:GLUE avg"], {"GLUE avg"}) == "primary"
    assert family_of("topk", "rte", None, {"GLUE avg"}) == "all"
    recs = [make_record(t, m, s, {"accuracy": 0.6 + 0.01 * s + (0.003 * s * s if m == "topk" else 0.0)},
                        hparams={"k": 8})
            for t in ("rte", "wnli") for m in ("vanilla", "topk") for s in (1, 2, 3)]
    md = build_report([write(tmp_path, recs)], ReportOptions(aso=False, figures=False, primary=["topk"])).read_text()
    rows = comparison_rows(md)
    assert rows["topk", "RTE"]["family"] == rows["topk", "WNLI"]["family"] == "primary"
    assert rows["topk", "GLUE avg"]["family"] == "exploratory"
    assert "the 2 primary comparisons" in md
    # the family's power as declared: each primary comparison simulated at its seeds and noise, at alpha / 2
    assert "Power of the primary family as declared (2 comparisons, each first tested at α/2)" in md
    assert "with a family of 9" not in md   # a family of 2 is small already


def test_the_power_of_a_primary_comparison_is_simulated_at_its_seeds_noise_and_family_level():
    from suite.report.comparisons import POWER_SIMULATIONS, family_power
    from suite.stats.design_power import Noise, simulate
    from suite.stats.evidence import Evidence, bootstrap_seed
    from suite.stats.sequential import Design

    ev = Evidence(12, 1.0, 0.4, 11.0, 0.1, 1.9, 0.02, 0.5, 1.0, seed_sd=1.5, example_se=0.2, n_paired=12)
    declared, small = family_power(ev, 0.05, 36, ("topk", "rte"))
    seed = bootstrap_seed("power", "topk", "rte")
    for m, got in ((36, declared), (9, small)):
        want = simulate(Noise(1.5, 0.2), Design((12,), 0.05 / m, futility=0.0), 1.5, 1.0, POWER_SIMULATIONS, seed)
        assert got == want.difference
    assert declared < small   # each added comparison costs the others power
    assert all(math.isnan(x) for x in family_power(dataclasses.replace(ev, seed_sd=math.nan), 0.05, 9, ("a", "b")))


def test_a_reference_at_the_majority_class_gets_a_warning_line(tmp_path):
    """vanilla no better than RTE's majority class (50.5) on three seeds: a warning line under the leaderboard names
    the task; a reference well above it (the second report) gets none."""
    recs = [make_record("rte", m, s, {"accuracy": v}, hparams={"p": 0.1}, baselines=RTE_BASE)
            for s, v in zip((1, 2, 3), (0.505, 0.50, 0.51)) for m in ("vanilla", "scores_dropout")]
    md = " ".join(build_report([write(tmp_path / "flat", recs)], ReportOptions(figures=False, aso=False))
                  .read_text().split())
    assert "**Warning: the reference `vanilla` scores at the majority / constant predictor on RTE** (" in md
    assert "it learned nothing there, so every difference to it on RTE is one to a constant predictor" in md
    recs = [make_record("rte", "vanilla", s, {"accuracy": v}, hparams={"p": 0.1}, baselines=RTE_BASE)
            for s, v in zip((1, 2, 3), (0.70, 0.72, 0.71))]
    md = build_report([write(tmp_path / "learned", recs)], ReportOptions(figures=False, aso=False)).read_text()
    assert "Warning: the reference" not in md
