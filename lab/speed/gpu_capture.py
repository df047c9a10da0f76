"""Captured training steps on a GPU against eager ones: what only a GPU can show about `train.capture`.

    python lab/speed/gpu_capture.py --data-dir ../shared/data/glue --out capture.json

For every method (MiniLM, real RTE training batches padded to the suite's buckets, bf16 autocast, the runner's own
optimizer, scheduler and `suite.run.capture.Steps`):
1. **dropout off** (the method at its identity setting where it has one, hidden dropout 0): the same steps eager and
   captured from the same weights; the largest loss difference over the steps and the relative L2 difference of
   the final weights. Tolerance: losses within `LOSS_TOL` (bf16 rounding and the GPU's non-deterministic
   reductions, e.g. the embedding gradient's atomics, both differ between any two GPU runs).
2. **dropout on** (the method's defaults): the same comparison; a replay draws the same random offsets as the eager
   step, so the losses should agree as closely as in 1 (reported, and the losses must stay finite).
3. step times: eager against replayed, after the first epoch's captures.
Then vanilla's attention-dropout rate realised inside replayed graphs (fused SDPA, p = 0.1, over many replays):
the share of dropped real keys, and whether consecutive replays draw different masks.

    python lab/speed/gpu_capture.py --data-dir ../shared/data/glue --sync --out sync.json

`--sync` instead runs each method's training step under `torch.cuda.set_sync_debug_mode("error")`, which sees what
the suite's CPU counters cannot (a host-to-device copy or a synchronisation inside a C++ kernel): one warm-up step,
then an eager step with the mode on, then (for a capturable method whose eager step had none) its first-sight step,
its capture and one replay with the mode on. Each method's row names the first synchronising call found and the
suite's frame that made it, or says none was found. A method whose eager step syncs is not captured here: a failed
capture would leave this process mid-capture for the methods after it. On the CPU it writes only why it skipped.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import time
import traceback

import torch

LOSS_TOL = 2e-2
STEPS = 24
DEVICE = torch.device("cuda")  # --device cpu rehearses the script: the captured path emulated, no graphs
AMP = torch.bfloat16  # the rehearsal on the CPU runs fp32 (bf16 is emulated on most CPUs, 8-95x slower)


def batches(data_dir: str, count: int, batch_size: int = 32):
    from transformers import AutoTokenizer

    from suite.api.tasks import get_task
    from suite.run.batching import BATCHINGS, padded_widths, to_device
    from suite.run.runner import TokenizedCache
    from suite.run.settings import RunConfig, TrainSettings, resolve_model

    spec = get_task("rte")
    t = TrainSettings(max_train_samples=count * batch_size, train_eval_samples=0)
    tok = AutoTokenizer.from_pretrained(resolve_model("minilm"))
    data = TokenizedCache().get(RunConfig("minilm", "rte", "vanilla", {}, 1, t), spec, tok, data_dir)
    lengths = data.train.lengths()
    widths = padded_widths(lengths, "buckets", t.max_length)
    order = BATCHINGS["length"].order(lengths, batch_size, torch.Generator().manual_seed(0))
    device = DEVICE
    return [to_device(data.train.batch(b, tok.pad_token_id, False, widths.width(b, lengths)), device)
            for b in order[:count]], spec


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def train(model, method, spec, steps_batches, captured: bool, seed: int):
    from suite.run.capture import Steps, eager_reason
    from suite.run.settings import TrainSettings
    from suite.run.training import build_context

    device, emulate = DEVICE, DEVICE.type == "cpu"
    t = TrainSettings(lr=5e-5)
    reason = eager_reason(method, "auto" if captured else "off", torch.device("cuda"), torch.bfloat16, False, 1)
    ctx = build_context(model, method, t, 2 * len(steps_batches), device, AMP, graphs=reason is None)
    steps = Steps(ctx, reason, emulate=emulate)
    torch.manual_seed(seed)
    losses, times = [], []
    model.train()
    for epoch in range(2):
        for batch in steps_batches:
            ctx.step += 1
            sync()
            start = time.perf_counter()
            losses.append(steps(batch, None).float().clone())
            sync()
            if epoch == 1:
                times.append(time.perf_counter() - start)
    return torch.stack(losses).cpu(), times, steps.facts()


def compare(name: str, spec, steps_batches, dropout_off: bool) -> dict:
    import suite
    from suite.run.models import load_model
    from suite.run.settings import RunConfig, TrainSettings

    cls = suite.METHODS.get(name)
    hparams = dict(cls.identity or {}) if dropout_off else {}
    job = RunConfig("minilm", "rte", name, hparams, 1, TrainSettings())
    base, method, _ = load_model(job, spec)
    if dropout_off:
        for m in base.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    base.to(DEVICE)
    results = {}
    for captured in (False, True):
        model = copy.deepcopy(base)  # the method attached to it is copied with it (its modules are the copy's)
        fresh = next(m.suite_method for m in model.modules() if hasattr(m, "suite_method"))
        results[captured] = train(model, fresh, spec, steps_batches, captured, seed=1)
        w = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        results[captured] += (w,)
    (le, te, fe, we), (lc, tc, fc, wc) = results[False], results[True]
    return {"loss_max_abs_diff": float((le - lc).abs().max()), "losses_finite": bool(torch.isfinite(lc).all()),
            "weights_rel_l2": float((we - wc).norm() / we.norm()), "eager_ms": 1e3 * sorted(te)[len(te) // 2],
            "captured_ms": 1e3 * sorted(tc)[len(tc) // 2], "captured": fc, "eager": fe,
            "hparams": hparams}


def _frame(exc: BaseException) -> str:
    """The innermost frame of the suite's own code (suite/, methods/) in the error's traceback: who synchronised."""
    frames = traceback.extract_tb(exc.__traceback__)
    f = ([f for f in frames if "/suite/" in f.filename or "/methods/" in f.filename] or frames)[-1]
    return f"{f.filename.split('/suite/')[-1]}:{f.lineno} in {f.name}: {(f.line or '').strip()[:160]}"


def sync_check(name: str, spec, steps_batches) -> dict:
    """One method's training step under torch.cuda.set_sync_debug_mode("error") (see --sync)."""
    import suite
    from suite.run.capture import Steps, eager_reason
    from suite.run.models import load_model
    from suite.run.settings import RunConfig, TrainSettings
    from suite.run.training import build_context

    model, method, _ = load_model(RunConfig("minilm", "rte", name, {}, 1, TrainSettings()), spec)
    model.to(DEVICE).train()
    reason = eager_reason(method, "auto", DEVICE, AMP, False, 1)
    ctx = build_context(model, method, TrainSettings(lr=5e-5), 8, DEVICE, AMP, graphs=reason is None)
    eager, captured = Steps(ctx, "sync check: eager"), Steps(ctx, reason)
    batch, other = steps_batches[0], steps_batches[1]
    plan = [("warm-up (mode off)", eager, batch, False), ("eager step", eager, batch, True)]
    if reason is None:
        plan += [("first-sight step", captured, other, True), ("capture", captured, other, True),
                 ("replay", captured, other, True)]
    row = {"capturable": suite.METHODS.get(name).capturable is True, "eager_reason": reason, "sync": None,
           "phases_run": []}
    for phase, steps, b, watched in plan:
        row["phases_run"].append(phase)
        ctx.step += 1
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if watched else 0)
        try:
            steps(b, None)
        except RuntimeError as exc:
            root = exc
            while root.__cause__ is not None or root.__context__ is not None:
                root = root.__cause__ or root.__context__
            row.update(sync=str(root).strip().splitlines()[0][:300], phase=phase, where=_frame(root))
            break
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return row


def sync_report(args) -> int:
    """--sync: every method's step under the sync debug mode, the report written after each method."""
    import suite
    from suite.run.device import git_commit, machine

    report = {"device": machine(DEVICE), "torch": torch.__version__, "code": git_commit(), "methods": {}}
    if DEVICE.type != "cuda":
        report["skipped"] = ("no CUDA device: torch.cuda.set_sync_debug_mode sees only CUDA synchronisations (the "
                             "CPU's counterpart is suite.profiling.counters, tests/test_capture.py)")
        print("sync check skipped:", report["skipped"], flush=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
        return 0
    steps_batches, spec = batches(args.data_dir, 2)
    for name in suite.METHODS.select(args.methods):
        try:
            row = sync_check(name, spec, steps_batches)
        except Exception as exc:  # noqa: BLE001  reported, the other methods still run
            row = {"error": f"{type(exc).__name__}: {exc}"[:500], "traceback": traceback.format_exc()[-3000:]}
        report["methods"][name] = row
        found = row.get("sync") or row.get("error")
        print(name, f"SYNC in {row.get('phase')}: {found} at {row.get('where')}" if row.get("sync") else
              f"ERROR {found}" if found else "no sync found", flush=True)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    return 0


def realised_rate(replays: int = 200) -> dict:
    """Vanilla's fused SDPA dropout inside a replayed graph: uniform attention (q = k = 0) over an identity value, so
    each output entry is one key's weight: 0 where dropped."""
    import suite

    method = suite.METHODS.get("vanilla")()
    module = torch.nn.Module()
    module.training = True
    b, h, length = 32, 12, 32
    q = torch.zeros(b, h, length, length, device="cuda", dtype=torch.bfloat16)
    v = torch.eye(length, device="cuda", dtype=torch.bfloat16).expand(b, h, length, length).contiguous()
    mask = torch.zeros(b, 1, length, length, device="cuda")
    mask[b // 2:, :, :, -4:] = torch.finfo(torch.float32).min  # half the rows have 4 padded keys
    real = (mask == 0).expand(b, h, length, length).transpose(1, 2)  # (B, L, H, keys) as the output's layout

    def call():
        out, _ = method.attention(module, q, q, v, mask, 1.0)
        return out

    eager = [((call() == 0) & real).sum().item() for _ in range(20)]
    out = None
    graph = torch.cuda.CUDAGraph()
    call()
    with torch.cuda.graph(graph):
        out = call()
    dropped, same, last = 0, 0, None
    for _ in range(replays):
        graph.replay()
        zero = (out == 0) & real
        dropped += zero.sum().item()
        if last is not None:
            same += int(torch.equal(zero, last))
        last = zero.clone()
    n = real.sum().item()
    return {"p": method.cfg.p, "replays": replays, "realised_captured": dropped / (n * replays),
            "realised_eager": sum(eager) / (n * len(eager)), "se": math.sqrt(0.09 / (n * replays)),
            "identical_consecutive_masks": same}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--methods", default="all")
    ap.add_argument("--out", default="capture.json")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to rehearse the script (no graphs, no rate)")
    ap.add_argument("--steps", type=int, default=STEPS, help="training batches, each seen twice (two epochs)")
    ap.add_argument("--sync", action="store_true", help="only the sync check: each method's step under "
                                                        "torch.cuda.set_sync_debug_mode('error')")
    args = ap.parse_args()
    global DEVICE, AMP
    DEVICE = torch.device(args.device)
    AMP = torch.bfloat16 if DEVICE.type == "cuda" else None
    if args.sync:
        return sync_report(args)
    import suite
    from suite.run.device import git_commit, machine

    torch.backends.cuda.matmul.allow_tf32 = True
    steps_batches, spec = batches(args.data_dir, args.steps, 32 if DEVICE.type == "cuda" else 8)
    report = {"device": machine(DEVICE), "torch": torch.__version__, "code": git_commit(),
              "loss_tol": LOSS_TOL, "steps": 2 * args.steps, "methods": {}}
    try:
        report["vanilla_rate"] = realised_rate() if DEVICE.type == "cuda" else {"skipped": "no GPU"}
    except Exception as exc:  # noqa: BLE001  reported, the rest still runs
        report["vanilla_rate"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    print("vanilla rate:", report["vanilla_rate"], flush=True)
    for name in suite.METHODS.select(args.methods):
        row = {}
        for off in (True, False):
            try:
                row["dropout_off" if off else "dropout_on"] = compare(name, spec, steps_batches, off)
            except Exception as exc:  # noqa: BLE001
                row["dropout_off" if off else "dropout_on"] = {"error": f"{type(exc).__name__}: {exc}",
                                                               "traceback": traceback.format_exc()[-3000:]}
        off_row = row["dropout_off"]
        eager_by_design = suite.METHODS.get(name).capturable is not True
        captured = all(r.get("captured", {}).get("mode") == "captured" and r["captured"].get("replays", 0) > 0
                       for r in (off_row, row["dropout_on"]) if "error" not in r)
        row["pass"] = ("error" not in off_row and "error" not in row["dropout_on"] and (captured or eager_by_design)
                       and off_row["loss_max_abs_diff"] <= LOSS_TOL and row["dropout_on"]["losses_finite"])
        report["methods"][name] = row
        brief = {k: {kk: v[kk] for kk in ("loss_max_abs_diff", "eager_ms", "captured_ms", "error") if kk in v}
                 for k, v in row.items() if isinstance(v, dict)}
        print(name, "pass" if row["pass"] else "FAIL", json.dumps(brief), flush=True)
        with open(args.out, "w") as fh:  # after every method: a time limit still leaves what was measured
            json.dump(report, fh, indent=1, default=str)
    return 0 if all(r["pass"] for r in report["methods"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
