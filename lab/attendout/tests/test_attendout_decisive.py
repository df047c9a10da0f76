"""The decisive designs' analysis (lab/attendout/decisive*.py) on synthetic endpoints: kappa is
recovered, B's horizon has the registered power at kappa's estimate, and the tests decide as registered."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lab.attendout import decisive as dc
from lab.attendout import decisive_report as dr


def run(arm: str, seed: int, change: float) -> dict:
    layers = [0.1] * 6
    end = list(layers)
    end[dc.LAYER] += change
    return {"arm": arm, "seed": seed, "probes": [{"reference": layers}, {"reference": end}]}


def test_kappa_is_the_paired_drift_per_update_per_unit_c():
    design, n = dc.DESIGNS["kappa"], 100
    noise = [0.01, -0.02, 0.015]
    runs = [run("planted", s, 0.02 * design.c * n + e) for s, e in enumerate(noise)]
    runs += [run("placebo", s, e) for s, e in enumerate(noise)]  # the same noise: the pair differences are exact
    k = dc.kappa(runs, design, n)
    assert k["kappa"] == pytest.approx(0.02) and k["kappa_se"] == pytest.approx(0, abs=1e-12)
    assert k["s"] == pytest.approx(np.std(noise, ddof=1) / 10)
    h = dc.b_horizon(k)
    assert h["n_chosen"] % 10 == 0 and dc.B_BOUNDS[0] <= h["n_chosen"] <= dc.B_BOUNDS[1]
    assert h["power_at_chosen"]["real_two_sided"] == pytest.approx(0.8, abs=0.02)  # rounded up to 10 updates


def test_no_drift_sizes_nothing():
    design = dc.DESIGNS["kappa"]
    runs = [run(a, s, e) for a in ("planted", "placebo") for s, e in enumerate([0.001, -0.001, 0.0])]
    runs[0]["probes"][1]["reference"][dc.LAYER] -= 0.01  # planted below placebo: kappa < 0
    assert dc.b_horizon(dc.kappa(runs, design, 100))["n_chosen"] is None


def test_registered_tests_decide_as_written():
    rng = np.random.default_rng(0)
    learned = {"planted": {s: 0.05 + 0.01 * rng.standard_normal() for s in range(5)},
               "placebo": {s: 0.01 * rng.standard_normal() for s in range(5)}}
    assert dr.test_a(learned)["control_learned"]
    assert not dr.test_a({"planted": learned["placebo"], "placebo": learned["placebo"]})["control_learned"]
    b = {"real": {s: 0.01 * rng.standard_normal() for s in range(10)},
         "planted": {s: 0.001 * rng.standard_normal() for s in range(10)},
         "placebo": {s: 0.01 * rng.standard_normal() for s in range(3)}}
    assert dr.test_b(b)["decision"].startswith("undecided")


def write_runs(folder, runs):
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))


def test_real_forms_decide_against_their_own_placebo_with_holm(tmp_path):
    """A_real is read against design A's placebo, rloo2 against its own; Holm runs over the two forms once both are
    in; a clear drift is 'moved', a flat real arm is 'equivalent' within the margin, and a missing run leaves the
    family undecided."""
    noise = [0.004, -0.003, 0.002, -0.001, 0.0]
    write_runs(tmp_path / "A", [run("placebo", s, e) for s, e in enumerate(noise)])
    write_runs(tmp_path / "A_real", [run("real", s, 0.03 + e * 1.5) for s, e in enumerate(noise)])
    rloo = [run("real", s, -e) for s, e in enumerate(noise)] + [run("placebo", s, e) for s, e in enumerate(noise)]
    write_runs(tmp_path / "rloo2", rloo[:-1])
    assert dr.test_real_forms(tmp_path)["complete"] is False  # rloo2's placebo seed 4 missing
    (tmp_path / "rloo2" / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rloo))
    family = dr.test_real_forms(tmp_path)
    a, r = family["forms"]["A_real"], family["forms"]["rloo2"]
    assert family["complete"] and a["moved"] and not a["equivalent"] and a["mean_diff"] == pytest.approx(0.0302)
    assert r["equivalent"] and not r["moved"] and r["mean_diff"] == pytest.approx(-0.0008)
    assert a["p_holm"] == pytest.approx(min(1.0, 2 * a["p"]))  # the smaller p is doubled
    assert "more drop" in a["decision"] and "less than" in r["decision"]
