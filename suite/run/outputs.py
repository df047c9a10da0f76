"""What a run leaves besides its record, when asked: tracker logs, the fine-tuned model, test-set predictions.

`RunOutputs` travels with the job (`RunConfig.outputs`, never hashed: these files do not change a run's numbers) to
whichever worker runs it; `RunHooks` does the work inside `run_one`. Files go next to the record:
`OUT/runs/STEM.model/` (weights + tokenizer) and `OUT/runs/STEM.test/NAME.tsv`, and the record's `artifacts`
names them; tracker logs go under `OUT/tracking/`.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class RunOutputs:
    root: str                        # the output folder (OUT)
    save_model: bool = False
    predict_test: bool = False
    report_to: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.save_model or self.predict_test or bool(self.report_to)


def artifact_path(root: str | Path, filename: str, kind: str) -> Path:
    """OUT/runs/STEM.KIND for the record OUT/runs/STEM.json (kind: model, test)."""
    return Path(root) / "runs" / f"{filename[:-len('.json')]}.{kind}"


class RunHooks:
    """Called by the runner: `chain` wraps its per-epoch callback, `finished` sees the trained model, `close`
    completes the record. Inert for a job without outputs."""

    def __init__(self, job):
        self.job = job
        self.outputs: RunOutputs | None = getattr(job, "outputs", None)
        self.artifacts: dict[str, Any] = {}
        self.tracking = None

    def _tracking(self):
        if self.tracking is None:
            from suite.run.tracking import RunTracking

            self.tracking = RunTracking(self.outputs.report_to, Path(self.outputs.root) / "tracking",
                                        self.job.filename[:-len(".json")], self.job.to_dict())
        return self.tracking

    def chain(self, on_epoch: Callable[[dict], None] | None) -> Callable[[dict], None] | None:
        if not (self.outputs and self.outputs.report_to):
            return on_epoch

        def both(entry: dict) -> None:
            self._tracking().epoch(entry)
            if on_epoch:
                on_epoch(entry)

        return both

    def finished(self, model, tokenizer, spec, data_dir, device, amp_dtype) -> None:
        """After training (with the selected epoch's weights in place): save the model, predict the test sets."""
        if not self.outputs:
            return
        from suite.run.test_predictions import predict_test, save_checkpoint

        if self.outputs.save_model:
            folder = artifact_path(self.outputs.root, self.job.filename, "model")
            save_checkpoint(folder, model, tokenizer, self.job)
            self.artifacts["model"] = folder.name
        if self.outputs.predict_test:
            folder = artifact_path(self.outputs.root, self.job.filename, "test")
            t = self.job.train
            found = predict_test(model, tokenizer, spec, data_dir, folder, t.max_length, t.eval_batch_size, device,
                                 amp_dtype)
            self.artifacts["test_predictions"] = {name: f"{folder.name}/{file}"
                                                  for name, file in found["files"].items()}
            if found["absent"]:
                self.artifacts["test_sets_absent"] = found["absent"]

    def close(self, record) -> None:
        """Final metrics to the trackers (a failed run is logged as failed) and the artifacts into the record."""
        if self.outputs and self.outputs.report_to:
            try:
                self._tracking().finish(record)
            except Exception as exc:  # noqa: BLE001  a tracker's trouble must not lose the record
                warnings.warn(f"{record.label}: tracking failed ({type(exc).__name__}: {exc})", stacklevel=2)
                self.artifacts["tracking_error"] = f"{type(exc).__name__}: {exc}"
        if self.artifacts:
            record.artifacts = dict(self.artifacts)
