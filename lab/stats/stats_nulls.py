"""The rejection rates docs/statistics.md quotes: the comparison's test under a null built from the published
study's real predictions, and under the synthetic population of tests/test_stats_simulation.py, with the variance the
suite uses (the seeds' spread plus the dev-set part all seeds share) beside the whole dev-example variance used
before and, for the synthetic population, the seeds alone.

    python -m lab.stats.stats_nulls          (from the repository root; about a minute on 2 cores)

The two populations are the product tests' own (their draws, in their order), so the rates printed here are the ones
those tests assert; the test modules are loaded from their files (tests/ is no package), a use declared beside the
lab's other imports (tests/test_layout.py, LAB_MAY_IMPORT).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[2] / "tests"


def _test_module(name: str):
    """One of the product's test modules, loaded from its file without putting tests/ on sys.path."""
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


real = _test_module("test_stats_real_null")
synthetic = _test_module("test_stats_simulation")


def real_null(sims: int = 8000) -> None:
    print("null built from real predictions: rejection rate at alpha 5% (suite / whole example variance)")
    for pair in real.PAIRS:
        cells = []
        for n in (5, 10, 20):
            d, shared, whole = real.simulate(*pair, n, sims, np.random.default_rng(7 + n))
            calibration = float(np.mean(d.var(axis=1, ddof=1) / n + shared) / d.mean(axis=1).var())
            cells.append(f"{n} seeds {100 * real.rate(d, shared):.1f}% / {100 * real.rate(d, whole):.1f}% "
                         f"(mean se^2 / var of the mean {calibration:.3f})")
        print(f"  {pair[0]} {pair[1]} vs {pair[2]}: " + "; ".join(cells))


def synthetic_population() -> None:
    print("synthetic population: rejection rate at alpha 5% (suite / whole example variance / seeds only)")
    for noise, (seed_sd, tau) in synthetic.NOISE.items():
        for collapse in (0.0, 0.2):
            cells = []
            for seeds in (3, 5, 10, 20):
                rng = np.random.default_rng(seeds * 10 + int(collapse * 10))
                for name, (sd, t) in synthetic.NOISE.items():   # the test's own draws, in its order
                    d, v, right = synthetic.simulate(rng, synthetic.SIMS, seeds, sd, t, collapse=collapse)
                    if name == noise:
                        rates = (synthetic.rejection_rate(d, v),
                                 synthetic.rejection_rate(d, synthetic.example_parts(right)[0]),
                                 synthetic.rejection_rate(d, 0.0))
                cells.append(f"{seeds}: " + " / ".join(f"{100 * r:.1f}" for r in rates) + "%")
            print(f"  {noise} dominate, {collapse:.0%} collapsed: " + "; ".join(cells))


if __name__ == "__main__":
    real_null()
    synthetic_population()
