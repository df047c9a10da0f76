"""What the AttendOut experiments share: the data; the one way a model with AttendOut is trained (`make_method`,
`optimize`, `train_step`: AdamW, its schedule and the method's own step, whichever part builds the model); G's policy
on a fixed reference input (`reference_states`, `policy_on`); and the mask draws and first-order rewards of the reward
measurements (`run` and `accumulated` both import from here, never each other). AttendOut is reached through its
public instrumentation only: `forward_mode`, `last_masks`, `layer_sums`, `reward_hooks`."""
from __future__ import annotations

import numpy as np
import torch


def load_data(args):
    from transformers import AutoTokenizer

    from suite.api.tasks import get_task
    from suite.run.data import encode, load_splits
    from suite.run.settings import resolve_model

    spec = get_task(args.task)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    splits = load_splits(spec, args.data_dir)
    train = encode(spec, splits[spec.train_split], tokenizer, args.max_length)
    dev_split = next(iter(spec.eval_splits.values()))
    dev = encode(spec, splits[dev_split], tokenizer, args.max_length)
    return spec, tokenizer, train, dev


def make_method(model: str, task: str, hp: dict, seed: int, lr: float):
    """An AttendOut instance with hyper-parameters `hp` (the rest its defaults), as a run of `model` on `task` gets
    it."""
    from suite.run.models import build_method
    from suite.run.settings import RunConfig, TrainSettings

    return build_method(RunConfig(model, task, "attendout", hp, seed, TrainSettings(lr=lr)))


def optimize(model, method, lr: float, steps: int, warmup_steps: int, params=None):
    """The experiments' training setup: AdamW (weight decay 0.01) over `params` (default: every weight) with a linear
    warm-up of `warmup_steps` and decay to 0 at `steps`, as a CPU `StepContext` (fp32, clipping at 1) with the
    method's training set up (it seeds G's mask generator from torch's) and the model in train mode."""
    from transformers import get_linear_schedule_with_warmup

    from suite.api.attention import StepContext

    optimizer = torch.optim.AdamW(model.parameters() if params is None else params, lr=lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, steps)
    ctx = StepContext(model, method, optimizer, scheduler, torch.device("cpu"), None, 1.0, total_steps=steps)
    method.setup_training(ctx)
    model.train()
    return ctx


def train_step(ctx, batches: list[dict], step: int) -> torch.Tensor:
    """The method's own training step `step` (from 0) on batches[step], its reward looking ahead to the next batch."""
    ctx.step = step + 1
    return ctx.method.training_step(ctx, batches[step], batches[step + 1])


def pair_validity(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, T) bool: real query, real key, off the diagonal (what G may drop)."""
    real = attention_mask.bool()
    return real[:, :, None] & real[:, None, :] & ~torch.eye(real.shape[1], dtype=torch.bool)


@torch.no_grad()
def reference_states(model, dev, pad_id: int, spec, batch_size: int, n_batches: int) -> list:
    """[(hidden states entering each attention layer, valid pairs)] of `model`, in eval mode, on fixed dev batches
    (every 7th batch of the length-sorted dev set, the first `n_batches`): the input G's policy is read on."""
    from suite.run.batching import sorted_batches

    model.eval()
    order = sorted_batches(dev.lengths(), batch_size)[::7][:n_batches]
    out = []
    for batch in batches_of(dev, order, pad_id, spec):
        hidden = model.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            output_hidden_states=True).hidden_states
        out.append((hidden[:-1], pair_validity(batch["attention_mask"])))
    return out


def batches_of(enc, order: list[list[int]], pad_id: int, spec):
    from suite.run.batching import collate

    for idx in order:
        yield collate([enc.features[i] for i in idx], [enc.labels[i] for i in idx], pad_id, spec.is_regression)



@torch.no_grad()
def policy_on(generator, p_max: float, states) -> list[np.ndarray]:
    """Per layer, G's drop probabilities on every valid pair of the reference input."""
    layers = len(states[0][0])
    per_layer = [[] for _ in range(layers)]
    for hidden, valid in states:
        for layer in range(layers):
            pi = p_max * torch.sigmoid(generator(hidden[layer].float(), layer))
            per_layer[layer].append(pi[valid].numpy())
    return [np.concatenate(v) for v in per_layer]



SOURCES = {"G1": "attacker", "G2": "attacker", "D1": "defender", "D2": "defender"}


def draw_masks(method, model, batch, state) -> tuple[dict, dict]:
    """Per source, the masks one forward draws under the same hidden-dropout state, and its per-sample losses."""
    from suite.methods.attendout import reward as rw

    masks, losses = {}, {}
    for name, mode in SOURCES.items():  # same dropout draws, a different mask each
        with torch.no_grad(), method.forward_mode(mode, state):
            losses[name] = rw.losses_at(model, None, batch)
        masks[name] = method.last_masks
    return masks, losses


def first_order(method, model, batch, nxt, masks, state, eta, fd_decrease) -> dict[str, torch.Tensor]:
    """Per source, the per-sample first-order rewards eta * v . grad l_i under that source's masks (replayed)."""
    from suite.methods.attendout import reward as rw

    v = rw.next_batch_gradient(model, nxt)
    eps = fd_decrease / rw.squared_norm(v)
    moved = rw.shifted(model, v, eps)
    out = {}
    for name, m in masks.items():
        with torch.no_grad(), method.forward_mode("replay", state, masks=m):
            base = rw.losses_at(model, None, batch)
        out[name] = rw.alignment_rewards(model, batch, base, moved, eps, eta,
                                         method.forward_mode("replay", state, masks=m))
    return out



def measurement_batches(model, train, batch_size: int, n: int, pad_id, spec, seed: int) -> list[dict]:
    """`n` consecutive batches of a fresh training order drawn with `seed`; the model in train mode and torch's
    generator reseeded, so each measurement replays the same draws."""
    from suite.run.batching import length_grouped_batches

    model.train()
    order = length_grouped_batches(train.lengths(), batch_size, torch.Generator().manual_seed(seed))
    batches = list(batches_of(train, order[:n], pad_id, spec))
    torch.manual_seed(seed)
    return batches

