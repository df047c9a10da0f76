"""Every built-in method on batches with extreme padding, through a tiny BERT: a sample with no real token at all and
a sample of one token keep every output and every gradient finite (training mode, bf16 autocast too); padding rows to
a wider width changes no logit of a row with a real token (eval mode); and no method asks the host to wait (no
.item(), no copy to the CPU, no shape read off the data) beyond what vanilla's step asks."""
import pytest
import torch

import suite
from suite.api.attention import StepContext
from suite.profiling.counters import counting
from suite.testing import one_thread, tiny_model

BUILT_IN = sorted(n for n in suite.METHODS.names() if suite.METHODS.get(n).__module__.startswith("suite.methods"))
# settings whose code paths the defaults do not reach
VARIANTS = [("uniform", {"boundary_tokens": True}), ("less_attention", {"form": "linear"}),
            ("less_attention", {"layers": 1}),
            ("dynamicconv", {"kernel_input": "query"}), ("topk", {"k_frac": 0.3}), ("topk", {"k": 1}),
            ("drophead", {"schedule": "constant"}), ("lightconv", {"kernel_size": 40})]
CASES = [(name, {}) for name in BUILT_IN] + VARIANTS
IDS = [name + "".join(f"-{k}={v}" for k, v in hp.items()) for name, hp in CASES]
LENGTH = 10
REAL = [LENGTH, 6, 1, 0]   # an unpadded row, a padded one, a single token, and a sample with no real token at all


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def _attached(name: str, hp: dict, seed: int = 0):
    """A tiny BERT (no hidden dropout) with the method attached and set up for training, and the method."""
    model = tiny_model("bert", seed=seed)
    cls = suite.METHODS.get(name)
    method = cls(cls.Config(**hp))
    method.attach(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    ctx = StepContext(model, method, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
                      torch.device("cpu"), None, 0.0, total_steps=4, step=1)
    method.setup_training(ctx)  # AttendOut builds its generator here; DropHead reads its schedule
    return model, method


def _batch(vocab: int, extra: int = 0) -> dict:
    """Rows with REAL real tokens, padded to LENGTH + extra; the real tokens do not depend on `extra`."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (len(REAL), LENGTH), generator=g)
    mask = (torch.arange(LENGTH)[None, :] < torch.tensor(REAL)[:, None]).long()
    ids = torch.nn.functional.pad(ids * mask, (0, extra))  # pad id 0
    return {"input_ids": ids, "attention_mask": torch.nn.functional.pad(mask, (0, extra))}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name, hp", CASES, ids=IDS)
def test_fully_padded_and_single_token_rows_stay_finite_in_training(name, hp, precision):
    model, _ = _attached(name, hp)
    model.train()
    batch = _batch(model.config.vocab_size)
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(**batch).logits
    assert torch.isfinite(logits).all(), logits
    # the loss leaves the sample without tokens out: its NaN would otherwise reach every gradient anyway
    loss = torch.nn.functional.cross_entropy(logits[:3].float(), torch.tensor([0, 1, 0]))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert len(grads) > len(list(model.parameters())) // 2
    bad = [n for n, g in grads.items() if not torch.isfinite(g).all()]
    assert not bad, f"non-finite gradients: {bad}"


@pytest.mark.parametrize("name, hp", CASES, ids=IDS)
def test_padding_to_a_wider_width_changes_no_logit(name, hp):
    """Bucketed padding is safe: a row's logits do not depend on how far the batch is padded. The sample with no real
    token is left out: methods that softmax over the mask spread it uniformly over every (padded) position, so its
    output follows the width (by ~1e-5 here); it is checked finite."""
    model, _ = _attached(name, hp)
    model.eval()
    with torch.no_grad():
        tight = model(**_batch(model.config.vocab_size)).logits
        wide = model(**_batch(model.config.vocab_size, extra=13)).logits
    assert torch.isfinite(tight).all() and torch.isfinite(wide).all()
    torch.testing.assert_close(wide[:3], tight[:3], atol=1e-5, rtol=0)


def test_topk_ratio_mode_follows_the_padded_width_by_design():
    """The official ratio mode takes k from the batch's padded length (docs/methods.md#topk): wider padding keeps
    more keys, so it is the one setting whose outputs depend on the width."""
    model, _ = _attached("topk", {"div": 2.0})
    model.eval()
    with torch.no_grad():
        tight = model(**_batch(model.config.vocab_size)).logits
        wide = model(**_batch(model.config.vocab_size, extra=13)).logits
    assert (wide[:2] - tight[:2]).abs().max() > 1e-6


def test_entmax_alpha_gives_a_row_without_keys_zero_attention_and_leaves_the_others_as_the_package():
    """The package's bisection divides 0 by 0 on a row whose every key is masked (its bracket collapses at the mask
    minimum), and the NaN reaches every shared parameter through the backward; here that row gets zero attention
    and zero gradients, and every other row is the package's, bit for bit."""
    import entmax

    from suite.methods.entmax_attention import entmax_bisect

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 6, generator=g) * 3
    x[0, :, :, 4:] = torch.finfo(x.dtype).min   # padded keys
    x[1] = torch.finfo(x.dtype).min             # a sample with no real key
    alpha = torch.tensor([1.2, 1.5, 1.9]).view(1, 3, 1, 1).requires_grad_()
    xs = x.clone().requires_grad_()
    y = entmax_bisect(xs, alpha, -1, 25)
    (y * torch.randn(y.shape, generator=g)).sum().backward()
    assert (y[1] == 0).all() and (xs.grad[1] == 0).all() and torch.isfinite(alpha.grad).all()
    assert torch.equal(y[0], entmax.entmax_bisect(x[:1], alpha=alpha.detach(), dim=-1, n_iter=25)[0])


def _syncs(name: str, hp: dict) -> int:
    model, _ = _attached(name, hp)
    model.train()
    batch = _batch(model.config.vocab_size)
    model(**batch).logits.sum().backward()  # warm-up: lazy set-up outside the count
    with counting() as counts:
        model(**batch).logits[:3].sum().backward()
    return counts.syncs


@pytest.fixture(scope="module")
def vanilla_syncs() -> int:
    with one_thread():
        return _syncs("vanilla", {})


@pytest.mark.parametrize("name, hp", CASES, ids=IDS)
def test_no_host_synchronisation_beyond_vanilla(name, hp, vanilla_syncs):
    """Forward and backward of a training batch: a method's attention never reads a value back to the host."""
    assert _syncs(name, hp) <= vanilla_syncs
