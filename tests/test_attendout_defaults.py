"""AttendOut's defaults follow the paper: one Attacker mask of G per batch against the Defender, vanilla
attention-probability dropout on the same batch and hidden-dropout draws. The older default (two masks of G and a
leave-one-out baseline) stays an option, and what ran it keeps its name: the committed records read back to their own
hashes, and a run at today's default hashes apart from one at the older default. (That the quick-preset study, which
pins the older setting, still plans every committed record: test_study.py.)"""
import dataclasses
import json
from pathlib import Path

import torch
from test_attendout import _attach, _batch, _ctx

from suite.methods.attendout import AttendOutConfig
from suite.run.settings import RunConfig, TrainSettings

ROOT = Path(__file__).resolve().parents[1]
OLDER_DEFAULT = {"baseline": "rloo", "mask_samples": 2}  # what the published records ran


def _job(hparams: dict) -> RunConfig:
    return RunConfig("minilm", "sst2", "attendout", hparams, 1, TrainSettings())


def test_the_default_is_one_attacker_mask_against_the_defender():
    assert (AttendOutConfig().baseline, AttendOutConfig().mask_samples) == ("defender", 1)
    model, method = _attach(cost_every=0)
    method.training_step(_ctx(model, method), _batch(seed=0), _batch(seed=1))
    r = method.last_reward
    assert r["rewards"].shape == (1, 4) and r["defender"].shape == (4,) and method.policy.updates == 1
    # the advantage is the Attacker's reward minus the Defender's, scaled by a positive running RMS
    assert torch.equal(torch.sign(r["advantages"][0]), torch.sign(r["rewards"][0] - r["defender"]))


def test_the_defender_sees_the_attackers_batch_and_hidden_dropout_draws():
    """A G that drops nothing against a Defender that drops nothing is one network twice on one batch: with the same
    hidden-dropout draws (hidden dropout 0.3 here) their first-order rewards agree, sample by sample."""
    model, method = _attach(model_kw={"hidden_dropout_prob": 0.3}, p_max=1e-9, p_init=5e-10, p_defender=0.0,
                            cost_every=0)
    method.training_step(_ctx(model, method), _batch(seed=0), _batch(seed=1))
    r = method.last_reward
    assert r["defender"].abs().min() > 0
    torch.testing.assert_close(r["rewards"][0], r["defender"], rtol=1e-3, atol=1e-3 * float(r["defender"].abs().max()))


def test_the_older_default_remains_an_option_with_its_own_hash():
    today = dataclasses.asdict(AttendOutConfig())
    older = today | OLDER_DEFAULT
    hashes = {_job(today).hash, _job(older).hash, _job(today | {"mask_samples": 2}).hash}
    assert len(hashes) == 3  # three configurations, three names
    read_back = RunConfig.from_dict(json.loads(json.dumps(_job(older).to_dict())))
    assert read_back.hparams == older and read_back.hash == _job(older).hash
    model, method = _attach(cost_every=0, **OLDER_DEFAULT)  # still trains: two masks of G against each other
    method.training_step(_ctx(model, method), _batch(seed=0), _batch(seed=1))
    assert method.last_reward["rewards"].shape == (2, 4) and method.last_reward["defender"] is None


def test_committed_records_ran_the_older_default_and_keep_their_hashes():
    paths = sorted(p for d in ("runs", "tuning/runs") for p in (ROOT / "results" / d).glob("*__attendout__*.json"))
    assert len(paths) >= 12
    today = {k: v for k, v in dataclasses.asdict(AttendOutConfig()).items() if k in OLDER_DEFAULT}
    for path in paths:
        rec = json.loads(path.read_text())
        job = RunConfig.from_dict(rec["config"])
        assert job.hash == rec["hash"] and path.name.endswith(f"__{rec['hash']}.json"), path.name
        assert {k: job.hparams[k] for k in OLDER_DEFAULT} == OLDER_DEFAULT, path.name
        assert dataclasses.replace(job, hparams=job.hparams | today).hash != rec["hash"], path.name
