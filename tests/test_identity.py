"""Every method at its identity setting equals SDPA attention on a padded batch, forward and backward,
for BERT and RoBERTa. This is also the check that the mask function is registered: without it transformers passes
no mask and padded keys get weight (a 1e-2 difference instead of 1e-7)."""
import copy

import pytest
import torch

import suite
from conftest import padded_batch, tiny_model

IDENTITY = [n for n in suite.METHODS.names() if suite.METHODS.get(n).identity is not None]


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("name", IDENTITY)
def test_identity_setting_matches_sdpa(kind, name):
    ref = tiny_model(kind, num_labels=3)
    assert ref.config._attn_implementation == "sdpa"
    ids, mask = padded_batch(length=12, vocab=ref.config.vocab_size)
    if kind == "roberta":
        ids[mask == 0] = ref.config.pad_token_id
    labels = torch.tensor([0, 1, 2])
    model = copy.deepcopy(ref)
    cls = suite.METHODS.get(name)
    cls(cls.Config(**cls.identity)).attach(model)
    assert model.config._attn_implementation == f"suite_{name}"
    for mode in ("train", "eval"):
        ref.train(mode == "train")
        model.train(mode == "train")
        ref.zero_grad()
        model.zero_grad()
        out_ref = ref(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        valid = mask.bool()
        torch.testing.assert_close(out.hidden_states[-1][valid], out_ref.hidden_states[-1][valid],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.logits, out_ref.logits, atol=1e-6, rtol=1e-5)
        # a loss on every valid token's final state, so gradients see all attention rows, not just [CLS]
        (out_ref.loss + out_ref.hidden_states[-1][valid].square().mean()).backward()
        (out.loss + out.hidden_states[-1][valid].square().mean()).backward()
        g_ref, g = _grads(ref), _grads(model)
        for k in g_ref:
            torch.testing.assert_close(g[k], g_ref[k], atol=1e-5, rtol=1e-4, msg=f"gradient of {k}")


def test_padding_matters_for_this_check():
    """Guard against a vacuous test: the padded batch must change SDPA's output if padding were ignored."""
    model = tiny_model("bert").eval()
    ids, mask = padded_batch(length=12, vocab=model.config.vocab_size)
    valid = mask.bool()
    with_mask = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1][valid]
    without = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][valid]
    assert (with_mask - without).abs().max() > 1e-3
