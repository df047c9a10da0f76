"""`--compile`: methods whose per-step state used to recompile the model or break its graph (DropHead's scheduled
rate read from the step number, top-k's `k_frac` read back to the host, entmax_alpha's bisection Function) now trace
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
                                      ("topk", {"k_frac": 0.5}), ("entmax_alpha", {})],
                         ids=["drophead-linear", "drophead", "topk-k_frac", "entmax_alpha"])
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
