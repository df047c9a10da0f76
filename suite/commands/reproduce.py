"""`python -m suite reproduce`: train recorded runs again under the installed code and compare what each computed
(scores, losses, attention statistics, data digests, dev predictions) with its record, so a reader can check that a
published record is what its code computes on their machine."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

from suite.api.errors import BadInput
from suite.commands.predict import positive_int

COMMAND = "reproduce"
# what a machine's clock says, not what the run computed: keys of these shapes are left out of the comparison
CLOCK_KEYS = ("_s", "_per_s", "time")
COMPUTED = ("data", "history", "final", "best", "tune", "heldout", "generalisation_gap", "attention", "method_record",
            "baselines", "heldout_baselines", "parameters")
SHOWN = 4  # differences listed per run (the rest are counted)


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, description="Trains each recorded run again from its record's configuration (with the "
                                            "torch threads the record names) and compares what it computed with the "
                                            "record: exit 0 when every rerun is identical, 1 when one differs or "
                                            "fails, 2 on bad input. Nothing is written into the runs folders.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="record files (OUT/runs/*.json) or folders of them (OUT, OUT/runs, OUT/tuning/runs)")
    p.add_argument("--sample", type=positive_int, metavar="N", help="rerun N of the ok records, drawn at random")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the --sample draw (default 0)")
    p.add_argument("--data-dir", help="folder of task data (else $SUITE_DATA_DIR, else the hub)")
    p.add_argument("--device", help="cpu, cuda, ... (default: the device each record names)")
    p.add_argument("--json", metavar="FILE", help="also write each comparison to FILE as JSON")


@dataclasses.dataclass(frozen=True)
class Reproduction:
    """One record against its rerun: `differences` empty when the rerun computed the same, bit for bit."""
    record: str
    label: str
    recorded: str            # code version and machine of the record
    rerun: str               # and of the rerun
    differences: tuple[str, ...]
    failed: str | None = None  # the rerun's error

    @property
    def identical(self) -> bool:
        return not self.differences and self.failed is None


def chosen_records(paths: list[str], sample: int | None, seed: int) -> list[Path]:
    """The ok record files named or found in the folders, or `sample` of them drawn with `seed`."""
    from suite.run.record import InvalidRecord, read_record, record_files

    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = record_files(p / "runs" if (p / "runs").is_dir() else p)
            if not found:
                raise BadInput(f"{p}: no run records (expected {p / 'runs'}/*.json or {p}/*.json)")
            files += found
        else:
            raise BadInput(f"{p}: no such record file or folder")
    ok = []
    for f in dict.fromkeys(files):
        try:
            rec = read_record(f)
        except (OSError, InvalidRecord) as exc:
            raise BadInput(f"{f}: not a readable run record ({exc})") from exc
        if rec.ok:
            ok.append(f)
        else:
            print(f"skipped {f}: its run failed, so there is nothing to compare", file=sys.stderr)
    if sample is not None and sample < len(ok):
        ok = sorted(random.Random(seed).sample(ok, sample))
    if not ok:
        raise BadInput("no ok records to rerun among " + ", ".join(paths))
    return ok


def computed(record: dict[str, Any]) -> dict[str, Any]:
    """What a run computed, without what its machine's clock says."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not any(c in k for c in CLOCK_KEYS)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return {k: strip(record.get(k)) for k in COMPUTED}


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Each place where two records' computed values differ, with both values (and the change of a number)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in dict.fromkeys([*old, *new]) for d in differences(old.get(k), new.get(k), f"{path}.{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    if old == new or (isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)):
        return []
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (old, new))
    change = f" ({new - old:+.3g})" if numbers else ""
    return [f"{path.lstrip('.')}: {old!r} -> {new!r}{change}"]


def prediction_differences(old: dict, new: dict | None) -> list[str]:
    """Where the rerun's dev predictions (logits per example) differ from the record's sidecar."""
    import numpy as np

    if new is None:
        return ["dev predictions: the record has them, the rerun kept none"]
    out = []
    for split in dict.fromkeys([*old, *new]):
        name = f"dev predictions{' ' + split if split else ''}"
        a, b = old.get(split, {}).get("logits"), new.get(split, {}).get("logits")
        if a is None or b is None or a.shape != b.shape:
            out.append(f"{name}: shapes {getattr(a, 'shape', None)} -> {getattr(b, 'shape', None)}")
        elif not np.array_equal(a, b):
            rows = (a != b).reshape(len(a), -1).any(axis=1)
            flipped = int((a.argmax(-1) != b.argmax(-1)).sum()) if a.ndim == 2 and a.shape[1] > 1 else None
            out.append(f"{name}: {int(rows.sum())} of {len(a)} rows' logits differ (largest change "
                       f"{float(np.abs(a - b).max()):.3g})" + (f", {flipped} predicted labels" if flipped is not None
                                                              else ""))
    return out


def reproduce(path: Path, data_dir: str | None, device: str | None) -> Reproduction:
    """Train the job of the record at `path` again, with the torch threads it names, and compare."""
    import torch

    from suite.run.device import environment, pick_device
    from suite.run.record import load_predictions, read_record
    from suite.run.runner import run_one
    from suite.run.settings import RunConfig

    old = read_record(path)
    job = RunConfig.from_dict(old.config)
    device = device or str(old.environment.get("device", "cpu")).split(":")[0]
    threads = old.environment.get("cpu_threads")
    before = torch.get_num_threads()
    if isinstance(threads, int) and threads > 0:
        torch.set_num_threads(threads)  # float sums split over threads differ in their last bits
    try:
        new = run_one(job, data_dir=data_dir, device=device, quiet=True)
    finally:
        torch.set_num_threads(before)
    recorded, rerun = _where(old.environment), _where(environment(pick_device(device)) | {
        "cpu_threads": threads or before})
    if not new.ok:
        return Reproduction(str(path), old.label, recorded, rerun, (), (new.error or "failed").splitlines()[0])
    found = differences(computed(old.to_dict()), computed(new.to_dict()))
    if old.predictions:
        sidecar = path.parent / old.predictions
        if old.predictions_sha256 and hashlib.sha256(sidecar.read_bytes()).hexdigest() != old.predictions_sha256:
            found.append(f"{sidecar.name}: not the file the run wrote (its sha256 differs from the record's)")
        found += prediction_differences(load_predictions(sidecar), new.prediction_arrays)
    return Reproduction(str(path), old.label, recorded, rerun, tuple(found))


def _where(env: dict) -> str:
    """A record's code version and machine, in a few words."""
    from suite.run.record_parts import Environment

    e = Environment.of(env)
    chip = e.gpu or e.cpu_text or e.platform
    return f"`{e.git_commit[:12]}` on {e.device} ({chip}), {e.cpu_threads} thread(s)"


def main(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or os.environ.get("SUITE_DATA_DIR")
    files = chosen_records(args.paths, args.sample, args.sample_seed)
    print(f"rerunning {len(files)} recorded run(s) under the installed code; nothing is written into their folders",
          file=sys.stderr)
    results = []
    for i, f in enumerate(files, 1):
        result = reproduce(f, data_dir, args.device)
        verdict = "identical" if result.identical else "failed" if result.failed else "differs"
        print(f"[{i}/{len(files)}] {result.label}: {verdict}", file=sys.stderr)
        results.append(result)
    print(summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")
    return 0 if all(r.identical for r in results) else 1


def summary(results: list[Reproduction]) -> str:
    """A markdown table of the reruns, then each difference."""
    from suite.report.vocabulary import table

    rows = [[r.label, r.recorded, r.rerun, "identical" if r.identical else "rerun failed" if r.failed
             else f"{len(r.differences)} difference(s)"] for r in results]
    lines = [table(rows, ["run", "recorded", "rerun", "result"]), ""]
    for r in results:
        if r.failed:
            lines.append(f"- {r.label}: the rerun failed: {r.failed}")
        for d in r.differences[:SHOWN]:
            lines.append(f"- {r.label}: {d}")
        if len(r.differences) > SHOWN:
            lines.append(f"- {r.label}: and {len(r.differences) - SHOWN} more")
    same = sum(r.identical for r in results)
    lines.append(f"{same} of {len(results)} rerun(s) computed what their records say, bit for bit (scores, losses, "
                 "attention statistics, data digests and dev predictions; times left out).")
    return "\n".join(lines)
