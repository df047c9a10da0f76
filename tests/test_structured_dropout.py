"""DropHead and DropAttention(c) on random padded batches: whole heads / whole key columns dropped at rate p and
rescaled or renormalised, schedules, the all-dropped guard, and the probe path equal to the fused path."""
import pytest
import torch
import torch.nn.functional as F
from attention_inputs import H, attached_method, padded_qkv, padding_weight, run_attention

import suite
from suite.api.attention import HyperParameterError


def _many(b=2000, length=5):
    return padded_qkv(dtype=torch.float32, lengths=[length - (i % 3) for i in range(b)], length=length)


def test_drophead_drops_whole_heads_at_rate_p_and_rescales():
    method, module, _ = attached_method("drophead", dtype=torch.float32, training=True, p=0.3)
    q, k, v, mask, _ = _many()
    torch.manual_seed(0)
    out, _ = run_attention(method, module, q, k, v, mask)
    module.eval()
    ref, _ = run_attention(method, module, q, k, v, mask)
    ratio = (out / ref).transpose(1, 2)  # (B, H, L, d): one factor per sample and head
    factor = ratio[..., 0, 0]
    assert torch.allclose(ratio, factor[..., None, None].expand_as(ratio), atol=1e-4)
    kept = factor != 0
    assert kept.any(1).all()
    torch.testing.assert_close(factor[kept], (H / kept.sum(1, keepdim=True).float()).expand_as(factor)[kept])
    assert (~kept).float().mean().item() == pytest.approx(0.3, abs=0.015)


def test_drophead_schedules():
    from suite.methods.structured_dropout import scheduled_rate

    assert [scheduled_rate(0.2, "linear", t) for t in (0, 0.5, 1)] == pytest.approx([0.2, 0.1, 0.0])
    assert [scheduled_rate(0.2, "v", t) for t in (0, 0.25, 0.5, 1)] == pytest.approx([0.2, 0.1, 0.0, 0.2])
    assert scheduled_rate(0.2, "constant", 0.7) == 0.2
    ctx = type("Ctx", (), {"total_steps": 11, "step": 0})()
    method = suite.METHODS.get("drophead")(suite.METHODS.get("drophead").Config(p=0.2, schedule="linear"))
    method.setup_training(ctx)
    rates = []
    for step in range(1, 12):
        ctx.step = step
        rates.append(method.rate())
    assert rates[0] == pytest.approx(0.2) and rates[5] == pytest.approx(0.1) and rates[-1] == pytest.approx(0.0)
    cls = suite.METHODS.get("drophead")
    with pytest.raises(HyperParameterError):
        cls(cls.Config(schedule="cosine"))


def test_drophead_default_is_the_papers_v_turning_at_the_end_of_the_warm_up():
    """Scheduled DropHead: p down to 0 over the learning rate's warm-up, then linearly back up to p at the end."""
    from suite.methods.structured_dropout import scheduled_rate

    assert suite.METHODS.get("drophead").Config().schedule == "scheduled"
    assert [scheduled_rate(0.2, "scheduled", t, 0.2) for t in (0, 0.1, 0.2, 0.6, 1)] == pytest.approx(
        [0.2, 0.1, 0.0, 0.1, 0.2])
    assert scheduled_rate(0.2, "scheduled", 0, 0) == 0.2  # no warm-up: p at the start, then rising from 0
    ctx = type("Ctx", (), {"total_steps": 11, "warmup_steps": 2, "step": 0})()
    method = suite.METHODS.get("drophead")(suite.METHODS.get("drophead").Config(p=0.2))
    method.setup_training(ctx)
    rates = []
    for step in range(1, 12):
        ctx.step = step
        rates.append(method.rate())
    # step 3 is the first at the warm-up's peak learning rate (steps 1 and 2 warm up)
    assert rates[0] == pytest.approx(0.2) and rates[2] == pytest.approx(0.0) and rates[-1] == pytest.approx(0.2)
    assert rates[1] == pytest.approx(0.1) and rates[6] == pytest.approx(0.1)


def _col_probs(p, seed=0, **kw):
    method, module, _ = attached_method("dropattention_col", dtype=torch.float32, training=True, p=p)
    seen = []
    module.suite_probe = lambda m, probs: seen.append(probs.detach())
    q, k, v, mask, valid = _many(**kw)
    torch.manual_seed(seed)
    out, probs = run_attention(method, module, q, k, v, mask)
    module.eval()
    _, ref = run_attention(method, module, q, k, v, mask)
    return probs, ref, valid, out, (method, module, q, k, v, mask)


def test_dropattention_col_drops_columns_and_renormalises_rows():
    probs, ref, valid, out, _ = _col_probs(0.3)
    assert torch.isfinite(out).all() and (padding_weight(probs, valid) == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    kept = probs > 0
    assert (kept == kept[:, :, :1, :]).all()  # whole columns: the same keys for every query of a (sample, head)
    renorm = ref * kept / (ref * kept).sum(-1, keepdim=True)
    torch.testing.assert_close(probs, renorm)
    valid_cols = valid[:, None, :].expand(-1, H, -1)
    dropped = (~kept[:, :, 0, :] & valid_cols).sum() / valid_cols.sum()
    assert dropped.item() == pytest.approx(0.3, abs=0.02)  # few rows hit the all-dropped guard at this length


def test_dropattention_col_guard_keeps_rows_finite_when_everything_is_dropped():
    probs, ref, valid, out, (method, module, q, k, v, mask) = _col_probs(0.95, length=3)
    assert torch.isfinite(out).all() and torch.isfinite(probs).all() and (padding_weight(probs, valid) == 0).all()
    module.train()
    del module.suite_probe  # the fused path too: an all-False row would make SDPA return NaN
    assert torch.isfinite(run_attention(method, module, q, k, v, mask)[0]).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:-1]))
    full = (probs > 0).sum(-1) == valid.sum(-1)[:, None, None]
    assert full.any()  # the fall-back to all valid keys did happen here


@pytest.mark.parametrize("name, p, seed", [("drophead", 0.5, 1), ("dropattention_col", 0.4, 3)])
def test_structured_dropout_probe_path_equals_fused_path_and_eval_is_identity(name, p, seed):
    method, module, _ = attached_method(name, dtype=torch.float32, training=True, p=p)
    q, k, v, mask, _ = padded_qkv(dtype=torch.float32)
    torch.manual_seed(seed)
    fused, _ = run_attention(method, module, q, k, v, mask)
    module.suite_probe = lambda m, p: None
    torch.manual_seed(seed)
    explicit, _ = run_attention(method, module, q, k, v, mask)
    torch.testing.assert_close(explicit, fused)
    module.eval()
    plain = F.scaled_dot_product_attention(q, k, v, attn_mask=mask == 0).transpose(1, 2)
    torch.testing.assert_close(run_attention(method, module, q, k, v, mask)[0], plain)


def test_the_runners_context_carries_the_warm_up_drophead_turns_at():
    from suite.run.settings import TrainSettings
    from suite.run.training import build_context
    from suite.testing import tiny_model

    model = tiny_model("bert")
    method = suite.METHODS.get("drophead")()
    method.attach(model)
    ctx = build_context(model, method, TrainSettings(warmup_ratio=0.1), 50, torch.device("cpu"), None)
    assert ctx.warmup_steps == 5 and method._turn == pytest.approx(5 / 49)
