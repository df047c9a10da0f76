"""What the placebo experiment's parts share: the data, G's policy on a fixed input, and the mask draws and
first-order rewards of the reward measurements (`run` and `accumulated` both import from here, never each other)."""
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
    for stream, (name, mode) in enumerate(SOURCES.items()):  # same dropout draws, a different mask each
        with torch.no_grad(), method._mode(mode, state, stream=stream):
            losses[name] = rw.losses_at(model, None, batch)
        masks[name] = dict(method._masks)
    return masks, losses


def first_order(method, model, batch, nxt, masks, state, eta, fd_decrease) -> dict[str, torch.Tensor]:
    """Per source, the per-sample first-order rewards eta * v . grad l_i under that source's masks (replayed)."""
    from suite.methods.attendout import reward as rw

    v = rw.next_batch_gradient(model, nxt)
    eps = fd_decrease / rw.squared_norm(v)
    moved = rw.shifted(model, v, eps)
    out = {}
    for name, m in masks.items():
        method._masks = dict(m)
        with torch.no_grad(), method._mode("replay", state):
            base = rw.losses_at(model, None, batch)
        out[name] = rw.alignment_rewards(model, batch, base, moved, eps, eta, method._mode("replay", state))
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

