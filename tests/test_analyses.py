"""The interpretability analyses against hand-computed examples: a two-token model whose importance ranking is known,
rollout and the head statistics on hand-made maps, JS divergence and total variation by hand."""
import contextlib
import math
import types

import pytest
import torch
from torch import nn

import suite
from suite.run import analyses
from suite.run.analyses import heads, importance, seeds
from suite.run.analyses.capture import capture_example, leave_one_out
from suite.run.data import Encoded
from suite.testing import one_thread, tiny_model

WEIGHTS = torch.tensor([0.0, 2.0, -0.5, 1.0])     # per token id: how much the token pushes the class-1 logit
EMBED = torch.tensor([[0.3], [1.5], [2.0], [0.1]])  # one-dimensional embeddings


class TokenSumModel(nn.Module):
    """logits = [0, sum_i w[x_i] * e(x_i)]: each token's contribution to the prediction is known in closed form."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(4, 1)
        self.embed.weight.data.copy_(EMBED)
        self.config = types.SimpleNamespace()

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        e = self.embed(input_ids)[..., 0]                            # (B, L)
        z = (WEIGHTS[input_ids] * e).sum(-1)
        return types.SimpleNamespace(logits=torch.stack([torch.zeros_like(z), z], -1))


def test_gradient_x_input_and_leave_one_out_on_a_two_token_model():
    ids = [1, 2]                  # contributions w * e: token 1 -> 3.0, token 2 -> -1.0; z = 2 > 0: class 1 wins
    view = capture_example(TokenSumModel(), {"input_ids": ids}, False, torch.device("cpu"),
                           contextlib.nullcontext(), with_gradients=True)
    z = 2.0
    sigma = 1 / (1 + math.exp(-z))
    # target log sigma(z); d/de_i = (1 - sigma) w_i; times e_i
    torch.testing.assert_close(view.grad_x_input, torch.tensor([(1 - sigma) * 3.0, (1 - sigma) * 1.0]))
    assert view.attention is None and view.target == pytest.approx(math.log(sigma))
    loo = leave_one_out(TokenSumModel(), {"input_ids": ids}, [0, 1], False, torch.device("cpu"),
                        contextlib.nullcontext())
    log_sigmoid = torch.nn.functional.logsigmoid
    expected = [abs(math.log(sigma) - float(log_sigmoid(torch.tensor(z - 3.0)))),
                abs(math.log(sigma) - float(log_sigmoid(torch.tensor(z + 1.0))))]
    torch.testing.assert_close(loo, torch.tensor(expected))
    assert loo[0] > loo[1] and view.grad_x_input[0] > view.grad_x_input[1]   # token 1 matters more, both ways


def test_rollout_by_hand():
    a1 = torch.tensor([[0.5, 0.5], [0.0, 1.0]])
    a2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    # 0.5 A + 0.5 I (rows already sum to one): m1 = [[.75, .25], [0, 1]], m2 = [[1, 0], [.25, .75]]
    # rollout = m2 @ m1; [CLS] row = [1, 0] @ m1 = [.75, .25]
    two_heads = [torch.stack([a, a]) for a in (a1, a2)]
    torch.testing.assert_close(importance.rollout(two_heads), torch.tensor([0.75, 0.25]))
    torch.testing.assert_close(importance.cls_attention(torch.stack([a2, a1])), torch.tensor([0.75, 0.25]))


def test_kendall_and_entropy_by_hand():
    # pairs (1,2) concordant, (1,3) concordant, (2,3) discordant: tau = (2 - 1) / 3
    assert importance.kendall([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert importance.entropy([1, 1]) == pytest.approx(math.log(2))
    assert importance.entropy([0, 5]) == pytest.approx(0.0)
    assert math.isnan(importance.kendall([1.0], [2.0]))


def test_example_scores_agree_when_attention_follows_importance():
    layer = torch.tensor([[[0.1, 0.6, 0.3], [0.2, 0.4, 0.4], [0.3, 0.3, 0.4]]])   # one head
    scores = importance.example_scores([layer], {"gxi": torch.tensor([9.0, 2.0, 1.0]),
                                                 "loo": torch.tensor([9.0, 1.0, 2.0])}, content=[1, 2])
    assert scores["tau_cls_gxi"] == pytest.approx(1.0)
    assert scores["tau_cls_loo"] == pytest.approx(-1.0)
    assert scores["entropy_cls"] == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))


def test_js_divergence_and_total_variation_by_hand():
    # JSD([1, 0], [0, 1]) = ln 2; JSD([.5, .5], [1, 0]): m = [.75, .25]
    assert seeds.js_divergence([1, 0], [0, 1]) == pytest.approx(math.log(2))
    kl_pm = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    kl_qm = math.log(1 / 0.75)
    assert seeds.js_divergence([0.5, 0.5], [1, 0]) == pytest.approx(0.5 * (kl_pm + kl_qm))
    assert seeds.total_variation([0.9, 0.1], [0.6, 0.4]) == pytest.approx(0.3)
    assert seeds.total_variation([2.5], [3.0]) == pytest.approx(0.5)
    pair = seeds.seed_divergence({"attention": [[1, 0], None], "prediction": [[1, 0], [0.5, 0.5]]},
                              {"attention": [[0, 1], [1]], "prediction": [[0, 1], [0.5, 0.5]]}, tokens="boundary")
    assert pair["jsd"][0] == pytest.approx(math.log(2)) and math.isnan(pair["jsd"][1])
    assert pair["tvd"] == [1.0, 0.0]
    # a record from before the content measure: no content JSD, the predictions still compare
    old = seeds.seed_divergence({"attention": [[1, 0]], "prediction": [[1, 0]]},
                             {"attention": [[0, 1]], "prediction": [[0, 1]]})
    assert math.isnan(old["jsd"][0]) and old["tvd"] == [1.0]


CLS, SEP, PAD = 101, 102, 0


def _reference_content_distribution(maps: torch.Tensor, ids: list[int]) -> list[float]:
    """By hand in plain Python: content rows of the head-averaged map over content keys, renormalised, averaged."""
    heads_ = maps.shape[0]
    content = [i for i, t in enumerate(ids) if t not in (CLS, SEP, PAD)]
    total = [0.0] * len(content)
    for i in content:
        row = [sum(float(maps[h, i, j]) for h in range(heads_)) / heads_ for j in content]
        for n, v in enumerate(row):
            total[n] += v / sum(row)
    return [v / len(content) for v in total]


def _jsd_by_hand(p, q) -> float:
    m = [(a + b) / 2 for a, b in zip(p, q)]
    kl = lambda x: sum(a * math.log(a / c) for a, c in zip(x, m) if a > 0)  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def _view(maps: torch.Tensor, ids: list[int]):
    from suite.run.analyses.capture import ExampleView

    return ExampleView(ids, [maps], [0.5, 0.5], 0.0, None)


def test_seed_divergence_over_content_tokens_matches_a_reference():
    g = torch.Generator().manual_seed(0)
    ids = [CLS, 7, 8, 9, SEP, PAD]
    maps = [torch.softmax(torch.randn(3, 6, 6, generator=g) * 2, -1) for _ in range(2)]
    for m in maps:
        m[:, :, 5] = 0.0   # padding gets no attention
    a, b = (seeds.run_arrays([_view(m, ids)], special={CLS, SEP, PAD}) for m in maps)
    p, q = (_reference_content_distribution(m, ids) for m in maps)
    assert a["content_attention"][0] == pytest.approx(p, abs=1e-6) and len(p) == 3
    pair = seeds.seed_divergence(a, b)
    assert pair["jsd"][0] == pytest.approx(_jsd_by_hand(p, q), abs=1e-5)
    cls_rows = [(m.mean(0)[0] / m.mean(0)[0].sum()).tolist() for m in maps]  # the [CLS] row, renormalised
    boundary = seeds.seed_divergence(a, b, tokens="boundary")
    assert boundary["jsd"][0] == pytest.approx(_jsd_by_hand(*cls_rows), abs=1e-5)


def test_mass_moved_between_boundary_tokens_does_not_count_as_divergence():
    """Two seeds whose attention differs only in how much goes to [CLS]/[SEP] (the content tokens' relative weights
    the same): no divergence over content tokens, a large one with the boundary tokens kept."""
    ids = [CLS, 7, 8, SEP]
    content = torch.tensor([0.6, 0.4])
    maps = []
    for sink in (0.2, 0.9):          # the share parked on the boundary tokens
        row = torch.cat([torch.tensor([sink / 2]), (1 - sink) * content, torch.tensor([sink / 2])])
        maps.append(row.expand(2, 4, 4).clone())
    a, b = (seeds.run_arrays([_view(m, ids)], special={CLS, SEP}) for m in maps)
    assert seeds.seed_divergence(a, b)["jsd"][0] == pytest.approx(0.0, abs=1e-9)
    assert seeds.seed_divergence(a, b, tokens="boundary")["jsd"][0] > 0.1
    with pytest.raises(ValueError, match="tokens"):
        seeds.seed_divergence(a, b, tokens="all")


def test_head_statistics_by_hand():
    # tokens: [CLS] a . [SEP]; head 0 puts everything on [SEP], head 1 half on [CLS] half on "."
    ids = [10, 5, 7, 11]
    h0 = torch.zeros(4, 4)
    h0[:, 3] = 1
    h1 = torch.zeros(4, 4)
    h1[:, 0] = 0.5
    h1[:, 2] = 0.5
    out = heads.example_heads([torch.stack([h0, h1])], ids, {"cls": [10], "sep": [11], "punct": [7]})
    mass_cls, mass_sep, mass_punct, ent = out[:, 0]
    torch.testing.assert_close(mass_sep, torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(mass_cls, torch.tensor([0.0, 0.5], dtype=torch.float64))
    torch.testing.assert_close(mass_punct, torch.tensor([0.0, 0.5], dtype=torch.float64))
    eps = 1e-4 / 4                                  # Clark et al.'s smoothing with T = 4
    one = 0.9999 + eps
    half = 0.49995 + eps
    expected = [-(one * math.log(one) + 3 * eps * math.log(eps)),
                -(2 * half * math.log(half) + 2 * eps * math.log(eps))]
    torch.testing.assert_close(ent, torch.tensor(expected, dtype=torch.float64))


def test_unknown_analysis_is_bad_input():
    assert analyses.selected("heads, seeds") == ["seeds", "heads"]
    assert analyses.selected("none") == [] and analyses.selected("") == []
    with pytest.raises(suite.HyperParameterError, match="Valid: importance, seeds, heads"):
        analyses.selected("heads,attention")


@pytest.mark.parametrize("method", ["vanilla", "lightconv"])
def test_run_analyses_on_a_tiny_model(tmp_path, method):
    from suite.testing import tiny_tokenizer

    tok = tiny_tokenizer(tmp_path)
    model = tiny_model("bert", vocab_size=len(tok))
    suite.METHODS.get(method)().attach(model)
    texts = ["the cat sat on the mat .", "a dog ran fast , big dog", "red car", "no"]
    enc = tok(texts)
    dev = Encoded([{"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i]}
                   for i in range(len(texts))], [0, 1, 0, 1])
    spec = types.SimpleNamespace(is_regression=False)
    train = types.SimpleNamespace(analyses="importance,seeds,heads", analysis_examples=3)
    with one_thread():
        out = analyses.run_analyses(model, tok, dev, spec, train, tok.pad_token_id, torch.device("cpu"), None)
    assert out["examples"] == 3 and len(out["seeds"]["prediction"]) == 3 and out["attention_visible"]
    assert len(out["heads"]["mass_cls"]) == 2 and len(out["heads"]["mass_cls"][0]) == 4     # layers x heads
    means = out["importance"]["mean"]
    for key in ("tau_cls_gxi", "tau_cls_loo", "tau_rollout_gxi", "tau_rollout_loo"):
        assert -1 <= means[key] <= 1
    assert model.training  # restored
