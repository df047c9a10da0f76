"""Captured training steps (`train.capture`, suite.run.capture), checked on the CPU: when a run captures and why not,
the captured path (static inputs, the scheduler outside the graph, a learning-rate tensor) run without the graph
against the eager step, and every capturable built-in's step free of host reads. The graphs themselves need a GPU
(lab/speed/gpu_capture.py, lab/speed/gpu_throughput.sh)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import suite
from suite.api.attention import AttentionMethod
from suite.run.capture import CaptureFailed, Steps, eager_reason
from suite.run.settings import TrainSettings
from suite.testing import tiny_model

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def _method(name: str, **cfg):
    cls = suite.METHODS.get(name)
    return cls(dataclasses.replace(cls.Config(), **cfg))


def test_when_a_run_captures_and_why_not():
    vanilla, attendout = _method("vanilla"), _method("attendout")
    assert eager_reason(vanilla, "auto", CUDA, torch.bfloat16, False, 1) is None
    assert eager_reason(vanilla, "auto", CUDA, None, False, 1) is None  # fp32 too
    assert "capture=off" in eager_reason(vanilla, "off", CUDA, torch.bfloat16, False, 1)
    assert "CUDA" in eager_reason(vanilla, "auto", CPU, None, False, 1)
    assert "replaces the training step" in eager_reason(attendout, "auto", CUDA, torch.bfloat16, False, 1)
    assert "compile" in eager_reason(vanilla, "auto", CUDA, torch.bfloat16, True, 1)
    assert "grad_accumulation" in eager_reason(vanilla, "auto", CUDA, torch.bfloat16, False, 2)
    assert "fp16" in eager_reason(vanilla, "auto", CUDA, torch.float16, False, 1)

    class Undeclared(AttentionMethod):
        name = "undeclared"

    assert "does not declare" in eager_reason(Undeclared(), "auto", CUDA, None, False, 1)


def test_every_builtin_method_is_captured_or_says_why_not():
    for name in suite.METHODS.names():
        cls = suite.METHODS.get(name)
        if cls.__module__.startswith("suite.methods."):
            assert cls.capturable is True or (isinstance(cls.capturable, str) and cls.capturable), name


def _batches(vocab: int, seed: int = 0) -> list[dict]:
    """Batches of three shapes, each shape coming back (first sight eager, second captured, then replays)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for rows, width in [(4, 8), (4, 16), (4, 8), (3, 16), (4, 16), (4, 8), (3, 16), (4, 8), (4, 16), (3, 16)]:
        mask = torch.ones(rows, width, dtype=torch.long)
        mask[1:, width - 3:] = 0  # padded rows
        out.append({"input_ids": torch.randint(5, vocab, (rows, width), generator=g) * mask,
                    "attention_mask": mask, "labels": torch.randint(0, 2, (rows,), generator=g)})
    return out


def _train(name: str, cfg: dict, captured: bool, monkeypatch) -> tuple[list[float], dict, dict]:
    from suite.run.training import build_context

    model = tiny_model(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    method = _method(name, **cfg)
    method.attach(model)
    model.train()
    ctx = build_context(model, method, TrainSettings(lr=1e-3), 40, CPU, None, graphs=captured)
    steps = Steps(ctx, None if captured else "eager", emulate=captured)
    torch.manual_seed(1)
    losses = []
    for batch in _batches(model.config.vocab_size):
        ctx.step += 1
        losses.append(float(steps(batch, None)))  # emulated, a captured step sees in_graph() as inside a capture
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}, steps.facts()


@pytest.mark.parametrize("name,cfg", [("vanilla", {}), ("scores_dropout", {}),
                                      ("drophead", {"p": 0.3, "schedule": "linear"})])
def test_the_captured_path_trains_as_the_eager_step(name, cfg, monkeypatch):
    """Dropout on: the same random draws in the same order, so the losses and weights agree but for the learning
    rate held as a float32 tensor (the graph reads it) instead of a Python float."""
    eager_losses, eager_weights, eager_facts = _train(name, cfg, False, monkeypatch)
    losses, weights, facts = _train(name, cfg, True, monkeypatch)
    assert eager_facts == {"mode": "eager", "reason": "eager"}
    assert facts["mode"] == "captured" and facts["graphs"] == 3 and facts["eager_steps"] == 3
    assert facts["replays"] == 7
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=1e-6)
    for key, value in eager_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-6, msg=key)
    moved = max((weights[k] - v).abs().max().item() for k, v in eager_weights.items())
    assert moved < 1e-4 and any((weights[k] != v).any() for k, v in tiny_model().state_dict().items()
                                if k in weights and v.shape == weights[k].shape)


def test_the_learning_rate_tensor_follows_the_schedule():
    from suite.run.training import build_context

    model = tiny_model()
    method = _method("vanilla")
    method.attach(model)
    ctx = build_context(model, method, TrainSettings(lr=1e-3, warmup_ratio=0.5), 4, CPU, None, graphs=True)
    lr = ctx.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and float(lr) == 0.0  # warm-up starts at 0
    steps = Steps(ctx, None, emulate=True)
    seen = []
    for batch in _batches(model.config.vocab_size)[:4]:
        ctx.step += 1
        steps(batch, None)
        seen.append(float(ctx.optimizer.param_groups[0]["lr"]))
    assert ctx.optimizer.param_groups[0]["lr"] is lr  # filled in place: a graph keeps reading the same tensor
    assert seen == pytest.approx([5e-4, 1e-3, 5e-4, 0.0])


CAPTURABLE = sorted(n for n in suite.METHODS.names() if suite.METHODS.get(n).capturable is True)


@pytest.mark.parametrize("name", CAPTURABLE)
def test_a_capturable_methods_step_reads_nothing_back_to_the_host(name):
    """A capture fails at the first host read (`.item()`, a value-dependent shape, a copy to the host): every
    method that declares itself capturable must have none in its step, counted on the CPU as a GPU would pay."""
    from suite.profiling.counters import counting
    from suite.run.training import build_context

    model = tiny_model(hidden_dropout_prob=0.1)
    method = suite.METHODS.get(name)()
    method.attach(model)
    model.train()
    ctx = build_context(model, method, TrainSettings(), 8, CPU, None, graphs=True)
    steps = Steps(ctx, None, emulate=True)
    batch = _batches(model.config.vocab_size)[0]
    for _ in range(3):  # eager, capture, replay
        ctx.step += 1
        with counting() as counted:
            steps(batch, None)
        assert counted.syncs == 0, (name, dict(counted.sync_kinds))


class _Trace(TorchDispatchMode):
    """Every operator a step dispatches, with its arguments other than tensors: what a CUDA graph would bake in."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not str(func).startswith("profiler."):  # record_function markers (the optimizer's) hold fresh objects
            self.ops.append((str(func), [_constant(a) for a in torch.utils._pytree.tree_leaves((args, kwargs or {}))
                                         if not isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def _constant(value) -> str:
    plain = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
    return repr(value) if isinstance(value, plain) else type(value).__name__


def _replayed_traces(method: AttentionMethod, monkeypatch) -> list[list[tuple]]:
    """The captured step's body at its capture and at two replays (emulated), along a schedule that moves."""
    from suite.run import capture
    from suite.run.training import build_context

    traces, emulated = [], capture._emulated

    def traced(step):
        with _Trace() as trace:
            out = emulated(step)
        traces.append(trace.ops)
        return out

    monkeypatch.setattr(capture, "_emulated", traced)
    model = tiny_model(hidden_dropout_prob=0.1)
    method.attach(model)
    model.train()
    ctx = build_context(model, method, TrainSettings(warmup_ratio=0.5), 8, CPU, None, graphs=True)
    steps = Steps(ctx, None, emulate=True)
    batch = _batches(model.config.vocab_size)[0]
    for _ in range(4):  # eager, capture, replay, replay
        ctx.step += 1
        steps(batch, None)
    assert len(traces) == 3 and traces[0]
    return traces


@pytest.mark.parametrize("name", CAPTURABLE)
def test_a_capturable_methods_replays_dispatch_what_its_capture_did(name, monkeypatch):
    """A graph replays the operators and the constants of the step it captured: a method whose step changes them from
    step to step (a rate held as a Python number, a branch on the step count) would replay a stale step on a GPU."""
    first, *later = _replayed_traces(suite.METHODS.get(name)(), monkeypatch)
    for trace in later:
        assert trace == first, (name, next(((a, b) for a, b in zip(first, trace) if a != b), "length"))


def test_a_rate_held_as_a_python_number_changes_the_replayed_step(monkeypatch):
    """The planted mistake the test above exists for: a schedule read as a float inside the step."""
    vanilla = type(_method("vanilla"))

    class Scheduled(vanilla):
        name = "scheduled"
        capturable = True

        def before_step(self, ctx):
            self.cfg = dataclasses.replace(self.cfg, p=0.1 + 0.01 * ctx.step)

    first, second, _ = _replayed_traces(Scheduled(), monkeypatch)
    assert first != second


def test_a_subclass_that_changes_code_declares_capturable_itself():
    """A plugin that subclasses a capturable built-in to change its attention must not inherit the promise."""
    vanilla = type(_method("vanilla"))

    class Renamed(vanilla):
        name = "renamed"

    class Changed(vanilla):
        name = "changed"

        def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
            return super().attention(module, query, key, value, attention_mask, scaling, **kwargs)

    class Declared(Changed):
        capturable = True

    assert eager_reason(Renamed(), "auto", CUDA, None, False, 1) is None
    assert "Changed.attention" in eager_reason(Changed(), "auto", CUDA, None, False, 1)
    assert eager_reason(Declared(), "auto", CUDA, None, False, 1) is None


def test_a_failed_capture_fails_the_run_and_says_why(monkeypatch):
    """A capture refused mid-run fails the run (CaptureFailed, which a grid answers by running the job again eagerly in
    a fresh process) with the operation that caused it: going on eagerly in this process is unsafe, since torch
    leaves its generator in capture mode after a failed capture."""
    def refuse(self, batch):
        try:
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    monkeypatch.setattr(Steps, "_capture", refuse)
    with pytest.raises(CaptureFailed, match=r"capture failed at step 3 \(operation not permitted.*fresh process"):
        _train("vanilla", {}, True, monkeypatch)
