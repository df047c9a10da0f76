"""The placebo-log measurement (lab/attendout/placebo_log.py): its statistics tell a reward that follows
the sample (G's expected share) from one that follows the mask's own draw, the K = 1 and K = 8 forms agree when the
units are exchangeable, and on a tiny model its `logged` statistic is exactly what `longhorizon.ShareLog` logs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import get_constant_schedule

from lab.attendout import placebo_log as pl
from lab.attendout.longhorizon import ShareLog
from suite.api.attention import StepContext
from suite.methods.attendout import AttendOut, AttendOutConfig
from suite.testing import tiny_model

K, B, STEPS = 8, 16, 300


def units(rng, between: float, within: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """STEPS steps of (K, B) advantages, shares and expected shares: the advantage follows the sample's expected
    share with weight `between` and the mask's deviation from it with weight `within`."""
    expected = 0.1 + 0.01 * rng.standard_normal((STEPS, 1, B)).repeat(K, 1)
    deviation = 0.01 * rng.standard_normal((STEPS, K, B))
    z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
    adv = between * z(expected) + within * z(deviation) + rng.standard_normal((STEPS, K, B))
    return adv, (expected + deviation)[:, None], expected[:, None]


def test_a_reward_that_follows_the_sample_is_logged_but_not_centred():
    s = pl.summarise(*units(np.random.default_rng(0), between=0.5, within=0.0))
    assert s["steps"] == STEPS and s["K"] == K and s["B"] == B
    mean = {name: s[name]["mean"][0] for name in (*pl.STATISTICS, "k1_minus_k8")}
    assert mean["logged"] > 0.2 and mean["expected"] > 0.3 and mean["between"] > 0.3
    assert abs(mean["centred"]) < 0.02 and abs(mean["within"]) < 0.02
    assert abs(mean["k1_minus_k8"]) < 3 * s["k1_minus_k8"]["se"][0] + 0.01  # exchangeable units: the same in both


def test_a_reward_that_follows_the_draw_is_centred_and_within():
    s = pl.summarise(*units(np.random.default_rng(1), between=0.0, within=0.5))
    mean = {name: s[name]["mean"][0] for name in pl.STATISTICS}
    assert mean["centred"] > 0.3 and mean["within"] > 0.3 and mean["centred_k1"] > 0.3
    assert abs(mean["expected"]) < 0.02
    assert s["sd_expected_between_samples"][0] == pytest.approx(0.01, rel=0.1)
    assert s["sd_deviation"][0] == pytest.approx(0.01, rel=0.1)


def test_logged_is_share_logs_statistic_on_a_tiny_model():
    torch.manual_seed(0)
    model = tiny_model(seed=0)
    method = AttendOut(AttendOutConfig(mask_samples=3, placebo=True, cost_every=0))
    method.attach(model)
    layers = model.config.num_hidden_layers
    log, shares = pl.UnitLog(method), ShareLog(method, layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = StepContext(model, method, optimizer, get_constant_schedule(optimizer), torch.device("cpu"), None, 1.0,
                      total_steps=3)
    method.setup_training(ctx)
    model.train()
    g = torch.Generator().manual_seed(3)
    data = []
    for _ in range(4):
        mask = (torch.arange(12)[None] < torch.randint(5, 13, (6,), generator=g)[:, None]).long()
        data.append({"input_ids": torch.randint(3, model.config.vocab_size, (6, 12), generator=g) * mask,
                     "attention_mask": mask, "labels": torch.arange(6) % 2})
    for step in range(3):
        ctx.step = step + 1
        method.training_step(ctx, data[step], data[step + 1])
    assert len(log.adv) == len(shares.steps) == 3 and log.adv[0].shape == (3, 6)
    for t in range(3):
        logged = [pl.step_statistics(log.adv[t], log.share[t][layer], log.expected[t][layer])["logged"]
                  for layer in range(layers)]
        assert logged == pytest.approx(shares.steps[t], abs=1e-6)
        assert ((log.expected[t] > 0) & (log.expected[t] < method.cfg.p_max)).all()


def test_k1_alone_has_no_within_sample_statistics():
    adv, share, expected = units(np.random.default_rng(2), between=0.5, within=0.0)
    s = pl.summarise(adv[:, :1], share[:, :, :1], expected[:, :, :1])
    assert s["K"] == 1 and "within" not in s and "k1_minus_k8" not in s
    assert s["logged"]["mean"] == s["mask1"]["mean"] == s["logged_k1"]["mean"]
    assert s["expected"]["mean"][0] > 0.3 and abs(s["centred"]["mean"][0]) < 0.05


@pytest.mark.parametrize("between, within", [(0.5, 0.0), (0.0, 0.5)])
def test_the_additive_split_adds_up_to_logged_and_lands_in_the_right_part(between, within):
    adv, share, expected = units(np.random.default_rng(3), between=between, within=within)
    learnable, between_part = pl.additive_split(adv, share, expected)
    logged = [pl.step_statistics(adv[t], share[t, 0], expected[t, 0])["logged"] for t in range(STEPS)]
    assert learnable[:, 0] + between_part[:, 0] == pytest.approx(logged, abs=1e-12)
    big, small = (between_part, learnable) if between else (learnable, between_part)
    assert big[:, 0].mean() > 0.1 and abs(small[:, 0].mean()) < 0.02


def test_seeds_report_splits_each_run_and_reads_design_as_log(tmp_path):
    import json

    decisive = tmp_path / "decisive"
    (decisive / "A").mkdir(parents=True)
    folders = []
    for seed, between in enumerate((0.3, 0.4, 0.5)):
        adv, share, expected = units(np.random.default_rng(10 + seed), between=between, within=0.0)
        folder = tmp_path / "k1" / f"seed{seed}"
        folder.mkdir(parents=True)
        np.savez(folder / "units.npz", adv=adv[:, :1], share=share[:, :, :1], expected=expected[:, :, :1])
        (folder / "meta.json").write_text(json.dumps({"seed": seed, "arm": "placebo"}))
        folders.append(folder)
    runs = [{"arm": "placebo", "seed": 1, "mask_samples": 1, "g_updates": STEPS},
            {"arm": "placebo", "seed": 2, "mask_samples": 1, "g_updates": STEPS + 1}]  # another horizon: not beside
    (decisive / "A" / "runs.jsonl").write_text("".join(json.dumps(
        {**r, "adv_share_corr": {"mean": [0.0, 0.123], "se": [0.1, 0.1]}}) + "\n" for r in runs))
    text = pl.seeds_report(folders, decisive, layer=0)
    summary = json.loads((tmp_path / "k1" / "seeds_summary.json").read_text())
    runs = summary["runs"]
    assert [r["K"] for r in runs] == [1, 1, 1] and [r["design_a_logged"] for r in runs] == [None, 0.0, None]
    for r, folder in zip(runs, folders):
        saved = np.load(folder / "units.npz")
        logged = pl.summarise(saved["adv"], saved["share"], saved["expected"])["logged"]["mean"][0]
        assert r["logged"] == pytest.approx(logged, abs=1e-12)
        assert r["logged"] == pytest.approx(r["learnable"] + r["between"], abs=1e-12)
        assert r["between"] > 0.1 and abs(r["learnable"]) < 0.05
    across = summary["across"]
    assert across["between"]["low"] > 0 and across["between"]["p"] < 0.05
    assert "| between |" in text and "design A logged" in text


def test_a_smaller_last_batch_is_padded_and_read_over_its_own_rows():
    adv, share, expected = units(np.random.default_rng(4), between=0.3, within=0.3)
    rows = [B] * (STEPS - 1) + [5]  # an epoch's last batch: 5 rows
    steps = [(adv[t][..., :n], share[t][..., :n], expected[t][..., :n]) for t, n in enumerate(rows)]
    padded = [pl.stack_ragged([step[i] for step in steps]) for i in range(3)]
    assert padded[0].shape == adv.shape and np.isnan(padded[0][-1][..., 5:]).all()
    learnable, between = pl.additive_split(*padded)
    last = pl.additive_split(*(x[-1:][..., :5] for x in (adv, share, expected)))
    assert learnable[-1] == pytest.approx(last[0][0], abs=1e-12) and between[-1] == pytest.approx(last[1][0], abs=1e-12)
    logged = pl.step_statistics(adv[-1][..., :5], share[-1, 0][..., :5], expected[-1, 0][..., :5])["logged"]
    assert pl.corr(padded[0][-1], padded[1][-1, 0]) == pytest.approx(logged, abs=1e-12)
    assert learnable[-1, 0] + between[-1, 0] == pytest.approx(logged, abs=1e-12)
    s = pl.summarise(*padded)
    assert all(np.isfinite(s[name]["mean"][0]) for name in ("logged", "centred", "expected"))
    assert np.isfinite(s["sd_deviation"][0]) and np.isfinite(s["sd_expected_between_samples"][0])
