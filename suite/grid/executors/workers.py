"""What every executor shares: the modules its workers import, the retry budget for dead workers, the facts a
record carries about where it ran, and the fall-back from captured steps to eager ones (a job whose capture failed
runs again with capture off, in a fresh process; a failed self-test at the grid's start turns capture off for all).

Workers import the modules that registered the grid's methods by name, so a method must live in an importable module
(built in, an installed plugin, or a module on the workers' PYTHONPATH), not in the driver's `__main__` script.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from suite.api.errors import ExecutorError
from suite.run.settings import RunConfig

# what the rest of the suite uses; other names are this module's own
__all__ = ["DEFAULT_MAX_RETRIES", "capture_self_test", "executor_info", "import_method_modules", "method_modules",
           "noted_eager", "rerun_eagerly", "self_test", "without_capture"]

DEFAULT_MAX_RETRIES = 2  # re-runs of a job whose worker process died (not of runs that fail on their own)


def method_modules(jobs: list[RunConfig]) -> list[str]:
    """Modules whose import registers the grid's methods; workers import them before running a job."""
    from suite.api.attention import METHODS

    modules = set()
    for name in {j.method for j in jobs}:
        module = METHODS.get(name).__module__
        if module in ("__main__", "__mp_main__"):
            raise ExecutorError(f"method {name!r} is defined in the script being run, which worker processes "
                                "cannot import: move it into a module (installed, or on PYTHONPATH) and import it")
        modules.add(module)
    return sorted(modules)


def import_method_modules(modules: list[str]) -> None:
    for module in modules:
        importlib.import_module(module)


def executor_info(name: str, **facts: Any) -> dict[str, Any]:
    """The `executor` entry of a record: which executor ran it, in which process, with which GPUs visible."""
    return {"name": name, **facts, "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def without_capture(job: RunConfig) -> RunConfig:
    """The job with train.capture=off: the same record file (capture is never hashed), every step eager."""
    return dataclasses.replace(job, train=dataclasses.replace(job.train, capture="off"))


def rerun_eagerly(job: RunConfig, error: str | None) -> str | None:
    """Why the job runs again eagerly after `error` (the reason its record's step_mode will give), or None when it
    does not: its error is no failed capture (`is_capture_failure`), or it already ran with capture off."""
    from suite.run.device import is_capture_failure

    if not is_capture_failure(error) or job.train.capture == "off":
        return None
    first = error.removeprefix("CaptureFailed: ").split("; a grid runs")[0]
    return f"{first[:300]}; run again in a fresh process with train.capture=off"


def noted_eager(rec, reason: str) -> None:
    """Say in the record why its steps ran eagerly though the study asked for capture (a run that failed before its
    timing was recorded is left as it is)."""
    from suite.run.record_parts import StepMode

    if rec.timing is not None:
        mode = StepMode.from_json({"mode": "eager", "reason": reason}, "timing.step_mode")
        rec.timing = dataclasses.replace(rec.timing, step_mode=mode)


SELF_TEST_TIMEOUT_S = 240  # a subprocess's imports on a loaded CPU, a CUDA context and three tiny steps
_SELF_TEST = "from suite.grid.executors.workers import self_test_main; self_test_main()"


def capture_self_test(jobs: list[RunConfig], device: str, executor: str = "local",
                      address: str | None = None) -> str | None:
    """Why every run of the grid trains eagerly (None: capture stays as the jobs ask). A grid whose jobs may capture,
    on a GPU this machine sees, first captures a tiny step in a subprocess (`self_test`); the
    answer is kept per torch, transformers, GPU model and driver and the suite's code version, under
    $SUITE_CACHE_DIR/capture (default ~/.cache/suite/capture). A remote Ray cluster's GPUs are not this machine's:
    there each job that fails to capture runs again eagerly instead."""
    from suite.run.capture import CAPTURE_FAULT_ENV, fault_injected
    from suite.run.device import device_type, git_commit

    if not any(j.train.capture == "auto" for j in jobs) or executor == "ray" and address:
        return None
    where = device_type(device)
    if where != "cuda" and not fault_injected():
        return None
    facts = {"torch": _version("torch"), "transformers": _version("transformers"), "gpu": _gpu_and_driver(),
             "code": git_commit(), "device": where, "fault": os.environ.get(CAPTURE_FAULT_ENV, "")}
    entry = _cached(facts)
    if entry is None:
        entry = run_self_test(where)
        if entry.pop("cache", True):
            _store(facts, entry)
    if entry["ok"]:
        return None
    return (f"the capture self-test failed at the grid's start on {facts['gpu']} ({entry['error']}): every run of "
            "this grid trains eagerly (train.capture=off)")


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _gpu_and_driver() -> str:
    """The GPUs' models and driver as nvidia-smi names them, without a CUDA context in this process."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        return "; ".join(sorted(set(done.stdout.split("\n")) - {""})) or "no GPU named by nvidia-smi"
    except (OSError, subprocess.SubprocessError):
        return "no GPU named by nvidia-smi"


# signals that stop a process from outside (a crash's SIGSEGV or SIGABRT is the self-test's answer, and is kept)
_STOP_SIGNALS = {int(getattr(signal, name)) for name in ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")
                 if hasattr(signal, name)}


def run_self_test(device: str) -> dict[str, Any]:
    """The self-test's answer, {"ok": bool, "error": ...}; "cache": False where it could not finish (a time-out)."""
    import suite

    root = str(Path(suite.__file__).resolve().parent.parent)  # the suite this process runs, not another install
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        # a session of its own: a signal to the grid's process group (a drain) is not the self-test's to die of
        done = subprocess.run([sys.executable, "-c", _SELF_TEST, device], capture_output=True, text=True, env=env,
                              timeout=SELF_TEST_TIMEOUT_S, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no answer within {SELF_TEST_TIMEOUT_S} s", "cache": False}
    if -done.returncode in _STOP_SIGNALS:  # stopped from outside: no answer about capture, so none is kept
        return {"ok": False, "error": f"its process was ended by signal {-done.returncode}", "cache": False}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"its process exited with code {done.returncode}: {tail[:300]}"}


def _entry_path(facts: dict[str, Any]) -> Path | None:
    from suite.api import startup_cache

    folder = startup_cache.folder()
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return folder.parent / "capture" / f"{digest}.json" if folder is not None else None


def _cached(facts: dict[str, Any]) -> dict[str, Any] | None:
    path = _entry_path(facts)
    try:
        entry = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != facts or not isinstance(entry.get("ok"), bool):
        return None
    return {"ok": entry["ok"], "error": str(entry.get("error", ""))}


def _store(facts: dict[str, Any], entry: dict[str, Any]) -> None:
    path = _entry_path(facts)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.write_text(json.dumps({"key": facts, **entry}))
        os.replace(staging, path)  # atomic: two grids starting together never read half an entry
    except OSError:
        pass  # no cache: the next grid tests again


_SELF_TEST_SHAPE = (8, 32)  # rows and tokens of the self-test's batches: a few seconds on any GPU


def self_test(device: str = "cuda") -> dict:
    """A short capture of the standard step on `device`: a tiny BERT with vanilla attention (dropout on), its first
    step eager, its second captured, a third replayed; bf16 autocast where the GPU computes it. Raises where the
    capture fails; returns the steps' facts."""
    import torch

    from suite.api import tiny_models
    from suite.api.attention import METHODS
    from suite.run.capture import Steps, eager_reason
    from suite.run.device import bf16_native
    from suite.run.settings import TrainSettings
    from suite.run.training import build_context

    dev = torch.device(device)
    model = tiny_models.tiny_model(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1).to(dev)
    method = METHODS.get("vanilla")()
    method.attach(model)
    model.train()
    amp = torch.bfloat16 if dev.type == "cuda" and bf16_native(dev) else None
    reason = eager_reason(method, "auto", dev, amp, False, 1)
    if reason is not None:
        raise RuntimeError(f"the self-test's step would not be captured: {reason}")
    ctx = build_context(model, method, TrainSettings(lr=1e-4), 3, dev, amp, graphs=True)
    steps = Steps(ctx, None)
    rows, width = _SELF_TEST_SHAPE
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        ctx.step += 1
        batch = {"input_ids": torch.randint(5, model.config.vocab_size, (rows, width), generator=generator),
                 "attention_mask": torch.ones(rows, width, dtype=torch.long),
                 "labels": torch.randint(0, 2, (rows,), generator=generator)}
        loss = float(steps({k: v.to(dev) for k, v in batch.items()}, None))
        if not math.isfinite(loss):
            raise RuntimeError(f"the replayed step's loss is {loss}")
    return steps.facts()


def self_test_main() -> None:
    """The self-test's subprocess (`python -c ...`, argument: the device): one JSON line, {"ok": ...}."""
    try:
        facts = self_test(sys.argv[1] if len(sys.argv) > 1 else "cuda")
        print(json.dumps({"ok": True, "facts": facts}))
    except Exception as exc:  # noqa: BLE001  the answer is the error, for the grid's one line
        print(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}))
