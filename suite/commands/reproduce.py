"""`python -m suite reproduce`: train recorded runs again under the installed code and compare what each computed
(scores, losses, attention statistics, data digests, dev and held-out predictions) with its record, so a reader can
check that a published record is what its code computes on their machine."""
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
# what a machine's clock says, not what the run computed; left out wherever they stand (`cost`: a method's in-run
# timing of its own step, AttendOut's)
CLOCK_KEYS = frozenset({"epoch_time_s", "train_samples_per_s", "cost"})
COMPUTED = ("data", "history", "final", "best", "tune", "heldout", "generalisation_gap", "attention", "method_record",
            "baselines", "heldout_baselines", "parameters")
SHOWN = 4  # differences listed per run in the summary (the JSON keeps all)
# a metric of the same predictions may round differently on another CPU (seen: an STS-B correlation, its chance
# baseline's too; numpy and scipy choose vectorised kernels by CPU): numbers this close are not another result
ROUNDING = 1e-12


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, description="Trains each recorded run again from its record's configuration (on the "
                                            "device and with the torch threads the record names) and compares what "
                                            "it computed with the record: exit 0 when every rerun computed the same "
                                            "(bit for bit, or but for last-bit rounding of a number; --exact: bit for "
                                            "bit), 1 when one differs or fails, 2 on bad input (before anything "
                                            "trains). "
                                            "Nothing is written into the runs folders.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="record files (OUT/runs/*.json) or folders of them (OUT, OUT/runs, OUT/tuning/runs)")
    p.add_argument("--sample", type=positive_int, metavar="N", help="rerun N of the ok records, drawn at random")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the --sample draw (default 0)")
    p.add_argument("--data-dir", help="folder of task data (else $SUITE_DATA_DIR, else the hub)")
    p.add_argument("--device", help="cpu, cuda, ... (default: the device each record names)")
    p.add_argument("--json", metavar="FILE", help="also write the comparisons to FILE as JSON (after each run)")
    p.add_argument("--exact", action="store_true",
                   help=f"a number that differs only by rounding (relative change up to {ROUNDING:g}) fails too")


@dataclasses.dataclass(frozen=True)
class Reproduction:
    """One record against its rerun: `differences` (beyond rounding) and `rounding` (numbers within ROUNDING of each
    other) both empty when the rerun computed the same, bit for bit."""
    record: str
    label: str
    recorded: str            # code version and machine of the record
    rerun: str               # and of the rerun
    differences: tuple[str, ...]
    rounding: tuple[str, ...] = ()
    score_change: float | None = None  # the rerun's final score minus the record's
    failed: str | None = None          # the rerun's error

    @property
    def identical(self) -> bool:
        return not self.differences and not self.rounding and self.failed is None

    @property
    def reproduced(self) -> bool:
        """The same results, but for last-bit rounding of numbers."""
        return not self.differences and self.failed is None

    @property
    def result(self) -> str:
        return ("identical" if self.identical else "rerun failed" if self.failed else
                f"{len(self.differences)} difference(s)" if self.differences else
                f"the same but for rounding ({len(self.rounding)} number(s))")


def chosen_records(paths: list[str], sample: int | None, seed: int, device: str | None) -> list[Path]:
    """The ok record files named or found in the folders (or `sample` of them drawn with `seed`), each checked
    before anything trains: its sidecar is there and its device (or `device`) is here."""
    from suite.run.device import pick_device
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
    ok = {}
    for f in dict.fromkeys(files):
        try:
            rec = read_record(f)
        except (OSError, InvalidRecord) as exc:
            raise BadInput(f"{f}: not a readable run record ({exc})") from exc
        if rec.ok:
            ok[f] = rec
        else:
            print(f"skipped {f}: its run failed, so there is nothing to compare", file=sys.stderr)
    chosen = sorted(random.Random(seed).sample(sorted(ok), sample)) if sample is not None and sample < len(ok) \
        else list(ok)
    if not chosen:
        raise BadInput("no ok records to rerun among " + ", ".join(paths))
    for f in chosen:
        if ok[f].predictions and not (f.parent / ok[f].predictions).is_file():
            raise BadInput(f"{f}: its predictions sidecar {ok[f].predictions} is missing from {f.parent}")
        pick_device(device or _device(ok[f].environment))  # BadInput: that device is not here
    return chosen


def _device(environment: dict) -> str:
    return str(environment.get("device", "cpu")).split(":")[0]


def computed(record: dict[str, Any]) -> dict[str, Any]:
    """What a run computed, without what its machine's clock says."""
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in CLOCK_KEYS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return {k: strip(record.get(k)) for k in COMPUTED}


def differences(old: Any, new: Any, path: str = "", tolerance: float = 0.0) -> list[str]:
    """Each place where two records' computed values differ, with both values (and the change of a number); numbers
    within `tolerance` of each other (relative to their size) count as the same."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in dict.fromkeys([*old, *new])
                for d in differences(old.get(k), new.get(k), f"{path}.{k}", tolerance)]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path.lstrip('.')}: {len(old)} entries -> {len(new)}"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]", tolerance)]
    if old == new or (isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)):
        return []
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (old, new))
    if numbers and abs(new - old) <= tolerance * max(1.0, abs(old), abs(new)):
        return []
    change = f" ({new - old:+.3g})" if numbers else ""
    return [f"{path.lstrip('.')}: {old!r} -> {new!r}{change}"]


def prediction_differences(old: dict, new: dict, name: str = "dev predictions") -> list[str]:
    """Where the rerun's per-example arrays (logits, and the rows and labels they belong to) differ from the
    record's sidecar, per split."""
    import numpy as np

    out = []
    for split in dict.fromkeys([*old, *new]):
        for array in dict.fromkeys([*old.get(split, {}), *new.get(split, {})]):
            where = f"{name}{' ' + split if split else ''} {array}"
            a, b = old.get(split, {}).get(array), new.get(split, {}).get(array)
            if a is None or b is None or a.shape != b.shape:
                out.append(f"{where}: shape {getattr(a, 'shape', None)} -> {getattr(b, 'shape', None)}")
            elif not np.array_equal(a, b):
                rows = (a != b).reshape(len(a), -1).any(axis=1)
                text = f"{where}: {int(rows.sum())} of {len(a)} rows differ"
                if array == "logits":
                    text += f" (largest change {float(np.abs(a - b).max()):.3g})"
                    if a.ndim == 2 and a.shape[1] > 1:
                        text += f", {int((a.argmax(-1) != b.argmax(-1)).sum())} predicted labels"
                out.append(text)
    return out


def reproduce(path: Path, data_dir: str | None, device: str | None) -> Reproduction:
    """Train the job of the record at `path` again, with the torch threads it names, and compare."""
    import torch

    from suite.run.record import HELDOUT, heldout_predictions, load_predictions, read_record
    from suite.run.runner import run_one
    from suite.run.settings import RunConfig

    old = read_record(path)
    job = RunConfig.from_dict(old.config)
    threads, before = old.environment.get("cpu_threads"), torch.get_num_threads()
    if isinstance(threads, int) and threads > 0:
        torch.set_num_threads(threads)  # float sums split over other thread counts differ in their last bits
    try:
        new = run_one(job, data_dir=data_dir, device=device or _device(old.environment), quiet=True)
    finally:
        torch.set_num_threads(before)
    recorded, rerun = _where(old.environment), _where(new.environment)
    if not new.ok:
        return Reproduction(str(path), old.label, recorded, rerun, (), failed=(new.error or "failed").splitlines()[0])
    before_run, after_run = computed(old.to_dict()), computed(new.to_dict())
    found = differences(before_run, after_run, tolerance=ROUNDING)
    rounding = [d for d in differences(before_run, after_run) if d not in found]
    arrays = dict(new.prediction_arrays or {})
    if old.predictions:
        sidecar = path.parent / old.predictions
        if old.predictions_sha256 and hashlib.sha256(sidecar.read_bytes()).hexdigest() != old.predictions_sha256:
            found.append(f"{sidecar.name}: not the file the run wrote (its sha256 differs from the record's)")
        found += prediction_differences(load_predictions(sidecar), {k: v for k, v in arrays.items() if k != HELDOUT})
        if old.heldout is not None or HELDOUT in arrays:
            kept = load_predictions(heldout_predictions(sidecar)) if old.heldout is not None else {}
            found += prediction_differences(kept, {"": arrays[HELDOUT]} if HELDOUT in arrays else {},
                                            "held-out predictions")
    elif arrays:
        found.append("predictions: the record kept none, the rerun did")
    try:
        change = float(new.final.score) - float(old.final.score)
    except (TypeError, ValueError):  # a score that is missing
        change = math.nan
    return Reproduction(str(path), old.label, recorded, rerun, tuple(found), tuple(rounding),
                        change if math.isfinite(change) else None)


def _where(env: dict) -> str:
    """A record's code version and machine, in a few words."""
    from suite.run.record_parts import Environment

    e = Environment.of(env)
    chip = e.gpu or e.cpu_text or e.platform
    return f"`{e.git_commit[:12]}` on {e.device} ({chip}), {e.cpu_threads} thread(s)"


def main(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or os.environ.get("SUITE_DATA_DIR")
    files = chosen_records(args.paths, args.sample, args.sample_seed, args.device)
    if args.json:
        _write_json(Path(args.json), [])  # an unwritable file stops here, not after hours of training
    print(f"rerunning {len(files)} recorded run(s) under the installed code; nothing is written into their folders",
          file=sys.stderr)
    results = []
    for i, f in enumerate(files, 1):
        result = reproduce(f, data_dir, args.device)
        results.append(result)
        print(f"[{i}/{len(files)}] {result.label}: {result.result}", file=sys.stderr)
        if args.json:
            _write_json(Path(args.json), results)
    print(summary(results))
    return 0 if all(r.identical if args.exact else r.reproduced for r in results) else 1


def _write_json(path: Path, results: list[Reproduction]) -> None:
    try:
        path.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=1) + "\n")
    except OSError as exc:
        raise BadInput(f"--json {path}: cannot be written ({exc.strerror or exc})") from exc


def summary(results: list[Reproduction]) -> str:
    """A markdown table of the reruns, then each difference."""
    from suite.report.vocabulary import table

    rows = [[r.label, r.recorded, r.rerun, r.result, "–" if r.score_change is None else f"{r.score_change:+.3g}"]
            for r in results]
    lines = [table(rows, ["run", "recorded", "rerun", "result", "final score change"]), ""]
    for r in results:
        if r.failed:
            lines.append(f"- {r.label}: the rerun failed: {r.failed}")
        listed = [*r.differences, *(f"{d} (rounding)" for d in r.rounding)]
        lines += [f"- {r.label}: {d}" for d in listed[:SHOWN]]
        if len(listed) > SHOWN:
            lines.append(f"- {r.label}: and {len(listed) - SHOWN} more (--json keeps them all)")
    same, close = sum(r.identical for r in results), sum(r.reproduced and not r.identical for r in results)
    lines.append(f"{same} of {len(results)} rerun(s) computed what their records say, bit for bit (scores, losses, "
                 "attention statistics, data digests and predictions; times left out)"
                 + (f"; {close} the same but for the last-bit rounding of a number (relative change at most "
                    f"{ROUNDING:g})." if close else "."))
    if any(" on cuda" in r.rerun for r in results):
        lines.append("On a GPU, kernels that are not deterministic (a run without `train.deterministic`) may change "
                     "the last bits of a sum from one run to the next: a small change there is expected.")
    return "\n".join(lines)
