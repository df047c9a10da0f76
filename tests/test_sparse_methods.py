"""ReLA, top-k, sparsemax / entmax15 / learned-alpha entmax against independent references on random padded
batches: forward, backward (float64 gradcheck), exact zeros on padding, finiteness in low precision; and every
sparse or structured-dropout method (DropHead, DropAttention(c): their own checks are in test_structured_dropout.py)
forward and backward through tiny BERT and RoBERTa models."""
import math

import pytest
import torch
from attention_inputs import LENGTHS, SPARSE, D, H, L, attached_method, padded_qkv, padding_weight, run_attention
from conftest import padded_batch, tiny_model
from entmax import entmax15, entmax_bisect, sparsemax

import suite
from suite.api.attention import HyperParameterError, attention_modules

# ------------------------------------------------------------------------------------------------------------
# Independent references, row by row on the truncated (unpadded) scores
# ------------------------------------------------------------------------------------------------------------

def _rows(q, k, lengths, row_fn):
    """Full (B, H, Lq, Lk) weights with row_fn(scores of the n valid keys, b, h) per row, zeros on padding."""
    out = torch.zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2], dtype=q.dtype)
    rows = []
    for b, n in enumerate(lengths):
        for h in range(q.shape[1]):
            s = q[b, h] @ k[b, h, :n].T * D ** -0.5
            w = torch.stack([row_fn(s[i], b, h) for i in range(s.shape[0])])
            rows.append(((b, h, n), w))
    return torch.stack([torch.cat([w, w.new_zeros(w.shape[0], k.shape[2] - n)], -1)
                        for (b, h, n), w in rows]).view_as(out)


def _context(weights, v):
    return (weights @ v).transpose(1, 2)  # (B, L, H, d)


def rela_reference(q, k, v, lengths, g, w, eps=1e-8):
    heads = []
    for b, n in enumerate(lengths):
        per_head = [torch.relu(q[b, h] @ k[b, h, :n].T * D ** -0.5) @ v[b, h, :n] for h in range(H)]
        heads.append(torch.cat(per_head, -1))                                            # (L, H*d)
    o = torch.stack(heads)
    y = g * o / torch.sqrt((o ** 2).mean(-1, keepdim=True) + eps) * torch.sigmoid(w * o)
    return y.view(len(lengths), -1, H, D)


def topk_row(s, k=None, k_frac=None):
    n = s.shape[0]
    kk = min(k, n) if k_frac is None else max(1, math.ceil(round(k_frac * n, 9)))
    t = torch.sort(s.detach(), descending=True).values[kk - 1]
    keep = s >= t
    return torch.where(keep, torch.softmax(s.masked_fill(~keep, -math.inf), -1), torch.zeros_like(s))


# ------------------------------------------------------------------------------------------------------------
# ReLA
# ------------------------------------------------------------------------------------------------------------

def test_rela_matches_formula_forward_and_backward():
    method, module, _ = attached_method("rela")
    with torch.no_grad():  # random scale and gate, so g and w really enter the comparison
        module.rela_scale.uniform_(0.5, 1.5)
        module.rela_gate.normal_()
    q, k, v, mask, valid = padded_qkv()
    out, weights = run_attention(method, module, q, k, v, mask)
    ref = rela_reference(q, k, v, LENGTHS, module.rela_scale, module.rela_gate)
    torch.testing.assert_close(out, ref)
    assert (padding_weight(weights, valid) == 0).all()
    ones = torch.ones((), dtype=weights.dtype)
    assert (weights >= 0).all() and not torch.allclose(weights.sum(-1), ones)  # rows are not normalised
    cot = torch.randn_like(out)
    grads = torch.autograd.grad((out * cot).sum(), [q, k, v, module.rela_scale, module.rela_gate])
    grads_ref = torch.autograd.grad((ref * cot).sum(), [q, k, v, module.rela_scale, module.rela_gate])
    for a, r in zip(grads, grads_ref):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradcheck(lambda q, k, v: run_attention(method, module, q, k, v, mask)[0], (q, k, v),
                                    fast_mode=True)


def test_rela_null_rows_are_zero_and_finite():
    method, module, _ = attached_method("rela")
    q, k, v, mask, valid = padded_qkv()
    with torch.no_grad():  # every key of batch 0 / head 1 points along +1, its queries along -1: no positive score
        k[0, 1] = k[0, 1].abs() + 0.1
        q[0, 1] = -(q[0, 1].abs() + 0.1)
    out, weights = run_attention(method, module, q, k, v, mask)
    assert (weights[0, 1] == 0).all() and torch.isfinite(out).all()
    assert (out[0, :, 1] == 0).all()  # the null head contributes nothing (the gate of 0 is 0 times 1/2)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_rela_parameters_are_added_per_layer_and_counted():
    model = tiny_model("bert")
    before = sum(p.numel() for p in model.parameters())
    suite.METHODS.get("rela")().attach(model)
    extra = sum(p.numel() for p in model.parameters()) - before
    assert extra == 2 * 32 * model.config.num_hidden_layers  # g and w per attention module
    assert all(torch.equal(m.rela_scale, torch.ones(32)) for m in attention_modules(model))
    bound = math.sqrt(3 / 32)
    assert all(m.rela_gate.abs().max() <= bound and m.rela_gate.std() > 0 for m in attention_modules(model))
    assert any("rela_gate" in k for k in model.state_dict())
    cls = suite.METHODS.get("rela")
    with pytest.raises(HyperParameterError):
        cls(cls.Config(g_init=0.0))


def test_rela_dropout_only_in_training():
    method, module, _ = attached_method("rela", training=True, p=0.5)
    q, k, v, mask, _ = padded_qkv()
    torch.manual_seed(0)
    _, w_train = run_attention(method, module, q, k, v, mask)
    module.eval()
    _, w_eval = run_attention(method, module, q, k, v, mask)
    kept = w_train != 0
    assert 0.3 < (kept.sum() / (w_eval != 0).sum()).item() < 0.7
    torch.testing.assert_close(w_train[kept], w_eval[kept] / 0.5)


# ------------------------------------------------------------------------------------------------------------
# Top-k
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hp", [{"k": 3}, {"k": 1}, {"k_frac": 0.5}, {"k_frac": 0.3}])
def test_topk_matches_formula_forward_and_backward(hp):
    method, module, _ = attached_method("topk", **hp)
    q, k, v, mask, valid = padded_qkv(seed=1)
    out, probs = run_attention(method, module, q, k, v, mask)
    ref_probs = _rows(q, k, LENGTHS, lambda s, b, h: topk_row(s, hp.get("k", 8), hp.get("k_frac")))
    torch.testing.assert_close(probs, ref_probs)
    torch.testing.assert_close(out, _context(ref_probs, v))
    assert (padding_weight(probs, valid) == 0).all()
    cot = torch.randn_like(out)
    g = torch.autograd.grad((out * cot).sum(), [q, k, v])
    g_ref = torch.autograd.grad((_context(ref_probs, v) * cot).sum(), [q, k, v])
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradcheck(lambda q, k, v: run_attention(method, module, q, k, v, mask)[0], (q, k, v),
                                    fast_mode=True)


# official ratio mode: k = max(lb, ceil(padded length / div)); the padded length here is L = 7
@pytest.mark.parametrize("hp, k_by_hand", [({"div": 4.0}, 2), ({"div": 4.0, "lb": 3}, 3), ({"div": 2.0}, 4),
                                           ({"div": 0.5}, 7)])
def test_topk_official_ratio_mode_matches_formula(hp, k_by_hand):
    method, module, _ = attached_method("topk", **hp)
    q, k, v, mask, valid = padded_qkv(seed=3)
    out, probs = run_attention(method, module, q, k, v, mask)
    ref_probs = _rows(q, k, LENGTHS, lambda s, b, h: topk_row(s, k_by_hand))
    torch.testing.assert_close(probs, ref_probs)
    torch.testing.assert_close(out, _context(ref_probs, v))
    assert (padding_weight(probs, valid) == 0).all()


def test_topk_official_ratio_k_depends_on_the_batch_padding():
    """The same 5-token row keeps ceil(7/2) = 4 keys in a batch padded to 7 and ceil(5/2) = 3 when alone."""
    method, module, _ = attached_method("topk", div=2.0)
    q, k, v, mask, _ = padded_qkv(seed=4)
    _, padded = run_attention(method, module, q, k, v, mask)
    _, alone = run_attention(method, module, q[1:2, :, :5], k[1:2, :, :5], v[1:2, :, :5], None)
    assert ((padded[1, :, :5] > 0).sum(-1) == 4).all() and ((alone[0] > 0).sum(-1) == 3).all()


def test_topk_keeps_ties_at_the_kth_value():
    method, module, _ = attached_method("topk", k=2)
    q = torch.ones(1, H, 1, D, dtype=torch.float64)
    k = torch.zeros(1, H, 5, D, dtype=torch.float64)
    k[..., 0, 0], k[..., 1, 0], k[..., 2, 0], k[..., 3, 0] = 3.0, 1.0, 1.0, -1.0  # scores 3, 1, 1, -1, 0
    _, probs = run_attention(method, module, q, k, torch.randn(1, H, 5, D, dtype=torch.float64), None)
    assert ((probs > 0).sum(-1) == 3).all()  # the top one and both tied at the 2nd value


def test_topk_with_k_at_least_the_length_equals_softmax_exactly():
    q, k, v, mask, _ = padded_qkv(dtype=torch.float32, seed=2)
    softmax = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + mask, -1, dtype=torch.float32)
    for hp in [{"k": 10 ** 6}, {"k": L}, {"k_frac": 1.0}, suite.METHODS.get("topk").identity]:
        method, module, _ = attached_method("topk", dtype=torch.float32, **hp)
        _, probs = run_attention(method, module, q, k, v, mask)
        assert torch.equal(probs, softmax), hp
    # k between a padded row's length and the full length: that row is plain softmax too
    method, module, _ = attached_method("topk", dtype=torch.float32, k=5)
    _, probs = run_attention(method, module, q, k, v, mask)
    assert torch.equal(probs[1:], softmax[1:]) and not torch.equal(probs[0], softmax[0])


@pytest.mark.parametrize("hp", [{"k": 0}, {"k": -3}, {"k": 2.5}, {"k_frac": 0.0}, {"k_frac": 1.5},
                                {"k_frac": float("nan")}, {"k_frac": -0.1}, {"p": 1.0}, {"div": 0.0},
                                {"div": -4.0}, {"div": float("inf")}, {"lb": 0}, {"div": 4.0, "lb": 1.5},
                                {"div": 4.0, "k_frac": 0.5}])
def test_topk_rejects_impossible_values(hp):
    cls = suite.METHODS.get("topk")
    with pytest.raises(HyperParameterError):
        cls(cls.Config(**hp))


# ------------------------------------------------------------------------------------------------------------
# sparsemax, entmax15, learned-alpha entmax
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fn", [("sparsemax", sparsemax), ("entmax15", entmax15)])
def test_entmax_family_matches_the_package_row_by_row(name, fn):
    method, module, _ = attached_method(name)
    q, k, v, mask, valid = padded_qkv(seed=3, spread=1.5)
    out, probs = run_attention(method, module, q, k, v, mask)
    ref_probs = _rows(q, k, LENGTHS, lambda s, b, h: fn(s, dim=-1))
    torch.testing.assert_close(probs, ref_probs)
    assert (padding_weight(probs, valid) == 0).all() and (probs == 0).any()  # padding and some valid keys exactly 0
    cot = torch.randn_like(out)
    g = torch.autograd.grad((out * cot).sum(), [q, k, v])
    g_ref = torch.autograd.grad((_context(ref_probs, v) * cot).sum(), [q, k, v])
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradcheck(lambda q, k, v: run_attention(method, module, q, k, v, mask)[0], (q, k, v),
                                    fast_mode=True)


def _alpha_module(**hp):
    method, module, model = attached_method("entmax_alpha", n_iter=50, **hp)
    with torch.no_grad():
        module.entmax_pre_alpha.copy_(torch.tensor([-2.0, -0.3, 0.4, 2.5]))
    return method, module, model


def test_entmax_alpha_matches_entmax_bisect_row_by_row_with_per_head_alpha():
    method, module, _ = _alpha_module()
    alpha = 1.01 + 0.99 * torch.sigmoid(module.entmax_pre_alpha)  # the documented map, written out
    assert len(set(alpha.tolist())) == H
    q, k, v, mask, valid = padded_qkv(seed=4, spread=1.5)
    out, probs = run_attention(method, module, q, k, v, mask)
    ref_probs = _rows(q, k, LENGTHS, lambda s, b, h: entmax_bisect(s, alpha=alpha[h], dim=-1, n_iter=50))
    torch.testing.assert_close(probs, ref_probs)
    assert (padding_weight(probs, valid) == 0).all()
    cot = torch.randn_like(out)
    g = torch.autograd.grad((out * cot).sum(), [q, k, v, module.entmax_pre_alpha])
    g_ref = torch.autograd.grad((_context(ref_probs, v) * cot).sum(), [q, k, v, module.entmax_pre_alpha])
    for a, r in zip(g, g_ref):
        torch.testing.assert_close(a, r)
    assert torch.autograd.gradcheck(lambda q, k, v: run_attention(method, module, q, k, v, mask)[0], (q, k, v),
                                    fast_mode=True)
    # the gradient with respect to the per-head parameter, against central differences
    loss = lambda: (run_attention(method, module, q, k, v, mask)[0] * cot).sum()  # noqa: E731
    eps = 1e-6
    for h in range(H):
        with torch.no_grad():
            module.entmax_pre_alpha[h] += eps
            up = loss()
            module.entmax_pre_alpha[h] -= 2 * eps
            down = loss()
            module.entmax_pre_alpha[h] += eps
        assert g[3][h].item() == pytest.approx(((up - down) / (2 * eps)).item(), rel=1e-4, abs=1e-7)


def test_entmax_alpha_at_one_and_a_half_is_entmax15():
    method, module, _ = attached_method("entmax_alpha", n_iter=50)  # alpha_init 1.5
    q, k, v, mask, _ = padded_qkv(seed=5, spread=1.5)
    _, probs = run_attention(method, module, q, k, v, mask)
    _, ref = run_attention(*attached_method("entmax15")[:2], q, k, v, mask)
    torch.testing.assert_close(probs, ref, atol=1e-9, rtol=1e-7)


def test_learned_alpha_stays_in_range_under_large_gradients():
    method, module, model = attached_method("entmax_alpha", dtype=torch.float32, training=True)
    q, k, v, mask, valid = padded_qkv(dtype=torch.float32, seed=6, spread=2.0)
    push = torch.tensor([1.0, -1.0, 1.0, -1.0]) * 1e4  # descend: heads 0, 2 pushed down, 1, 3 pushed up
    opt = torch.optim.Adam([module.entmax_pre_alpha], lr=1.0)
    for _ in range(200):
        opt.zero_grad()
        out, probs = run_attention(method, module, q.detach(), k.detach(), v.detach(), mask)
        alpha = method.alpha(module)
        (out.sum() + (push * alpha).sum()).backward()
        opt.step()
        assert torch.isfinite(out).all() and torch.isfinite(module.entmax_pre_alpha.grad).all()
    alpha = method.alpha(module)
    assert ((alpha > 1) & (alpha <= 2)).all()
    assert alpha[0] < 1.02 and alpha[2] < 1.02 and alpha[1] > 1.98 and alpha[3] > 1.98  # it really was pushed
    assert module.entmax_pre_alpha.abs().min() > 5  # the stored parameter is unconstrained
    out, probs = run_attention(method, module, q, k, v, mask)
    assert torch.isfinite(out).all() and (padding_weight(probs, valid) == 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))


def test_entmax_alpha_record_and_hyper_parameters():
    method, module, model = _alpha_module()
    rec = method.record()
    assert list(rec) == ["alpha"] and len(rec["alpha"]) == model.config.num_hidden_layers
    assert all(len(row) == H for row in rec["alpha"])
    expected = (1.01 + 0.99 * torch.sigmoid(module.entmax_pre_alpha)).tolist()
    assert rec["alpha"][0] == pytest.approx(expected, abs=1e-6)
    assert rec["alpha"][1] == pytest.approx([1.5] * H, abs=1e-6)  # layer 1 untouched: the initial alpha
    m2, mod2, _ = attached_method("entmax_alpha", alpha_init=1.2, alpha_lr_mult=10.0)
    assert m2.alpha(mod2).tolist() == pytest.approx([1.2] * H)
    assert mod2.entmax_pre_alpha.abs().max() < 1  # the multiplier scales the stored parameter down
    cls = suite.METHODS.get("entmax_alpha")
    for bad in [{"alpha_init": 1.0}, {"alpha_init": 2.0}, {"alpha_init": 0.5}, {"alpha_lr_mult": 0.0},
                {"n_iter": 0}]:
        with pytest.raises(HyperParameterError):
            cls(cls.Config(**bad))


# ------------------------------------------------------------------------------------------------------------
# Low precision: rows stay finite, padding gets nothing
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", SPARSE)
def test_rows_finite_and_padding_zero_in_low_precision(name, dtype):
    method, module, _ = attached_method(name, dtype=torch.float32)
    q, k, v, mask, valid = padded_qkv(dtype=dtype, seed=7, spread=3.0)  # scores up to ~30: stress the exponentials
    with torch.enable_grad():
        out, probs = run_attention(method, module, q, k, v, mask)
    assert out.dtype == dtype and torch.isfinite(out).all()
    if probs is not None:
        assert torch.isfinite(probs.float()).all() and (padding_weight(probs, valid) == 0).all()
        if name != "rela":
            torch.testing.assert_close(probs.float().sum(-1), torch.ones(probs.shape[:-1]), atol=1e-2, rtol=0)
    out.float().square().sum().backward()
    assert all(torch.isfinite(t.grad.float()).all() for t in (q, k, v))


@pytest.mark.parametrize("name", ["sparsemax", "entmax15", "entmax_alpha"])
def test_entmax_family_runs_in_fp32_under_autocast(name):
    method, module, _ = attached_method(name, dtype=torch.float32)
    q, k, v, mask, valid = padded_qkv(dtype=torch.float32, seed=8, spread=2.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, probs = run_attention(method, module, q, k, v, mask)
    _, ref = run_attention(method, module, q, k, v, mask)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, ref, atol=5e-2, rtol=0)  # bf16 scores, but an fp32 mapping: rows sum to 1
    assert probs.sum(-1).sub(1).abs().max() < 1e-5             # to fp32 precision (a bf16 mapping misses by ~1e-2)
    assert (padding_weight(probs, valid) == 0).all()


# ------------------------------------------------------------------------------------------------------------
# Whole models
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("name", SPARSE)
def test_forward_backward_through_tiny_models(kind, name):
    model = tiny_model(kind, num_labels=3)
    cls = suite.METHODS.get(name)
    method = cls()
    method.attach(model)
    ids, mask = padded_batch(length=12, vocab=model.config.vocab_size)
    if kind == "roberta":
        ids[mask == 0] = model.config.pad_token_id
    model.train()
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    own = [n for n in grads if "rela_" in n or "entmax_pre_alpha" in n]
    assert all(grads[n].abs().sum() > 0 for n in own)
    assert len(own) == {"rela": 4, "entmax_alpha": 2}.get(name, 0)
    # padding never changes a valid token's output (eval: no dropout randomness)
    model.eval()
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        short = model(input_ids=ids[1:2, :9], attention_mask=mask[1:2, :9],
                      output_hidden_states=True).hidden_states[-1]
    n = int(mask[1].sum())
    torch.testing.assert_close(a[1, :n], short[0, :n], atol=1e-5, rtol=1e-4)


@pytest.mark.integration
@pytest.mark.slow  # the slow tier: `python -m pytest -m slow`
def test_sparse_methods_on_minilm_rte(shared_glue, tmp_path):
    import json

    from suite.commands import main

    code = main(["run", "--methods", "rela,topk,entmax15", "--tasks", "rte", "--seeds", "1",
                 "--data-dir", str(shared_glue), "--max-train-samples", "32", "--max-eval-samples", "32",
                 "--epochs", "1", "--batch-size", "16", "--precision", "fp32", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    recs = {r["config"]["method"]: r for r in
            (json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json"))}
    assert set(recs) == {"rela", "topk", "entmax15"} and all(r["status"] == "ok" for r in recs.values())
    assert recs["rela"]["parameters"]["extra"] == 2 * 384 * 6
    for name in ("topk", "entmax15"):
        if "attention" in recs[name]:
            assert recs[name]["attention"]["mean"]["sparsity"] > 0
