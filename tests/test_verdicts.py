"""A report built from synthetic records with planted effects and per-example prediction sidecars reads all four
verdicts correctly: planted +2 points -> better, -2 -> worse, 0 with tight spread -> equivalent (margin 1), 0 with
noisy seeds -> undecided, and 0 in the population whose dev set happens to favour it by 1.5 points -> undecided
(over seeds alone it would read "better": the dev examples are the larger noise there)."""
from __future__ import annotations

import numpy as np
import pytest
from test_report import comparison_rows, make_record, parse_table

from suite.grid.store import Store
from suite.report import ReportOptions, build_report
from suite.run.record import save_predictions

N = 2000          # dev examples
SEEDS = (1, 2, 3, 4, 5)


def flip(right: np.ndarray, rng, to_right: int, to_wrong: int) -> np.ndarray:
    """`to_right` wrong examples made right and `to_wrong` right examples made wrong, chosen at random."""
    out = right.copy()
    wrong_idx, right_idx = np.flatnonzero(~right), np.flatnonzero(right)
    out[rng.choice(wrong_idx, to_right, replace=False)] = True
    out[rng.choice(right_idx, to_wrong, replace=False)] = False
    return out


def planted(root, rng) -> None:
    labels = rng.integers(0, 2, N)
    base = rng.random(N) < 0.8
    # each method's right/wrong examples before seed noise: the planted effect on this dev set
    shifted = {"vanilla": base, "plus_two": flip(base, rng, 40, 0), "minus_two": flip(base, rng, 0, 40),
               "tight_zero": base, "noisy_zero": base, "dev_luck": flip(base, rng, 330, 300)}
    # a seed's own luck: about 10 examples flipped each way (sd 0.2 points), or a whole shift for noisy_zero
    noisy = dict(zip(SEEDS, (100, -80, 60, -100, 20)))    # points x 20 (N / 100): mean 0, sd 4.4 points
    store = Store(root)
    store.runs.mkdir(parents=True, exist_ok=True)
    for method, right in shifted.items():
        for s in SEEDS:
            seed_rng = np.random.default_rng(1000 * s + len(method))
            if method == "noisy_zero":
                run = flip(right, seed_rng, max(noisy[s], 0), max(-noisy[s], 0))
            else:
                run = flip(right, seed_rng, seed_rng.poisson(10), seed_rng.poisson(10))
            name, rec = make_record("sst2", method, s, {"accuracy": float(run.mean())},
                                    hparams={"p": 0.1} if method == "vanilla" else None)
            sidecar = name.replace(".json", ".predictions.npz")
            pred = np.where(run, labels, 1 - labels)
            save_predictions(store.runs / sidecar, {"": {"index": np.arange(N), "label": labels,
                                                          "logits": np.eye(2)[pred].astype(np.float32)}})
            rec["predictions"] = sidecar
            store.write(name, rec)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    planted(root, np.random.default_rng(0))
    return root


def verdicts(md: str) -> dict[str, str]:
    return {m: r["verdict"] for (m, t), r in comparison_rows(md).items() if t == "SST-2"}


def test_planted_effects_read_as_all_four_verdicts(grid):
    md = build_report([grid], ReportOptions(aso=False, figures=False, out=grid / "report")).read_text()
    assert verdicts(md) == {"plus_two": "better", "minus_two": "worse", "tight_zero": "equivalent",
                            "noisy_zero": "undecided", "dev_luck": "undecided"}
    cells = parse_table(md, "### Difference to `vanilla`")
    assert cells["plus_two"]["SST-2"].startswith("better +") and cells["minus_two"]["SST-2"].startswith("worse -")
    rows = comparison_rows(md)
    assert abs(float(rows["plus_two", "SST-2"]["Δ"]) - 2) < 0.5
    assert abs(float(rows["minus_two", "SST-2"]["Δ"]) + 2) < 0.5
    assert rows["noisy_zero", "SST-2"]["seeds needed"] != "–" and rows["plus_two", "SST-2"]["seeds needed"] == "–"


def test_seed_only_variance_would_call_the_dev_set_luck_better(grid, monkeypatch):
    """The check above can fail: without the dev-example part (the quick-preset study's procedure) the dev set's luck
    reads as a real improvement."""
    import suite.stats.evidence as evidence

    monkeypatch.setattr(evidence, "split_variance", lambda *a, **k: (0.0, 0.0))
    md = build_report([grid], ReportOptions(aso=False, figures=False, out=grid / "seed_only")).read_text()
    assert verdicts(md)["dev_luck"] == "better"


def test_primary_comparisons_are_one_holm_family_and_the_rest_benjamini_hochberg(grid):
    import pandas as pd
    from scipy import stats
    from statsmodels.stats.multitest import multipletests

    out = grid / "primary"
    build_report([grid], ReportOptions(aso=False, figures=False, out=out, primary=("plus_two:sst2", "minus_two"),
                                       margin=0.5))
    rows = pd.read_csv(out / "comparisons.csv")
    primary = rows[rows["family"] == "primary"].sort_values(["method", "column"])
    # a method named primary covers its tasks; its GLUE average is exploratory unless named
    assert sorted(zip(primary["method"], primary["column"])) == [("minus_two", "sst2"), ("plus_two", "sst2")]
    assert primary["p_adj"].to_numpy() == pytest.approx(multipletests(primary["p"], method="holm")[1], rel=1e-4)
    rest = rows[rows["family"] == "exploratory"].sort_values(["method", "column"])
    assert len(rest) == 8 and ("minus_two", "GLUE avg") in set(zip(rest["method"], rest["column"]))
    assert rest["p_adj"].to_numpy() == pytest.approx(stats.false_discovery_control(rest["p"], method="bh"), rel=1e-4)
    assert set(rows["margin"]) == {0.5}


def test_differences_without_any_spread_are_never_shown_equivalent():
    """Three seeds that tie exactly (accuracy on a small dev set, no prediction sidecars) have a standard error of 0;
    TOST then read any difference inside the margin as proven equivalent (p_equiv 0)."""
    from suite.stats.evidence import Evidence, evidence_arrays, verdict

    arr = evidence_arrays(np.array([0.36, 0.36, 0.36]), 0.0, margin=1.0)
    assert np.isnan(arr["p_equiv"]) and np.isnan(arr["p"])
    ev = Evidence(3, *(float(arr[k]) for k in ("diff", "se", "df", "low", "high", "p", "p_equiv")), margin=1.0)
    assert verdict(ev, 0.05) == "undecided"
