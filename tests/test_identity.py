"""Every method at its identity setting equals SDPA attention on a padded batch, forward and backward, for BERT, RoBERTa
and ModernBERT (whose local layer's window is in the mask). This is also the check that the mask function is
registered: without it transformers passes no mask and padded keys get weight (a 1e-2 difference instead of 1e-7)."""
import pytest
from conftest import padded_batch, tiny_model

import suite
from suite.testing import check_identity

IDENTITY = [n for n in suite.METHODS.names() if suite.METHODS.get(n).identity is not None]


@pytest.mark.parametrize("kind", ["bert", "roberta", "modernbert"])
@pytest.mark.parametrize("name", IDENTITY)
def test_identity_setting_matches_sdpa(kind, name):
    """The method check's own identity check (`suite.testing.check_identity`), on every built-in method."""
    result = check_identity(suite.METHODS.get(name), kind)
    assert result.passed, result.detail


def test_identity_check_fails_for_a_method_that_is_not_softmax_there():
    """The identity check can fail: uniform attention declared (wrongly) to be softmax at its defaults."""
    cls = suite.METHODS.get("uniform")
    wrong = type("WrongIdentity", (cls,), {"identity": {}})
    result = check_identity(wrong, "bert")
    assert result.passed is False and "from SDPA" in result.detail


def test_padding_matters_for_this_check():
    """Guard against a vacuous test: the padded batch must change SDPA's output if padding were ignored."""
    model = tiny_model("bert").eval()
    ids, mask = padded_batch(length=12, vocab=model.config.vocab_size)
    valid = mask.bool()
    with_mask = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1][valid]
    without = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][valid]
    assert (with_mask - without).abs().max() > 1e-3
