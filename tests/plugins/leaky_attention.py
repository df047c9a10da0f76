"""A method from outside the suite's package that forgets the padding mask: `suite check` must catch it.

Loaded through the `suite.methods` entry-point group by tests/test_check.py (never imported by the suite itself).
"""
import suite


@suite.register_method("leaky_attention")
class LeakyAttention(suite.AttentionMethod):
    """Softmax attention that never adds the padding mask, so padded keys get weight."""

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, suite.softmax(suite.scores(query, key, scaling)), value)
