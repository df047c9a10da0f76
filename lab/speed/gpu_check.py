"""GPU acceptance check of the suite: one command for a user with a CUDA GPU.

    python lab/speed/gpu_check.py --data-dir ../shared/data/glue --out gpu_check.json

Run by this project on one GPU so far: an NVIDIA H200 (2026-11-26; results/gpu/README.md has its report and what
it found, a bug that killed every run sharing a GPU, fixed since). The tolerances below are set from that run's
margins; other GPUs, several GPUs and Ray have not been run. Please send the JSON report (and the console output) of
a run, passing or failing.

What it checks, each step reported as pass / fail with its numbers:
1. every registered method against the CPU: the packaged MiniLM with the method attached (the same seed on both
   devices), on 16 real dev examples of RTE, in eval mode (dropout of every kind off, so both devices compute the
   same function): the logits and the gradient of the loss, CUDA fp32 (TF32 off: the arithmetic itself is compared;
   runs turn TF32 on) and CUDA bf16 autocast against CPU fp32. Tolerances: fp32, max |logit difference| <= 1e-4 and
   relative L2 gradient difference <= 1e-3 (the H200: at most 3.1e-7 and 2.4e-5); bf16, 2e-2 and 1e-1 (the H200: at
   most 3.3e-3, and 0.016 for every method but the three below). Sparsemax, ReLA and top-k get a bf16 gradient
   tolerance of 0.3 (`SPARSE_BF16_GRAD`): their attention's derivative jumps where a score crosses the support's
   threshold, so a bf16 rounding that moves a score across it changes the gradient, and their bf16 gradients are
   far from fp32's on any device (the H200: 0.13, 0.12 and 0.049; bf16 autocast on the CPU against CPU fp32: 0.15,
   0.12 and 0.050, results/gpu/cpu_bf16_vs_fp32.json). The entmaxes are sparse too, but continuously
   differentiable at that threshold, and stay within 0.1 (0.016).
   Then a few training steps on CUDA in each precision (training draws its random masks on the GPU, which no CPU
   run can reproduce): the loss stays finite and the weights move.
2. a 2-worker local pool on the GPU(s) (two runs sharing a GPU get a memory cap of half of it);
3. the Ray executor with --gpus-per-run 0.5 (skipped, and said so, when Ray is not installed);
4. one AttendOut run: its generator must take optimizer steps (g_updates > 0; a device comparison bug once reset it
   at every step on CUDA);
5. the MFU of vanilla BERT-base-shaped training on real padded GLUE batches (lab/speed/mfu.py), bf16.
The report (--out) holds every number, each method's tolerances, the GPU and the versions.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

NOTICE = ("gpu_check.py has run on one GPU model so far (an NVIDIA H200); please report the JSON output whether it "
          "passes or fails")
TOLERANCES = {"fp32": {"logits_max_abs": 1e-4, "grad_rel_l2": 1e-3}, "bf16": {"logits_max_abs": 2e-2,
                                                                             "grad_rel_l2": 1e-1}}
SPARSE_ATTENTION = ("sparsemax", "rela", "topk")  # exact zeros in the attention: bf16 moves the support
SPARSE_BF16_GRAD = 0.3
NO_CUDA = 3  # exit code without a CUDA device
DEVICE = "cuda"  # what is checked against the CPU (a CPU smoke test of the script itself sets "cpu")


def dev_batch(data_dir: str, n: int = 16, max_length: int = 128):
    """n real RTE dev examples, padded as the suite pads them, and the tokenizer's model name."""
    from transformers import AutoTokenizer

    from suite.api.tasks import get_task
    from suite.run.data import encode, load_splits
    from suite.run.settings import DEFAULT_MODEL, resolve_model

    spec = get_task("rte")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    dev = encode(spec, load_splits(spec, data_dir)[spec.eval_splits[""]], tokenizer, max_length)
    return dev.batch(list(range(min(n, len(dev)))), tokenizer.pad_token_id or 0, spec.is_regression)


def attached_model(method_name: str, device: torch.device):
    from transformers import AutoModelForSequenceClassification

    from suite.api.attention import METHODS
    from suite.run.settings import DEFAULT_MODEL, resolve_model

    torch.manual_seed(0)  # the same classifier head and method parameters on both devices
    model = AutoModelForSequenceClassification.from_pretrained(resolve_model(DEFAULT_MODEL), num_labels=2)
    METHODS.get(method_name)().attach(model)
    return model.to(device)


def logits_and_grad(method_name: str, batch: dict, device: torch.device, amp: torch.dtype | None):
    model = attached_model(method_name, device).eval()  # eval: no random draws, the same function on both devices
    batch = {k: v.to(device) for k, v in batch.items()}
    with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        out = model(**batch)
    out.loss.float().backward()
    grad = torch.cat([p.grad.float().flatten().cpu() for p in model.parameters() if p.grad is not None])
    return out.logits.float().detach().cpu(), grad


def train_steps(method_name: str, batch: dict, device: torch.device, amp, steps: int) -> dict:
    from suite.api.attention import StepContext, attention_modules

    model = attached_model(method_name, device).train()
    method = next(iter(attention_modules(model))).suite_method
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    ctx = StepContext(model, method, optimizer, scheduler, device, amp, 1.0, total_steps=steps)
    method.setup_training(ctx)
    batch = {k: v.to(device) for k, v in batch.items()}
    losses = []
    for _ in range(steps):
        ctx.step += 1
        method.before_step(ctx)  # as the runner steps (DropHead's schedule moves here)
        losses.append(float(method.training_step(ctx, batch, batch)))
    moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
    return {"losses": losses, "finite": all(math.isfinite(x) for x in losses), "max_weight_change": moved,
            "passed": all(math.isfinite(x) for x in losses) and moved > 0}


def tolerance(method_name: str, precision: str) -> dict:
    if precision == "bf16" and method_name in SPARSE_ATTENTION:
        return {**TOLERANCES["bf16"], "grad_rel_l2": SPARSE_BF16_GRAD}
    return TOLERANCES[precision]


def check_methods(data_dir: str, steps: int) -> dict:
    from suite.api.attention import METHODS

    batch, cuda, results = dev_batch(data_dir), torch.device(DEVICE), {}
    for name in METHODS.names():
        entry: dict = {}
        try:
            ref_logits, ref_grad = logits_and_grad(name, batch, torch.device("cpu"), None)
            for precision, amp in (("fp32", None), ("bf16", torch.bfloat16)):
                logits, grad = logits_and_grad(name, batch, cuda, amp)
                diff = float((logits - ref_logits).abs().max())
                rel = float((grad - ref_grad).norm() / ref_grad.norm().clamp_min(1e-12))
                tol = tolerance(name, precision)
                entry[precision] = {"logits_max_abs": diff, "grad_rel_l2": rel, "tolerance": tol,
                                    "training": train_steps(name, batch, cuda, amp, steps)}
                entry[precision]["passed"] = (diff <= tol["logits_max_abs"] and rel <= tol["grad_rel_l2"]
                                              and entry[precision]["training"]["passed"])
            entry["passed"] = all(entry[p]["passed"] for p in ("fp32", "bf16"))
        except Exception as exc:  # noqa: BLE001  one method's failure is a finding, not the end of the check
            entry = {"passed": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        results[name] = entry
        say(f"  {name}: {verdict(entry)}" + "".join(
            f"; {p} |dlogit| {entry[p]['logits_max_abs']:.1e}, grad rel {entry[p]['grad_rel_l2']:.1e}"
            for p in ("fp32", "bf16") if p in entry))
    return {"passed": all(e["passed"] for e in results.values()), "methods": results}


def small_jobs(methods: list[str], seeds: list[int], precision: str = "bf16"):
    from suite.grid.plan import build_grid
    from suite.run.settings import DEFAULT_MODEL, TrainSettings

    train = TrainSettings(epochs=1, batch_size=16, max_train_samples=64, max_eval_samples=64, train_eval_samples=0,
                          precision=precision, stats_batches=0, analyses="none")
    return build_grid([DEFAULT_MODEL], ["rte"], methods, seeds, train)


def grid_check(data_dir: str, executor: str, **options) -> dict:
    from suite.grid.executors import run_grid
    from suite.grid.store import Store

    with tempfile.TemporaryDirectory() as out:
        result = run_grid(small_jobs(["vanilla"], [1, 2]), Store(out), data_dir, executor=executor, quiet=True,
                          device=DEVICE, **options)
    recs = [rec for _, rec in result.done + result.failed]
    facts = [{"status": r.status, "error": r.error, "executor": r.executor.to_json() if r.executor else None,
              "memory_fraction": r.environment.get("memory_fraction"), "gpu": r.environment.get("gpu")}
             for r in recs]
    return {"passed": result.ok and len(result.done) == 2 and all(f["gpu"] for f in facts), "runs": facts}


def check_ray(data_dir: str) -> dict:
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"passed": None, "skipped": "Ray is not installed (pip install '.[ray]')"}
    found = grid_check(data_dir, "ray", gpus_per_run=0.5)
    found["passed"] = found["passed"] and all(f["memory_fraction"] == 0.5 for f in found["runs"])
    return found


def check_attendout(data_dir: str) -> dict:
    from suite.run.runner import run_one

    job = small_jobs(["attendout"], [1])[0]
    rec = run_one(job, data_dir, device=DEVICE, quiet=True)
    updates = (rec.method_record or {}).get("g_updates", 0)
    return {"passed": rec.ok and updates > 0, "status": rec.status, "error": rec.error, "g_updates": updates,
            "cost": (rec.method_record or {}).get("cost")}


def check_mfu(data_dir: str, steps: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mfu

    args = mfu.parser().parse_args(["--data-dir", data_dir, "--steps", str(steps), "--warmup", "10"])
    found = mfu.measure(args)
    return {"passed": math.isfinite(found["achieved_tflops"]), **found}


def verdict(entry: dict) -> str:
    return {True: "pass", False: "FAIL", None: "skipped"}[entry.get("passed")]


def say(text: str) -> None:
    print(text, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="the GLUE folder (RTE is read)")
    p.add_argument("--out", default="gpu_check.json", help="where the JSON report goes")
    p.add_argument("--steps", type=int, default=3, help="training steps per method and precision")
    p.add_argument("--mfu-steps", type=int, default=30)
    args = p.parse_args(argv)
    say(f"NOTE: {NOTICE}")
    if not torch.cuda.is_available():
        print("error: no CUDA device is visible (torch.cuda.is_available() is False): this script checks the suite "
              "on a GPU and has nothing to check here. CPU behaviour is covered by the test suite (pytest).",
              file=sys.stderr)
        return NO_CUDA

    import suite  # noqa: F401  registers the methods
    from suite.run.device import environment

    report = {"notice": NOTICE, "tolerances": TOLERANCES, "sparse_bf16_grad": SPARSE_BF16_GRAD,
              "environment": environment(torch.device("cuda")), "host": platform.node(), "checks": {}}
    checks = [("methods", lambda: check_methods(args.data_dir, args.steps)),
              ("pool_2_workers", lambda: grid_check(args.data_dir, "local", workers=2)),
              ("ray_half_gpu", lambda: check_ray(args.data_dir)),
              ("attendout_g_updates", lambda: check_attendout(args.data_dir)),
              ("mfu_bert_base", lambda: check_mfu(args.data_dir, args.mfu_steps))]
    for name, check in checks:
        say(f"{name} ...")
        start = time.perf_counter()
        try:
            found = check()
        except Exception as exc:  # noqa: BLE001  report it and go on to the next check
            found = {"passed": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        found["seconds"] = time.perf_counter() - start
        report["checks"][name] = found
        say(f"{name}: {verdict(found)}" + (f" ({found['error']})" if found.get("error") else ""))
    report["passed"] = all(c.get("passed") is not False for c in report["checks"].values())
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    say(f"{'PASSED' if report['passed'] else 'FAILED'}; report: {args.out}. {NOTICE}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
