"""Signal-to-noise of AttendOut's reward accumulated over k consecutive steps (`g_accumulate`).

Per step t (a batch x_t and its next batch x_{t+1}, the model's weights held fixed, as in the per-step measurement),
the first-order batch reward of four mask sources under the same hidden-dropout draws (common random numbers):
G1 and G2 (two masks from G), D1 and D2 (two independent vanilla attention-dropout Defenders). Per step:

    signal  = r(G1) - r(D1)      (G's masks vs vanilla dropout; "first_order_batch")
    rloo    = r(G1) - r(G2)      (two of G's masks against each other; what the leave-one-out baseline sees)
    noise   = r(D2) - r(D1)      (two independent Defenders: what no policy can explain)

The accumulated reward of k steps is the sum of these over k consecutive batches (non-overlapping blocks); its SNR
is std(sum of signal) / std(sum of noise) over the blocks. If the per-step terms were independent with no consistent
part, both sums grow as sqrt(k) and the ratio stays where it is per step; it grows only if G's masks differ from
vanilla dropout consistently (a signal mean) or in a way correlated across steps. The interval is a 95% percentile
bootstrap over blocks, resampling signal and noise of a block together (they share D1); none below 6 blocks.
"""
from __future__ import annotations

import json
import math
import sys
import time

import numpy as np
import torch

from .common import draw_masks, first_order, measurement_batches

COMPARISONS = {"first_order_batch": ("G1", "D1"), "first_order_rloo_batch": ("G1", "G2")}
NOISE = ("D2", "D1")
MIN_BLOCKS_FOR_INTERVAL = 6


def step_rewards(method, model, batch, nxt, eta: float, fd_decrease: float) -> dict[str, float]:
    """One step's batch-mean first-order reward differences (signal per comparison, and the noise)."""
    from suite.methods.attendout import reward as rw

    state = rw.RandomState(torch.device("cpu"))
    masks, _ = draw_masks(method, model, batch, state)
    fo = {name: float(r.mean()) for name, r in first_order(method, model, batch, nxt, masks, state, eta,
                                                            fd_decrease).items()}
    out = {name: fo[a] - fo[b] for name, (a, b) in COMPARISONS.items()}
    return out | {"noise": fo[NOISE[0]] - fo[NOISE[1]]}


def block_sums(values, k: int) -> np.ndarray:
    """Sums of consecutive non-overlapping blocks of k values (a trailing partial block is dropped)."""
    values = np.asarray(values, dtype=float)
    blocks = len(values) // k
    return values[:blocks * k].reshape(blocks, k).sum(1)


def std_ratio(signal, noise) -> float:
    s, n = np.std(signal), np.std(noise)
    return float(s / n) if n > 0 else math.inf


def ratio_interval(signal: np.ndarray, noise: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of std(signal)/std(noise), resampling (signal, noise) pairs together."""
    from scipy import stats

    if len(signal) < MIN_BLOCKS_FOR_INTERVAL:  # a resample of one repeated block is frequent: std 0, ratio undefined
        return math.nan, math.nan
    res = stats.bootstrap((signal, noise), lambda s, n, axis=-1: np.std(s, axis=axis) / np.std(n, axis=axis),
                          paired=True, vectorized=True, n_resamples=5000, method="percentile",
                          rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def summarize(steps: list[dict], ks: list[int]) -> dict:
    """Per comparison and k (1 included): std of the summed signal and noise, their ratio, interval, mean, n."""
    out = {}
    for name in COMPARISONS:
        out[name] = {}
        for k in [1] + [k for k in ks if k != 1]:
            signal = block_sums([s[name] for s in steps], k)
            noise = block_sums([s["noise"] for s in steps], k)
            low, high = ratio_interval(signal, noise)
            out[name][str(k)] = {"signal_std": float(np.std(signal)), "noise_std": float(np.std(noise)),
                                 "snr": std_ratio(signal, noise), "snr_low": low, "snr_high": high,
                                 "signal_mean": float(np.mean(signal)), "n": int(len(signal))}
    return out


def accumulated_snr(args, spec, train, pad_id, run) -> dict:
    """Per-step rewards on `--accumulate-batches` consecutive batch pairs of a fresh training order, summarised."""
    model, method = run["model"], run["method"]
    batches = measurement_batches(model, train, args.batch_size, args.accumulate_batches + 1, pad_id, spec,
                                  seed=20_000)
    steps, began = [], time.perf_counter()
    for i in range(args.accumulate_batches):
        steps.append(step_rewards(method, model, batches[i], batches[i + 1], args.lr, method.cfg.fd_decrease))
        print("step " + json.dumps(steps[-1]), file=sys.stderr, flush=True)  # a long run's values survive a stop
        if (i + 1) % 10 == 0:
            print(f"accumulated reward: {i + 1}/{args.accumulate_batches} steps, "
                  f"{(time.perf_counter() - began) / (i + 1):.1f}s each", file=sys.stderr, flush=True)
    return {"steps": steps, "summary": summarize(steps, args.accumulate), "seconds": time.perf_counter() - began}
