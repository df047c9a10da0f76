"""The report on synthetic run records with known values: every number below is computed by hand from the records
the factory writes, so a wrong mean, std, test decision, average or marking fails a test."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from suite.api.attention import METHODS, AttentionMethod, register_method
from suite.api.tasks import get_task
from suite.grid.store import Store
from suite.report import ReportError, ReportOptions, build_report
from suite.report.differences import DETAILS
from suite.report.leaderboard import COSTS
from suite.report.markdown import unwrap_prose
from suite.run.settings import RunConfig, TrainSettings

MODEL = "tiny-bert"
TRAIN = {**dataclasses.asdict(TrainSettings()), "max_train_samples": 64, "max_eval_samples": 100}
ENV = {"suite": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.23.0",
       "datasets": "5.2.0", "platform": "Linux-test-x86_64", "machine": "x86_64", "cpu_threads": 2,
       "device": "cpu", "git_commit": "0123456789abcdef", "host": "vm"}
LAYERS = 2


def headline(metrics: dict) -> float:
    return sum(metrics.values()) / len(metrics)


def make_record(task: str, method: str, seed: int, metrics: dict | None = None, *, hparams: dict | None = None,
                train: dict | None = None, status: str = "ok", step_s: float = 0.1, peak_mb: float = 1000.0,
                extra: int = 0, training_only: int = 0, attention: dict | None = None,
                method_record: dict | None = None, epoch_method: dict | None = None,
                baselines: dict | None = None, env: dict | None = None, step_mode: str | None = None
                ) -> tuple[str, dict]:
    """(file name, record) in the layout `suite.run.runner.run_one` writes."""
    train = {**TRAIN, **(train or {})}
    config = {"model": MODEL, "task": task, "method": method, "hparams": hparams or {}, "seed": seed,
              "train": train, "data_source": "local"}
    digest = RunConfig.from_dict(config).hash  # a reader holds every record against its own hash
    rec = {"config": config, "hash": digest, "label": f"{task}/{method}/seed{seed}",
           "environment": {**ENV, **(env or {})},
           "started": f"2026-01-01T00:00:{seed:02d}+0000"}
    if status == "ok":
        final = {**metrics, "score": headline(metrics)}
        epochs = train["epochs"]
        history = []
        for e in range(1, epochs + 1):
            dev = final["score"] - 0.02 * (epochs - e)
            entry = {"epoch": e, "train_loss": 0.7 - 0.1 * e, "dev_loss": 0.7 - 0.05 * e,
                     "dev": {"score": dev}, "train_subset_loss": 0.6 - 0.1 * e,
                     "train_subset": {"score": dev + 0.05 * e}, "epoch_time_s": 1.0, "train_samples_per_s": 64.0}
            if epoch_method is not None:
                entry["method"] = {k: [v * e for v in vals] for k, vals in epoch_method.items()}
            history.append(entry)
        rec.update(history=history, final=final, best=dict(final, epoch=epochs),
                   generalisation_gap=history[-1]["train_subset"]["score"] - history[-1]["dev"]["score"],
                   timing={"train_s": 10 * step_s, "eval_s": 1.0, "steps": 10, "step_s": step_s,
                           "train_samples_per_s": 64.0, "peak_memory_mb": peak_mb,
                           "peak_memory_kind": "process_max_rss",
                           **({"step_mode": {"mode": step_mode}} if step_mode else {})},
                   data={"train": 64, "dev": {"": 100}, "train_subset": 64},
                   parameters={"total": 1000 + extra, "extra": extra, "training_only": training_only},
                   method_record=method_record or {}, status="ok")
        if attention is not None:
            rec["attention"] = attention
        if baselines is not None:
            rec["baselines"] = baselines
    else:
        rec.update(status="failed", error="RuntimeError: synthetic failure\ntraceback line")
    rec.update(wall_s=1.0, finished=f"2026-01-01T00:01:{seed:02d}+0000")
    model = MODEL.split("/")[-1]
    return f"{task}__{method}__seed{seed}__{model}__{digest}.json", rec


def attention_stats(shift: float) -> dict:
    per_layer = {s: [0.1 + shift, 0.2 + shift] for s in
                 ("sparsity", "entropy", "null_rows", "attended_keys", "head_diversity", "mass_cls", "mass_sep",
                  "mass_punct")}
    return {"batches": 4, "layers": LAYERS, "per_layer": per_layer,
            "mean": {k: sum(v) / len(v) for k, v in per_layer.items()}}


@pytest.fixture(scope="module")
def recon_method():
    """A registered method marked as a reconstruction (registered here, not at import: collection stays clean)."""

    @dataclasses.dataclass
    class Cfg:
        p: float = 0.1

    @register_method("recon_probe")
    class ReconProbe(AttentionMethod):
        """Test method rebuilt from a description."""

        Config = Cfg
        reconstruction = True

    yield "recon_probe"
    METHODS.remove("recon_probe")


def write_grid(root: Path) -> Path:
    store = Store(root)
    recs = []
    seeds = (1, 2, 3)
    # vanilla: RTE 62 ± 2, MRPC (F1+acc)/2 = 77 ± 2, STS-B 52 ± 2, WNLI 56 ± 0; average without WNLI 63.67
    for i, s in enumerate(seeds):
        att = attention_stats(0.0)
        recs.append(make_record("rte", "vanilla", s, {"accuracy": [0.60, 0.62, 0.64][i]}, hparams={"p": 0.1},
                                attention=att))
        recs.append(make_record("mrpc", "vanilla", s, {"f1": [0.80, 0.82, 0.84][i], "accuracy": [0.70, 0.72, 0.74][i]},
                                hparams={"p": 0.1}))
        recs.append(make_record("stsb", "vanilla", s, {"pearson": [0.50, 0.52, 0.54][i],
                                                       "spearman": [0.50, 0.52, 0.54][i]}, hparams={"p": 0.1}))
        recs.append(make_record("wnli", "vanilla", s, {"accuracy": 0.56}, hparams={"p": 0.1}))
    # scores_dropout (default p=0.1): RTE 71 ± 1 (clearly better), MRPC 78, STS-B 50, WNLI 45; average 66.33;
    # twice as slow per step, 1.5x the memory; a sweep p=0.2 on RTE only (66 ± 1)
    for i, s in enumerate(seeds):
        kw = dict(hparams={"p": 0.1}, step_s=0.2, peak_mb=1500.0)
        recs.append(make_record("rte", "scores_dropout", s, {"accuracy": [0.70, 0.71, 0.72][i]},
                                attention=attention_stats(0.1), **kw))
        recs.append(make_record("mrpc", "scores_dropout", s, {"f1": [0.81, 0.83, 0.85][i],
                                                              "accuracy": [0.71, 0.73, 0.75][i]}, **kw))
        recs.append(make_record("stsb", "scores_dropout", s, {"pearson": [0.49, 0.50, 0.51][i],
                                                              "spearman": [0.49, 0.50, 0.51][i]}, **kw))
        recs.append(make_record("wnli", "scores_dropout", s, {"accuracy": [0.40, 0.45, 0.50][i]}, **kw))
        recs.append(make_record("rte", "scores_dropout", s, {"accuracy": [0.65, 0.66, 0.67][i]}, hparams={"p": 0.2}))
    # no_dropout: RTE equal to vanilla (62 ± 2, no mark), MRPC: two failed runs, STS-B and WNLI: no run;
    # one WNLI run with other training settings than the leaderboard's
    for i, s in enumerate(seeds):
        recs.append(make_record("rte", "no_dropout", s, {"accuracy": [0.64, 0.60, 0.62][i]}))
    recs.append(make_record("mrpc", "no_dropout", 1, status="failed"))
    recs.append(make_record("mrpc", "no_dropout", 2, status="failed"))
    recs.append(make_record("wnli", "no_dropout", 1, {"accuracy": 0.5}, train={"lr": 1e-4}))
    # a method from a plugin that is not installed: no known defaults; k=8 has more runs than k=4
    for s in seeds:
        recs.append(make_record("rte", "plugin_x", s, {"accuracy": 0.61}, hparams={"k": 8}, extra=1536))
    recs.append(make_record("rte", "plugin_x", 1, {"accuracy": 0.55}, hparams={"k": 4}, extra=1536))
    # a reconstruction with a learned drop rate per layer and training-only parameters
    for s in seeds:
        recs.append(make_record("rte", "recon_probe", s, {"accuracy": 0.63}, hparams={"p": 0.1},
                                training_only=12345, method_record={"drop_rate_per_layer": [0.2, 0.1]},
                                epoch_method={"drop_rate_per_layer": [0.05, 0.02]}))
    for name, rec in recs:
        store.write(name, rec)
    (root / "runs" / "broken.json").write_text("{not json")
    (root / "commands.txt").write_text("python -m suite run --methods vanilla --tasks rte --out synthetic\n")
    return root


def parse_table(md: str, heading: str) -> dict[str, dict[str, str]]:
    """The first markdown table after `heading`, as {first cell: {column: cell}}."""
    lines = md.splitlines()
    start = lines.index(heading)
    while not lines[start].startswith("|"):
        start += 1
    rows = []
    while start < len(lines) and lines[start].startswith("|"):
        rows.append([c.strip() for c in lines[start].strip("|").split(" | ")])
        start += 1
    header, body = rows[0], rows[2:]
    return {r[0]: dict(zip(header, r)) for r in body}


def comparison_rows(md: str, reference: str = "vanilla") -> dict[tuple[str, str], dict[str, str]]:
    """The per-comparison tables (the compact one and the further statistics below it) as {(method, task): {column:
    cell}}, each row's cells of both tables together."""
    section = md.split(f"### Comparisons with `{reference}`")[1]
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for part in (section, section.split(DETAILS)[1]):
        lines = part.split("\n\n")[1].splitlines()
        header = [c.strip() for c in lines[0].strip("|").split(" | ")]
        for line in lines[2:]:
            row = dict(zip(header, (c.strip() for c in line.strip("|").split(" | "))))
            rows.setdefault((row["method"], row["task"]), {}).update(row)
    return rows


@pytest.fixture(scope="module")
def report(tmp_path_factory, recon_method):
    root = write_grid(tmp_path_factory.mktemp("grid"))
    path = build_report([root])
    return root, unwrap_prose(path.read_text())   # each paragraph on one line: the phrases below, whatever the wrap


def test_leaderboard_means_stds_best_and_average(report):
    _, md = report
    board = parse_table(md, "### Leaderboard")
    van, sd = board["vanilla"], board["scores_dropout"]
    assert van["RTE"] == "62.00 ± 2.00 (3)"
    assert sd["RTE"] == "**71.00 ± 1.00** (3)"          # best in its column
    assert van["MRPC"] == "77.00 ± 2.00 (3)" and sd["MRPC"] == "**78.00 ± 2.00** (3)"
    assert van["STS-B"] == "**52.00 ± 2.00** (3)" and sd["STS-B"] == "50.00 ± 1.00 (3)"
    assert van["WNLI"] == "**56.00 ± 0.00** (3)" and sd["WNLI"] == "45.00 ± 5.00 (3)"
    # GLUE average over RTE, MRPC, STS-B: WNLI is left out (with it vanilla would be 61.75)
    assert van["GLUE avg"] == "63.67" and sd["GLUE avg"] == "**66.33**"
    assert f"WNLI: {get_task('wnli').average_note}" in md   # the reason comes from the task's spec
    # a method with results on one of three averaged tasks is flagged and never bolded
    assert board["no_dropout"]["GLUE avg"] == "62.00 (1 of 3)"


def test_missing_and_failed_cells(report):
    _, md = report
    row = parse_table(md, "### Leaderboard")["no_dropout"]
    assert row["MRPC"] == "failed (2)"
    assert row["STS-B"] == "–"
    assert row["WNLI"] == "–"   # its only WNLI run used other training settings: listed below, not dropped
    assert "## Failed runs" in md and md.count("RuntimeError: synthetic failure") == 2
    outside = parse_table(md, "## Runs outside the leaderboard settings")
    assert outside["tiny-bert"]["method"] == "no_dropout" and "train.lr=0.0001" in outside["tiny-bert"]["setting"]
    assert "1 unreadable record files skipped: broken.json" in md
    # a cell without runs is compared with nothing: no row says "undecided" at 0 seeds, in the table or the CSV
    root, _ = report
    assert ("no_dropout", "STS-B") not in comparison_rows(md) and ("no_dropout", "RTE") in comparison_rows(md)
    csv = pd.read_csv(root / "comparisons.csv")
    assert (csv["n"] > 0).all() and not ((csv["method"] == "no_dropout") & (csv["column"] == "stsb")).any()


def test_verdicts_and_intervals_without_predictions(report):
    """Runs without per-example predictions: the test is the paired t-test over seeds (Cochran-Cox with no
    dev-example part), adjusted by Holm across the 7 tests of the table; numbers by hand below."""
    _, md = report
    delta = parse_table(md, "### Difference to `vanilla`")
    half = stats.t.ppf(0.975, 2) / math.sqrt(3)          # t interval half-width per unit sd, 3 seeds
    # RTE: differences 10, 9, 8: mean 9, sd 1, p = 0.0041; Holm: 7 x p = 0.029 < 0.05
    assert delta["scores_dropout"]["RTE"] == f"better +9.00 [{9 - half:+.2f}, {9 + half:+.2f}]ˢ"
    # differences 4, -2, -2: mean 0, sd 2 sqrt(3): no difference shown, but no equivalence within 1 point either
    sd = 2 * math.sqrt(3)
    assert delta["no_dropout"]["RTE"] == f"undecided +0.00 [{-half * sd:+.2f}, {half * sd:+.2f}]ˢ"
    assert delta["scores_dropout"]["STS-B"] == f"undecided -2.00 [{-2 - half:+.2f}, {-2 + half:+.2f}]ˢ"  # p 0.074
    assert delta["scores_dropout"]["MRPC"] == "undecided +1.00 [+1.00, +1.00]"   # +1 at every seed: no test
    # the average: per-seed means over RTE, MRPC, STS-B differ by 3.33, 2.67, 2.00: p = 0.020, Holm 6 x p > 0.05
    assert delta["scores_dropout"]["GLUE avg"].startswith("undecided +2.67 [")
    rows = comparison_rows(md)
    rte = rows["scores_dropout", "RTE"]
    p = stats.ttest_rel([70, 71, 72], [60, 62, 64]).pvalue
    assert rte["p"] == f"{p:.4f}" and rte["p adj"] == f"{7 * p:.4f}" and rte["verdict"] == "better"
    assert rte["family"] == "all" and rte["seeds needed"] == "–" and rte["dev-example se"] == "–"
    no_drop = rows["no_dropout", "RTE"]
    assert no_drop["p"] == "1.0000" and no_drop["verdict"] == "undecided"
    assert no_drop["ASO ε"] == "–"          # no bimodal outcomes: almost stochastic order is not computed
    assert "Holm-Bonferroni" in md and "all 7 tests of this table" in md


def test_costs_from_the_runs_are_context_only_and_parameters_and_reconstruction_footnote(report):
    _, md = report
    board = parse_table(md, COSTS)
    assert not any("memory" in col or "step time" in col for col in board["vanilla"])   # no bench file: no costs
    assert "Costs: no measurement for this model" in md
    context = parse_table(md, "#### In-run step times (context, not a cost measurement)")
    assert context["scores_dropout"]["in-run step time vs vanilla"] == "2.00×"
    assert "in-run GPU peak" not in md and "process's peak resident set, which is not one method's cost" in md
    assert board["recon_probe †"]["training-only params"] == "12,345"
    assert "† `recon_probe`: reconstruction from the paper's description" in md
    # unknown plugin method: the most-run setting, named in the row and under the table
    assert board["plugin_x [k=8]"]["extra params"] == "1,536"
    assert parse_table(md, "### Leaderboard")["plugin_x [k=8]"]["RTE"] == "61.00 ± 0.00 (3)"
    assert "`plugin_x`: no runs with its default hyper-parameters; the row shows k=8." in md


def headers(md: str, heading: str) -> list[str]:
    """The column headers of the first markdown table after `heading`."""
    lines = md.splitlines()
    first = next(line for line in lines[lines.index(heading):] if line.startswith("|"))
    return [c.strip() for c in first.strip("|").split(" | ")]


def test_the_compact_tables_show_their_columns_and_the_rest_below_them_and_in_the_exports(report):
    """The leaderboard: methods x tasks x average, its costs and parameters in a small table below; the comparisons:
    what each verdict rests on, every other statistic below. The exports keep every column in one table."""
    root, md = report
    tasks = ["MRPC", "STS-B", "RTE", "WNLI"]   # GLUE's order
    assert headers(md, "### Leaderboard") == ["method", *tasks, "GLUE avg"]
    assert headers(md, COSTS) == ["method", "extra params", "training-only params"]   # no bench file: no costs
    assert headers(md, "### Comparisons with `vanilla`") == ["method", "task", "seeds", "Δ", "95% interval",
                                                             "median Δ", "sign interval", "wins", "p adj",
                                                             "p equiv adj", "verdict", "family", "degenerate"]
    assert headers(md, DETAILS) == ["method", "task", "dev-example se", "effect size", "p", "p equiv",
                                    "P(Δ within ±m)", "seeds needed", "collapse p adj", "ASO ε"]
    # the exports as before: one table each, every column of the markdown tables that show its parts
    board = pd.read_csv(root / "leaderboard.csv", dtype=str, keep_default_na=False)
    assert list(board.columns) == ["model", "method", *tasks, "GLUE avg", "extra params", "training-only params"]
    comparisons = pd.read_csv(root / "leaderboard_comparisons.csv", dtype=str, keep_default_na=False)
    shown = comparison_rows(md)
    assert set(comparisons.columns) - {"model"} == {column for row in shown.values() for column in row}
    for row in comparisons.to_dict("records"):   # the same cells in the two markdown tables together
        assert shown[row["method"], row["task"]] == {k: v for k, v in row.items() if k != "model"}
    assert "in leaderboard_comparisons.csv and .tex" in md and "leaderboard.csv and leaderboard.tex hold" in md


def test_the_report_prose_is_wrapped_at_the_width_and_renders_as_one_line_per_paragraph(report):
    """Every prose line within 120 columns (tables and code as they are; a line over it only where no break is
    possible), and the file renders as its unwrapped text does: wrapping changed the layout, not the document."""
    from suite.report.markdown import ITEM, WIDTH, breakable, wrap_prose

    root, md = report
    raw = (root / "leaderboard.md").read_text()
    assert raw != md and wrap_prose(md) == raw     # the fixture has long notes, and they were wrapped
    fenced = False
    for line in raw.splitlines():
        fenced ^= line.startswith("```")
        if fenced or line.startswith(("|", "```")):
            continue
        lead = len(ITEM.match(line).group(0))
        assert len(line) <= WIDTH or not [p for p in breakable(line[lead:]) if lead + p <= WIDTH], line
    markdown_it = pytest.importorskip("markdown_it", reason="pip install -e \".[test]\" (markdown-it-py)")
    render = markdown_it.MarkdownIt("commonmark").enable("table").render
    assert " ".join(render(raw).split()) == " ".join(render(md).split())


def test_in_run_step_times_name_the_step_modes_when_they_differ(tmp_path):
    """A captured baseline against an eager method: the ratio measures the mode too, and the report says so."""
    store = Store(tmp_path)
    for s in (1, 2, 3):
        store.write(*make_record("rte", "vanilla", s, {"accuracy": 0.6 + s / 100}, step_s=0.1, step_mode="captured"))
        store.write(*make_record("rte", "scores_dropout", s, {"accuracy": 0.6 + s / 100}, step_s=0.3))
    md = build_report([tmp_path]).read_text()
    context = parse_table(md, "#### In-run step times (context, not a cost measurement)")
    assert context["scores_dropout (eager)"]["in-run step time vs vanilla"] == "3.00×"
    assert "vanilla (captured)" in context and "a ratio between modes measures the mode too" in md


def test_per_task_tables_have_every_official_metric(report):
    _, md = report
    mrpc = parse_table(md, "#### MRPC")
    assert mrpc["vanilla"]["f1"] == "82.00 ± 2.00" and mrpc["vanilla"]["accuracy"] == "72.00 ± 2.00"
    assert mrpc["no_dropout"]["failed"] == "2" and mrpc["no_dropout"]["headline"] == "failed (2)"
    stsb = parse_table(md, "#### STS-B")
    assert stsb["scores_dropout"]["pearson"] == "50.00 ± 1.00" and "spearman" in stsb["scores_dropout"]


def test_sweep_tables(report):
    _, md = report
    lines = md.splitlines()
    start = lines.index("### Ablations")
    section = "\n".join(lines[start:])
    sd = parse_table(section, "#### scores_dropout")
    assert sd["0.1"]["RTE"] == "71.00 ± 1.00 (3)" and sd["0.1"]["in leaderboard"] == "✓"
    assert sd["0.2"]["RTE"] == "66.00 ± 1.00 (3)" and sd["0.2"]["in leaderboard"] == ""
    assert sd["0.2"]["MRPC"] == "–"
    px = parse_table(section, "#### plugin_x [k=8]")
    assert px["4"]["RTE"] == "55.00 ± – (1)" and px["8"]["in leaderboard"] == "✓"
    assert "#### vanilla" not in section   # vanilla ran one setting: no ablation table


def test_overfitting_gap_and_figures(report):
    root, md = report
    gap = parse_table(md, "### Overfitting")
    assert gap["vanilla"]["RTE"] == "15.00 ± 0.00 (3)"   # factory: train subset = dev + 0.05 * 3 epochs
    figures = root / "figures"
    expected = ["curves_tiny-bert_rte.png", "loss_tiny-bert_rte.png", "curves_tiny-bert_mrpc.png",
                "curves_tiny-bert_stsb.png", "curves_tiny-bert_wnli.png", "seeds_tiny-bert.png",
                "attention_tiny-bert.png", "attention_mass_tiny-bert.png", "drop_rate_tiny-bert_recon_probe.png"]
    for name in expected:
        data = (figures / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, name
        assert round(png_dpi(data)) >= 200, name
        assert (figures / name).with_suffix(".pdf").read_bytes().startswith(b"%PDF"), name
        assert f"(figures/{name})" in md   # relative links render on GitHub
    att = parse_table(md, "### Attention")
    assert att["vanilla"]["sparsity"] == "0.150" and att["scores_dropout"]["sparsity"] == "0.250"


def png_dpi(data: bytes) -> float:
    """Horizontal resolution from the PNG's pHYs chunk (pixels per metre -> dots per inch)."""
    import struct

    at = data.index(b"pHYs")
    per_metre = struct.unpack(">I", data[at + 4:at + 8])[0]
    return per_metre * 0.0254


def test_regeneration_is_byte_identical_apart_from_the_date(report):
    root, _ = report
    first = (root / "leaderboard.md").read_text()
    produced = sorted([*(root / "figures").iterdir(), *root.glob("*.csv"), *root.glob("*.tex")])
    files = {p.name: p.read_bytes() for p in produced}
    (root / "figures" / "curves_tiny-bert_gone.png").write_bytes(b"stale")
    (root / "figures" / "curves_tiny-bert_gone.pdf").write_bytes(b"stale")
    second = build_report([root]).read_text()

    def undated(text):
        return [line for line in text.splitlines() if not line.startswith("Generated ")]

    assert undated(first) == undated(second)
    assert sum(line.startswith("Generated ") for line in first.splitlines()) == 1
    again = sorted([*(root / "figures").iterdir(), *root.glob("*.csv"), *root.glob("*.tex")])
    assert {p.name: p.read_bytes() for p in again} == files   # stale figures removed, the rest identical
    assert {"leaderboard.csv", "leaderboard.tex", "comparisons.csv"} <= set(files)


def write_single_seed(root: Path) -> Path:
    store = Store(root)
    for name, rec in [make_record("rte", "vanilla", 1, {"accuracy": 0.6}, hparams={"p": 0.1}),
                      make_record("rte", "scores_dropout", 1, {"accuracy": 0.9}, hparams={"p": 0.1})]:
        store.write(name, rec)
    return root


def test_short_commit_keeps_the_marks():
    from suite.report.header import short_commit
    assert short_commit("0123456789abcdef" * 2 + "01234567+installed+dirty") == "0123456789ab+installed+dirty"
    assert short_commit("f" * 40) == "f" * 12 and short_commit(None) is None


def test_single_seed_table(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")   # pins the date line too
    md = build_report([write_single_seed(tmp_path)], ReportOptions(figures=False)).read_text()
    assert "Generated 1970-01-01 00:00 UTC" in md
    from suite.report.header import short_commit
    from suite.run.device import git_commit
    code = short_commit(git_commit(excluded=()))   # the report's own code version, beside the runs' (Code version line)
    line = next(line for line in md.splitlines() if line.startswith("Generated "))
    assert line.endswith(f", report code `{code}`." if code else "(report code: not a git checkout).")
    board = parse_table(md, "### Leaderboard")
    assert board["vanilla"]["RTE"] == "60.00 ± – (1)" and board["scores_dropout"]["RTE"] == "**90.00 ± –** (1)"
    assert parse_table(md, "### Difference to `vanilla`")["scores_dropout"]["RTE"] == "undecided +30.00"  # n=1
    assert "Commands that produced the runs: not recorded" in md


def test_cli(tmp_path):
    from suite import commands

    main = commands.main

    root = write_single_seed(tmp_path / "grid")
    (root / "commands.txt").write_text("python -m suite run --methods vanilla --tasks rte --out synthetic\n")
    assert main(["report", str(root), "--out", str(tmp_path / "out"), "--alpha", "0.01"]) == 0
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "p < 0.01" in md and (tmp_path / "out" / "figures" / "curves_tiny-bert_rte.png").is_file()
    assert not (root / "leaderboard.md").exists()
    assert "python -m suite run --methods vanilla --tasks rte --out synthetic" in md
    assert main(["report", str(tmp_path / "nothing")]) == 2
    with pytest.raises(SystemExit) as refused:  # argparse refuses it, exit 2, before anything is read
        main(["report", str(root), "--alpha", "2"])
    assert refused.value.code == 2


def test_a_study_still_tuning_is_told_apart_from_an_empty_folder(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(ReportError, match=r"no readable run records in .*runs$"):
        build_report([tmp_path], ReportOptions(figures=False))
    Store(tmp_path / "tuning").write(*make_record("rte", "vanilla", 1, {"accuracy": 0.7}))
    with pytest.raises(ReportError, match=r"its tuning stage has 1 record\(s\): a study's final rounds start"):
        build_report([tmp_path], ReportOptions(figures=False))


def test_without_baseline_runs(tmp_path):
    store = Store(tmp_path)
    store.write(*make_record("rte", "scores_dropout", 1, {"accuracy": 0.7}, hparams={"p": 0.1}))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    assert "No `vanilla` runs for this model" in md
    assert parse_table(md, "### Leaderboard")["scores_dropout"]["RTE"] == "**70.00 ± –** (1)"


def test_the_setup_table_shows_the_train_subset_the_runs_could_draw(tmp_path):
    """train_eval_samples=512 on a training set of 64 evaluates 64: the table says 64, not the asked-for 512."""
    store = Store(tmp_path)
    for task, metrics, train in (("rte", {"accuracy": 0.7}, 64), ("mrpc", {"f1": 0.8, "accuracy": 0.6}, 1000)):
        name, rec = make_record(task, "vanilla", 1, metrics, hparams={"p": 0.1}, train={"train_eval_samples": 512})
        rec["data"] = {"train": train, "dev": {"": 100}, "train_subset": min(train, 512)}
        store.write(name, rec)
    setup = parse_table(build_report([tmp_path], ReportOptions(figures=False)).read_text(), "### Setup")
    assert setup["RTE"]["train_eval_samples"] == "64" and setup["MRPC"]["train_eval_samples"] == "512"


def test_two_models_and_runs_without_a_score(tmp_path):
    import suite.report as report_module

    store = Store(tmp_path)
    name, rec = make_record("stsb", "vanilla", 1, {"pearson": 0.5, "spearman": 0.5}, hparams={"p": 0.1})
    rec["final"] = {"pearson": float("nan"), "spearman": float("nan"), "score": float("nan")}  # constant predictions
    store.write(name, rec)
    other = "org/other-model"
    name, rec = make_record("stsb", "vanilla", 2, {"pearson": 0.7, "spearman": 0.7}, hparams={"p": 0.1})
    rec["config"]["model"] = other
    rec["hash"] = RunConfig.from_dict(rec["config"]).hash
    store.write("other.json", rec)
    md = build_report([tmp_path]).read_text()
    assert md.count("## Model `") == 2
    assert parse_table(md, "## Model `tiny-bert`")["vanilla"]["STS-B"] == "no score (1)"
    assert parse_table(md, "## Model `org/other-model`")["vanilla"]["STS-B"] == "**70.00 ± –** (1)"
    assert (tmp_path / "figures" / f"curves_{report_module.slug(other)}_stsb.png").is_file()


def test_a_task_run_only_with_other_hyper_parameters_is_listed_not_dropped(tmp_path):
    store = Store(tmp_path)
    store.write(*make_record("rte", "scores_dropout", 1, {"accuracy": 0.7}, hparams={"p": 0.1}))
    store.write(*make_record("mrpc", "scores_dropout", 1, {"f1": 0.8, "accuracy": 0.6}, hparams={"p": 0.2}))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    assert parse_table(md, "### Leaderboard")["scores_dropout"]["MRPC"] == "–"
    outside = parse_table(md, "## Runs outside the leaderboard settings")["tiny-bert"]
    assert outside["task"] == "MRPC" and outside["setting"] == "p=0.2" and outside["headline x100"] == "70.00 ± – (1)"


def test_data_efficiency_table_tests_and_figure(tmp_path):
    """Three train-set sizes of the leaderboard's settings: a table per task with paired differences to vanilla,
    Holm-corrected over the section, and a figure; a method run at one size only is left out of the curves."""
    store = Store(tmp_path)
    vanilla = {16: [0.50, 0.52, 0.54], 32: [0.55, 0.56, 0.57], 64: [0.60, 0.62, 0.64]}
    dropout = {16: [0.60, 0.63, 0.66], 32: [0.55, 0.57, 0.55], 64: [0.61, 0.62, 0.64]}
    for size in (16, 32, 64):
        for i, seed in enumerate((1, 2, 3)):
            train = {"max_train_samples": size}
            store.write(*make_record("rte", "vanilla", seed, {"accuracy": vanilla[size][i]}, hparams={"p": 0.1},
                                     train=train))
            store.write(*make_record("rte", "scores_dropout", seed, {"accuracy": dropout[size][i]},
                                     hparams={"p": 0.1}, train=train))
    store.write(*make_record("rte", "no_dropout", 1, {"accuracy": 0.6}))  # leaderboard size only: no curve
    md = build_report([tmp_path]).read_text()
    rows = parse_table(md, "### Data efficiency")
    assert set(rows) == {"vanilla", "scores_dropout"}
    assert rows["vanilla"]["16 examples"] == "52.00 ± 2.00 (3)"
    # paired differences by seed: +10/+11/+12, 0/+1/-2, +1/0/0; Holm over the three tests
    raw = [stats.ttest_rel(dropout[s], vanilla[s]).pvalue for s in (16, 32, 64)]
    order = sorted(range(3), key=lambda k: raw[k])
    holm, running = [0.0] * 3, 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[k]))
        holm[k] = running
    assert holm[0] < 0.05 < holm[1]
    assert rows["scores_dropout"]["16 examples"] == f"63.00 ± 3.00 (3) [**+11.00, p {holm[0]:.2g}**]"
    assert rows["scores_dropout"]["32 examples"] == f"55.67 ± 1.15 (3) [-0.33, p {holm[1]:.2g}]"
    assert "![dev score against training-set size](figures/data_efficiency_tiny-bert.png)" in md
    assert (tmp_path / "figures" / "data_efficiency_tiny-bert.png").is_file()


def test_reference_tasks_get_their_own_table_and_stay_out_of_comparisons(tmp_path):
    store = Store(tmp_path)
    base = {"majority": {"accuracy": 0.5, "score": 0.5}, "chance": {"accuracy": 0.5, "score": 0.5}}
    for i, seed in enumerate((1, 2, 3)):
        for method, acc in (("vanilla", [0.80, 0.82, 0.84]), ("scores_dropout", [0.81, 0.83, 0.85])):
            store.write(*make_record("sst2", method, seed, {"accuracy": acc[i]}, hparams={"p": 0.1}, baselines=base))
        store.write(*make_record("rte", "vanilla", seed, {"accuracy": [0.49, 0.51, 0.52][i]}, hparams={"p": 0.1},
                                 baselines=base))
    md = build_report([tmp_path], ReportOptions(figures=False, reference_tasks=["RTE"])).read_text()
    board = parse_table(md, "### Leaderboard")
    assert "RTE" not in board["vanilla"] and board["scores_dropout"]["GLUE avg"] == "**83.00**"  # comparable
    reference = parse_table(md, "### Reference tasks")
    assert reference["vanilla"]["RTE"] == "50.67 ± 1.53° (3)"  # not above the majority class's 50.00
    assert reference["*majority class / constant mean (baseline)*"]["RTE"] == "50.00"
    assert "## Runs outside the leaderboard settings" not in md
    # without the option RTE is a leaderboard column, and scores_dropout's average covers one of two tasks
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    assert "### Reference tasks" not in md and parse_table(md, "### Leaderboard")["vanilla"]["RTE"]
    # the reference's own evidence that it learned each task; RTE at chance says so
    p_sst2, p_rte = (stats.ttest_1samp(v, 50, alternative="greater").pvalue for v in ([80, 82, 84], [49, 51, 52]))
    # (records without prediction sidecars: the test is over seeds only, and the note says so)
    assert (f"SST-2 +32.00 (3 seeds, p = {p_sst2:.2g}, over seeds only); RTE +0.67 (3 seeds, p = {p_rte:.2g}, over "
            "seeds only) — not better at p < 0.05.") in unwrap_prose(md)
    with pytest.raises(ReportError, match="unknown task 'rtee'.*Did you mean 'rte'"):
        build_report([tmp_path], ReportOptions(figures=False, reference_tasks=["rtee"]))


def test_data_efficiency_at_fixed_optimizer_steps(tmp_path):
    """Sizes trained for more epochs the smaller they are (fixed optimizer steps) make one curve, the epochs in the
    headers; a size also run at another epoch count with fewer runs keeps the one with more."""
    store = Store(tmp_path)
    epochs = {16: 12, 32: 6, 64: 3}
    for size, e in epochs.items():
        for seed in (1, 2, 3):
            train = {"max_train_samples": size, "epochs": e}
            store.write(*make_record("rte", "vanilla", seed, {"accuracy": 0.5 + size / 1000 + seed / 100},
                                     hparams={"p": 0.1}, train=train))
    store.write(*make_record("rte", "vanilla", 1, {"accuracy": 0.9}, hparams={"p": 0.1},
                             train={"max_train_samples": 16, "epochs": 3}))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    rows = parse_table(md, "### Data efficiency")
    assert list(rows["vanilla"])[1:] == ["16 examples × 12 epochs", "32 examples × 6 epochs", "64 examples × 3 epochs"]
    assert rows["vanilla"]["16 examples × 12 epochs"] == "53.60 ± 1.00 (3)"


def test_data_efficiency_with_fixed_draws_pairs_runs_by_draw_and_seed(tmp_path):
    """A curve of two fixed data draws with two seeds each: each (draw, seed) is one paired unit (4 per size), and
    the leaderboard's own runs, drawn per seed, stay out of the curve even at a size the curve also ran."""
    store = Store(tmp_path)
    vanilla = {(0, 1): 0.50, (0, 2): 0.52, (1, 3): 0.60, (1, 4): 0.62}  # the draw moves both methods by 10 points
    dropout = {(0, 1): 0.51, (0, 2): 0.54, (1, 3): 0.61, (1, 4): 0.62}  # +1, +2, +1, 0
    for size in (16, 32, 64):
        for (draw, seed), v in vanilla.items():
            train = {"max_train_samples": size, "data_seed": draw}
            store.write(*make_record("rte", "vanilla", seed, {"accuracy": v}, hparams={"p": 0.1}, train=train))
            store.write(*make_record("rte", "scores_dropout", seed, {"accuracy": dropout[draw, seed]},
                                     hparams={"p": 0.1}, train=train))
    for seed in (1, 2, 3, 4, 5):  # the leaderboard: its own draw per seed
        for method in ("vanilla", "scores_dropout"):
            store.write(*make_record("rte", method, seed, {"accuracy": 0.9}, hparams={"p": 0.1},
                                     train={"max_train_samples": 32}))
    md = build_report([tmp_path], ReportOptions(figures=False)).read_text()
    rows = parse_table(md, "### Data efficiency")
    p = stats.ttest_1samp([1, 2, 1, 0], 0).pvalue
    assert rows["vanilla"]["32 examples"] == "56.00 ± 5.89 (4)"
    assert rows["scores_dropout"]["32 examples"].startswith("57.00 ± ") and "[+1.00, p " in rows["scores_dropout"][
        "32 examples"]
    holm_bound = min(1.0, 3 * p)
    shown = float(rows["scores_dropout"]["32 examples"].split("p ")[1].rstrip("]*"))
    assert shown == pytest.approx(holm_bound, rel=0.05)
    # the curve's runs are shown by the curve: they are no ablation of the leaderboard's setting
    assert "### Ablations" not in md and "Methods with several settings" not in md


def test_a_one_epoch_curve_tells_its_points_apart(tmp_path, monkeypatch):
    """One epoch: dev, train subset and the reference are one point each at x = 1; each gets its own marker and
    place, and the legend shows the markers."""
    import suite.report.figures as figures

    drawn = {}
    monkeypatch.setattr(figures, "save", lambda fig, path: drawn.setdefault(path.name, fig))
    store = Store(tmp_path)
    for method in ("vanilla", "scores_dropout"):
        for s in (1, 2):
            store.write(*make_record("rte", method, s, {"accuracy": 0.6 + s / 100}, hparams={"p": 0.1},
                                     train={"epochs": 1}))
    build_report([tmp_path], ReportOptions(aso=False))
    fig = drawn["curves_tiny-bert_rte.png"]
    panel = next(ax for ax in fig.axes if ax.get_title() == "scores_dropout")
    points = {line.get_marker(): float(line.get_xdata()[0]) for line in panel.get_lines()
              if line.get_marker() not in ("None", None, "", "_") and len(line.get_xdata()) == 1}
    assert set(points) == {"o", "s", "D"}, points          # dev, train subset, reference
    assert len(set(points.values())) == 3 and all(abs(x - 1) < 0.2 for x in points.values())
    legend = {h.get_label(): h.get_marker() for h in fig.legends[0].legend_handles if hasattr(h, "get_marker")}
    assert legend["dev"] == "o" and legend["fixed train subset"] == "s" and legend["vanilla: dev (reference)"] == "D"


def test_a_baseline_far_from_the_seeds_is_named_at_the_edge_and_a_near_one_drawn():
    """The seed strips keep the seeds' spread readable: a majority class 80 points below every seed (STS-B's constant
    predictor) becomes its value at the panel's edge, and the axis stays on the seeds; one beside them is a line."""
    import numpy as np

    from suite.report.figures import mark_baseline, pyplot

    plt = pyplot()
    fig, (far_ax, near_ax) = plt.subplots(1, 2)
    scores = np.array([84.5, 85.2, 85.9, np.nan])
    assert mark_baseline(far_ax, 0.0, scores)
    low, high = far_ax.get_xlim()
    assert 83 < low < 84.5 and 85.9 < high < 87.5
    assert [t.get_text() for t in far_ax.texts] == ["← 0.0"] and not far_ax.lines
    assert not mark_baseline(near_ax, 83.0, scores)
    assert not near_ax.texts and near_ax.lines[0].get_xdata()[0] == 83.0
    plt.close(fig)
