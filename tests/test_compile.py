"""`--compile`: methods whose per-step state used to recompile the model or break its graph (DropHead's scheduled
rate read from the step number, top-k's `k_frac` read back to the host, the entmax package's Functions) now trace
into as many graphs as vanilla, with no graph break. Traced by dynamo with the `eager` backend (no code generation:
seconds on CPU); counted with torch._dynamo's counters on a tiny BERT."""
from __future__ import annotations

import pytest
import torch

import suite
from suite.api.attention import StepContext

STEPS = 3


def traced(name: str, **hp) -> tuple[int, int]:
    """(graphs dynamo compiled, graph breaks) over STEPS training steps of a tiny BERT with the method attached."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    model = BertForSequenceClassification(config)
    cls = suite.METHODS.get(name)
    method = cls(cls.Config(**hp))
    method.attach(model)
    model.train()
    model.compile(backend="eager")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = StepContext(model, method, optimizer, get_linear_schedule_with_warmup(optimizer, 1, STEPS),
                      torch.device("cpu"), None, 1.0, total_steps=STEPS)
    method.setup_training(ctx)
    g = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        mask = torch.ones(4, 16, dtype=torch.long)
        mask[0, 10:], mask[1, 5:] = 0, 0  # padded rows: different real lengths per row
        batch = {"input_ids": torch.randint(5, 100, (4, 16), generator=g), "attention_mask": mask,
                 "labels": torch.randint(0, 2, (4,), generator=g)}
        ctx.step += 1
        method.training_step(ctx, batch, None)
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.fixture(scope="module")
def vanilla_graphs() -> int:
    graphs, breaks = traced("vanilla")
    assert breaks == 0
    return graphs


@pytest.mark.parametrize("name, hp", [("drophead", {"schedule": "linear"}), ("drophead", {}),
                                      ("topk", {"k_frac": 0.5}), ("entmax_alpha", {}), ("sparsemax", {}),
                                      ("entmax15", {})],
                         ids=["drophead-linear", "drophead", "topk-k_frac", "entmax_alpha", "sparsemax", "entmax15"])
def test_method_compiles_like_vanilla(name, hp, vanilla_graphs):
    assert traced(name, **hp) == (vanilla_graphs, 0)


def test_compile_warns_for_a_method_that_does_not_compile_well(tiny_bert_dir, glue_dir, monkeypatch):
    """AttendOut breaks the graph at every layer: --compile still compiles it, and says why it will not pay."""
    import dataclasses

    from suite.grid.plan import build_grid
    from suite.run.runner import run_one
    from suite.run.settings import TrainSettings

    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(type(self).__name__))
    train = dataclasses.replace(TrainSettings(epochs=1, batch_size=8, max_train_samples=8, max_eval_samples=8,
                                              train_eval_samples=0, stats_batches=0, analyses="none"), compile=True)
    job = build_grid([tiny_bert_dir], ["rte"], ["attendout"], [1], train)[0]
    with pytest.warns(UserWarning, match="attendout does not compile well"):
        rec = run_one(job, glue_dir, device="cpu", quiet=True)
    assert rec.ok, rec.error
    assert compiled == ["BertForSequenceClassification"]


def test_the_entmax_mappings_equal_the_packages():
    """The statically declared Functions give the `entmax` package's values and gradients (alpha's too)."""
    import entmax

    from suite.methods import entmax_attention as ours

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    x[0, :, :, 5:] = torch.finfo(x.dtype).min  # padded keys, as the attention masks them
    alpha = torch.full((1, 3, 1, 1), 1.3, dtype=torch.float64)
    pairs = [(lambda t, a: ours.sparsemax(t), lambda t, a: entmax.sparsemax(t, dim=-1)),
             (lambda t, a: ours.entmax15(t), lambda t, a: entmax.entmax15(t, dim=-1)),
             (lambda t, a: ours.entmax_bisect(t, a, -1, 30),
              lambda t, a: entmax.entmax_bisect(t, alpha=a, dim=-1, n_iter=30))]
    weights = torch.randn(x.shape, generator=g, dtype=torch.float64)
    for mine, theirs in pairs:
        found = []
        for fn in (mine, theirs):
            xi, ai = x.clone().requires_grad_(), alpha.clone().requires_grad_()
            y = fn(xi, ai)
            (y * weights).sum().backward()
            found.append((y.detach(), xi.grad, ai.grad))
        (y1, gx1, ga1), (y2, gx2, ga2) = found
        assert torch.allclose(y1, y2) and torch.allclose(gx1, gx2)
        assert (ga1 is None and ga2 is None) or torch.allclose(ga1, ga2)


# the built-in methods (test modules register plugins of their own) that do not declare that they break the graph
CAPTURED = [n for n in sorted(suite.METHODS.names()) if suite.METHODS.get(n).__module__.startswith("suite.methods.")
            and not getattr(suite.METHODS.get(n), "compile_warning", None)]


def captured_step(name: str, backend: str | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(losses, parameters after the steps) of two training steps of a tiny BERT in train mode (dropout on),
    compiled with `backend` (None: eager), from the same seeds."""
    from transformers import BertConfig, BertForSequenceClassification

    from suite.run.settings import TrainSettings
    from suite.run.training import build_context

    torch._dynamo.reset()  # one layer: tracing costs per operator, and one layer holds every operator of the method
    torch.manual_seed(0)
    layers = 3 if name == "less_attention" else 1  # less attention frees the lower third: it needs three layers
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    model = BertForSequenceClassification(config)
    method = suite.METHODS.get(name)()
    method.attach(model)
    model.train()
    if backend:
        model.compile(backend=backend)
    ctx = build_context(model, method, TrainSettings(grad_clip=1.0), 4, torch.device("cpu"), None)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[0, 10:], mask[1, 1:] = 0, 0  # a padded row and a one-token row
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(1)  # the steps' own draws (dropout masks) from one state in both
    losses = []
    for _ in range(2):  # two steps: state a capture could bake in as a constant (a step number, a rate) must move
        batch = {"input_ids": torch.randint(5, 100, (4, 16), generator=g), "attention_mask": mask,
                 "labels": torch.randint(0, 2, (4,), generator=g)}
        ctx.step += 1
        method.before_step(ctx)
        losses.append(method.training_step(ctx, batch, None))
    return torch.stack(losses), {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", CAPTURED)
def test_a_captured_training_step_equals_the_eager_one(name):
    """The model's forward and backward captured as graphs (AOTAutograd, run by the eager backend: what inductor and
    CUDA graphs compile, without their code generation) give the eager step's loss and updated weights."""
    eager_loss, eager_params = captured_step(name, None)
    loss, params = captured_step(name, "aot_eager")
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    for n, p in params.items():
        torch.testing.assert_close(p, eager_params[n], atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"{n}: {m}")


def test_compiled_graphs_are_reused_by_the_next_run_in_a_worker():
    """A second run of the same model, method and shapes in one process compiles nothing new: torch's cache of
    compiled code is keyed by the code and its guards, not by the model object, so a grid's short runs pay one
    compilation per worker, not one each."""
    from torch._dynamo.utils import counters

    traced("vanilla")
    first = counters["stats"]["unique_graphs"]
    counters.clear()
    torch.manual_seed(0)
    from transformers import BertConfig, BertForSequenceClassification

    from suite.run.settings import TrainSettings
    from suite.run.training import build_context

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    model = BertForSequenceClassification(config)  # a new run: a new model object, the same code and shapes
    method = suite.METHODS.get("vanilla")()
    method.attach(model)
    model.train()
    model.compile(backend="eager")
    ctx = build_context(model, method, TrainSettings(), STEPS, torch.device("cpu"), None)
    g = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        mask = torch.ones(4, 16, dtype=torch.long)
        mask[0, 10:], mask[1, 5:] = 0, 0
        batch = {"input_ids": torch.randint(5, 100, (4, 16), generator=g), "attention_mask": mask,
                 "labels": torch.randint(0, 2, (4,), generator=g)}
        ctx.step += 1
        method.training_step(ctx, batch, None)
    assert first > 0 and counters["stats"]["unique_graphs"] == 0
