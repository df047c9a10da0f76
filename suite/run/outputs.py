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

from suite.run.layout import OutputFolder, own_folder
from suite.run.record_parts import Artifacts

# what the rest of the suite uses; other names are this module's own
__all__ = ["RunHooks", "RunOutputs", "artifact_path"]


@dataclasses.dataclass(frozen=True)
class RunOutputs:
    root: str                        # the output folder (OUT)
    save_model: bool = False
    predict_test: bool = False
    report_to: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()  # what trackers tag the run with besides its config: study, grid

    @property
    def active(self) -> bool:
        return self.save_model or self.predict_test or bool(self.report_to)


def artifact_path(root: str | Path, filename: str, kind: str) -> Path:
    """OUT/runs/STEM.KIND for the record OUT/runs/STEM.json (kind: model, test)."""
    return OutputFolder(root).artifact(filename, kind)


class RunHooks:
    """Called by the runner: `chain` wraps its per-epoch callback, `finished` sees the trained model, `close`
    completes the record. Inert for a job without outputs."""

    def __init__(self, job):
        self.job = job
        self.outputs: RunOutputs | None = getattr(job, "outputs", None)
        self.artifacts: dict[str, Any] = {}
        self.tracking = None
        self.tracking_error: str | None = None  # the first tracker failure: tracking stops, the run goes on

    def _track(self, call: Callable[[Any], None], label: str) -> None:
        """Call `call(tracking)` unless tracking failed before; a tracker's failure (opening its store, logging) is a
        warning and a note in the record's artifacts, never a failed run."""
        if self.tracking_error is not None:
            return
        try:
            call(self._tracking())
        except Exception as exc:  # noqa: BLE001  a tracker's trouble must not cost the run
            self.tracking_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"{label}: tracking failed and is off for this run ({self.tracking_error})", stacklevel=3)

    def _tracking(self):
        if self.tracking is None:
            from suite.run.tracking import RunTracking

            self.tracking = RunTracking(self.outputs.report_to, OutputFolder(self.outputs.root).tracking,
                                        self.job.filename[:-len(".json")], self.job.to_dict(), dict(self.outputs.tags))
        return self.tracking

    def chain(self, on_epoch: Callable[[dict], None] | None) -> Callable[[dict], None] | None:
        if not (self.outputs and self.outputs.report_to):
            return on_epoch

        def both(entry: dict) -> None:
            self._track(lambda tracking: tracking.epoch(entry), self.job.label)
            if on_epoch:
                on_epoch(entry)

        return both

    def step(self, step: int, values: dict[str, float]) -> None:
        """Every few training steps (suite.run.training.STEP_LOG_BATCHES): the step loss to the trackers."""
        if self.outputs and self.outputs.report_to:
            self._track(lambda tracking: tracking.step(step, values), self.job.label)

    def finished(self, model, tokenizer, spec, data_dir, device, amp_dtype) -> None:
        """After training (with the selected epoch's weights in place): save the model, predict the test sets."""
        if not self.outputs:
            return
        from suite.run.test_predictions import predict_test, save_checkpoint

        if self.outputs.save_model:
            folder = artifact_path(self.outputs.root, self.job.filename, "model")
            digest = save_checkpoint(folder, model, tokenizer, self.job)
            self.artifacts.update(model=folder.name, model_sha256=digest)
        if self.outputs.predict_test:
            folder = artifact_path(self.outputs.root, self.job.filename, "test")
            own_folder(folder)  # links planted in the output folder are replaced, never written through
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
            self._track(lambda tracking: tracking.finish(record), record.label)
            if self.tracking_error is not None:
                self.artifacts["tracking_error"] = self.tracking_error
        if self.artifacts:
            record.artifacts = Artifacts.from_json(dict(self.artifacts), "artifacts")
