"""The accumulated-reward statistics of the AttendOut placebo experiment, against hand-computed values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lab.attendout import accumulated as acc
from lab.attendout import report


def test_block_sums_drop_the_partial_block():
    assert acc.block_sums([1, 2, 3, 4, 5, 6, 7], 3).tolist() == [6.0, 15.0]
    assert acc.block_sums([1, 2, 3], 1).tolist() == [1.0, 2.0, 3.0]


def test_std_ratio_by_hand():
    # population stds: [1, 3] -> 1; [0, 4] -> 2
    assert acc.std_ratio([1.0, 3.0], [0.0, 4.0]) == pytest.approx(0.5)
    assert acc.std_ratio([1.0, 2.0], [5.0, 5.0]) == math.inf


def test_summarize_sums_blocks_and_brackets_the_ratio():
    rng = np.random.default_rng(1)
    steps = [{"first_order_batch": float(a), "first_order_rloo_batch": float(b), "noise": float(c)}
             for a, b, c in rng.normal(size=(40, 3)) * [2.0, 1.0, 1.0]]
    out = acc.summarize(steps, [4, 8])
    signal4 = [sum(s["first_order_batch"] for s in steps[i:i + 4]) for i in range(0, 40, 4)]
    noise4 = [sum(s["noise"] for s in steps[i:i + 4]) for i in range(0, 40, 4)]
    row = out["first_order_batch"]["4"]
    assert row["n"] == 10 and out["first_order_batch"]["8"]["n"] == 5 and out["first_order_batch"]["1"]["n"] == 40
    assert row["snr"] == pytest.approx(np.std(signal4) / np.std(noise4))
    assert row["signal_mean"] == pytest.approx(np.mean(signal4))
    assert row["snr_low"] <= row["snr"] <= row["snr_high"]


def test_report_renders_the_accumulated_section_and_verdict():
    summary = {"first_order_batch": {k: {"signal_std": 1.0, "noise_std": 1.0, "snr": snr, "snr_low": low,
                                         "snr_high": high, "signal_mean": 0.0, "n": n}
                                     for k, snr, low, high, n in (("1", 1.1, 0.9, 1.3, 16), ("4", 2.0, 1.2, 3.0, 4))}}
    meta = {"command": "python x --only-snr", "machine": "cpu", "load": "1.0", "date": "d", "wall_s": 60.0}
    lines = report._accumulated_lines({"summary": summary, "meta": meta, "steps": [{}] * 16}, "{:.3g}".format)
    text = "\n".join(lines)
    assert "`python x --only-snr`" in text and "| first_order_batch | 4 | 1 | 1 | 2.00 | 1.20–3.00 | 0 | 4 |" in text
    assert "Largest accumulated SNR: 2.00 (first_order_batch, k=4" in text
    assert "Interval wholly above 1: first_order_batch k=4." in text
