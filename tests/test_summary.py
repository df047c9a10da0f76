"""The compact leaderboard `run` prints, on synthetic records whose means, sample stds and differences are computed
by hand below."""
from __future__ import annotations

from suite.grid.summary import DASH, compact_leaderboard, grid_records
from suite.report.selection import setting_text
from suite.run.record import RunRecord
from suite.run.record_parts import Baselines, Metrics

TRAIN = {"epochs": 3, "lr": 1e-4, "batch_size": 32, "max_train_samples": 1000}


def record(task: str, method: str, seed: int, score: float | None, *, majority: float | None = None,
           status: str = "ok", train: dict | None = None, hparams: dict | None = None) -> RunRecord:
    rec = RunRecord({"model": "minilm", "task": task, "method": method, "hparams": hparams or {}, "seed": seed,
                     "train": {**TRAIN, **(train or {})}, "data_source": "local"}, f"{task}{method}{seed}",
                    f"{task}/{method}/seed{seed}", status,
                    final=Metrics.from_json({} if score is None else {"score": score}))
    if majority is not None:
        rec.baselines = Baselines.from_json({"majority": {"accuracy": majority, "score": majority},
                                             "chance": {"score": 0.5}})
    return rec


def rows(text: str) -> dict[str, list[str]]:
    """Table body as {row name: cells}."""
    out = {}
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|--") and not line.startswith("| method"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def grid() -> list[RunRecord]:
    recs = []
    # SST-2: vanilla 0.80, 0.82, 0.84 -> mean 82.0, sample std 2.0; uniform 0.70, 0.71, 0.75 -> mean 72.0,
    # std sqrt(((-2)^2 + (-1)^2 + 3^2) / 2) = sqrt(7) = 2.6458 -> 2.6; difference 72.0 - 82.0 = -10.0.
    for seed, (v, u) in enumerate([(0.80, 0.70), (0.82, 0.71), (0.84, 0.75)], start=1):
        recs.append(record("sst2", "vanilla", seed, v, majority=0.509))
        recs.append(record("sst2", "uniform", seed, u, majority=0.509))
    # CoLA: vanilla 0.20, 0.30 -> 25.0 ± 7.1 (std = 0.1 / sqrt(2) = 0.0707); uniform: one ok (0.10), one failed.
    recs += [record("cola", "vanilla", 1, 0.20, majority=0.0), record("cola", "vanilla", 2, 0.30, majority=0.0),
             record("cola", "uniform", 1, 0.10, majority=0.0),
             record("cola", "uniform", 2, None, majority=0.0, status="failed")]
    return recs


def test_cells_are_mean_std_and_difference_to_the_baseline():
    text = compact_leaderboard(grid(), out="runs")
    table = rows(text)
    # the grid's task order, display names
    assert [c.strip() for c in text.splitlines()[1].split("|")[2:4]] == ["SST-2", "CoLA"]
    assert table["vanilla"] == ["82.0 ± 2.0", "25.0 ± 7.1"]
    assert table["uniform"] == ["72.0 ± 2.6 (-10.0)", "10.0 (-15.0) 1/2 ok"]
    assert table["majority class"] == ["50.9 (-31.1)", "0.0 (-25.0)"]
    assert list(table) == ["vanilla", "uniform", "majority class"]
    assert text.rstrip().endswith("python -m suite report runs")


def test_other_baseline_and_missing_majority():
    recs = [record("mrpc", "uniform", 1, 0.70), record("mrpc", "scores_dropout", 1, 0.76)]
    table = rows(compact_leaderboard(recs, baseline="uniform"))
    assert table["uniform"] == ["70.0"]
    assert table["scores_dropout"] == ["76.0 (+6.0)"]
    assert table["majority class"] == [DASH]


def test_regression_uses_the_constant_mean_baseline():
    stsb = record("stsb", "vanilla", 1, 0.80)
    stsb.baselines = Baselines.from_json({"constant_mean": {"pearson": 0.0, "spearmanr": 0.0, "score": 0.0}})
    assert rows(compact_leaderboard([stsb]))["majority class"] == ["0.0 (-80.0)"]


def test_swept_settings_get_their_own_rows_and_matching_reference():
    recs = []
    for lr, v, s in [(1e-4, 0.80, 0.78), (2e-4, 0.90, 0.93)]:
        recs.append(record("sst2", "vanilla", 1, v, train={"lr": lr}, majority=0.5))
        recs.append(record("sst2", "scores_dropout", 1, s, train={"lr": lr}, hparams={"p": 0.1}, majority=0.5))
    table = rows(compact_leaderboard(recs))
    assert table["vanilla {lr=0.0001}"] == ["80.0"]
    assert table["scores_dropout {lr=0.0001}"] == ["78.0 (-2.0)"]
    assert table["scores_dropout {lr=0.0002}"] == ["93.0 (+3.0)"]
    assert table["majority class"] == ["50.0"]  # two vanilla rows: no single reference to subtract


def test_swept_hyper_parameter_is_named_in_the_row_as_the_report_names_it():
    recs = [record("rte", "vanilla", 1, 0.55),
            record("rte", "scores_dropout", 1, 0.50, hparams={"p": 0.1}),  # the default: the plain method's row
            record("rte", "scores_dropout", 1, 0.60, hparams={"p": 0.3}),
            record("rte", "entmax_alpha", 1, 0.70, hparams={"alpha_init": 2.0}),  # 2.0 and 2 are one setting
            record("rte", "entmax_alpha", 2, 0.80, hparams={"alpha_init": 2})]
    table = rows(compact_leaderboard(recs))
    assert table["scores_dropout"] == ["50.0 (-5.0)"]
    assert table["scores_dropout[p=0.3]"] == ["60.0 (+5.0)"]
    assert table["entmax_alpha[alpha_init=2]"] == ["75.0 ± 7.1 (+20.0)"]
    assert set(table) == {"vanilla", "scores_dropout", "scores_dropout[p=0.3]", "entmax_alpha[alpha_init=2]",
                          "majority class"}
    for rec in recs:  # the report's label for the same records: the same rule
        method, hp = rec.method, rec.hparams
        text = setting_text(hp, method)
        assert (f"{method}[{text}]" if text else method) in table


def test_an_uninstalled_method_names_every_hyper_parameter():
    table = rows(compact_leaderboard([record("rte", "gone_method", 1, 0.5, hparams={"k": 1.0, "mode": "x"})]))
    assert "gone_method[k=1,mode=x]" in table


def test_empty_and_grid_records():
    assert compact_leaderboard([]) == "no run records to summarise"

    class Job:
        def __init__(self, filename):
            self.filename = filename

    class Store:
        def read(self, filename):
            return {"a.json": {"config": {}}}.get(filename)

    assert grid_records([Job("a.json"), Job("missing.json")], Store()) == [{"config": {}}]


def test_a_reference_at_the_majority_class_is_warned_about():
    """MRPC at 128 examples: vanilla, a new method and the majority class all at 68.4: the table's +0.0 says
    nothing, and a line says the reference learned nothing; SST-2's vanilla, well above its majority, is not named."""
    recs = [record("mrpc", m, s, 0.684, majority=0.684) for m in ("vanilla", "gauss_noise") for s in (1, 2, 3)]
    recs += [record("sst2", "vanilla", s, 0.80 + s / 100, majority=0.509) for s in (1, 2, 3)]
    text = compact_leaderboard(recs)
    assert rows(text)["majority class"] == ["68.4 (+0.0)", "50.9 (-31.1)"]
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: the reference vanilla scores at the majority class on MRPC (68.4 vs 68.4, within "
                        "1 point): it learned nothing there, so every difference to it is one to a constant "
                        "predictor; train longer (--epochs) or on more examples (--max-train-samples)"]
    assert "warning" not in compact_leaderboard(grid())
