"""The run record is read in one place: `suite.run.record` (its reader, its typed fields and the rules that read them).
Every other product module (the runner and the rest of suite.run, the grid, the statistics, the report, the commands)
reads typed fields and never indexes the record's JSON, so a rule about the record (the split a run is scored on, its
tuning-split score, what counts as a record at all) cannot be written twice and drift."""
from __future__ import annotations

import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READERS = ("run", "grid", "stats", "report", "commands", "profiling")
OWNERS = ("record.py", "record_parts.py", "record_codec.py")   # suite/run's modules that define the record
FIELDS = ("config|final|best|tune|heldout|heldout_baselines|timing|data|parameters|attention|method_record|"
          "baselines|provenance|analyses|artifacts|executor|environment|history")
# `rec["final"]`, `record.get("config")`, `rec.final["score"]`, `rec.timing.get("steps")`, `rec["_path"]`,
# `rec.history[-1]["dev"]`
INDEXING = re.compile(rf"\b(?:rec|record|run_record)(?:\.(?:{FIELDS})(?:\[-?\d+\])?)?\s*(?:\[\s*[\"']|\.get\(\s*[\"'])")


def indexing_sites(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if INDEXING.search(line)]


def test_no_reader_indexes_the_records_json():
    found = {}
    for layer in READERS:
        for path in sorted((ROOT / "suite" / layer).rglob("*.py")):
            if layer == "run" and path.parent.name == "run" and path.name in OWNERS:
                continue
            if sites := indexing_sites(path.read_text()):
                found[str(path.relative_to(ROOT))] = sites
    assert not found, f"read these through RunRecord's typed fields (rec.final.score, rec.timing.steps, ...): {found}"


def test_no_lab_script_indexes_the_records_json():
    """The lab's scripts read records as the product does; lab/speed/side_by_side.py alone reads raw JSON, since it
    imports no suite (each side runs its own revision, possibly older than this reader)."""
    found = {str(path.relative_to(ROOT)): sites for path in sorted((ROOT / "lab").rglob("*.py"))
             if path.name != "side_by_side.py" and (sites := indexing_sites(path.read_text()))}
    assert not found, f"read these through read_record / iter_records and typed fields: {found}"


def test_the_check_sees_record_indexing():
    """The check above must be able to fail: each way records were indexed before is found, typed reads are not."""
    for line in ('score = rec["final"]["score"]', "cfg = record.get('config') or {}", 'rec.final["score"] * 100',
                 'steps = (rec.timing.get("steps"))', 'Path(rec["_path"]).parent', 'math.isfinite(rec.final["score"])',
                 'rec.data["tune"] = len(data.tune)', 'rec.history[-1]["method"]'):
        assert indexing_sites(line), line
    for line in ("rec.scored.metrics.score", "rec.final.score", "rec.task", "records[key]", "facts.baselines.get(t)",
                 "rec.data.tune", "rec.history[-1].method", "rec.method_record.get(k)"):
        assert not indexing_sites(line), line


def _record(**fields):
    from suite.run.record import RunRecord
    from suite.run.settings import RunConfig, TrainSettings

    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())  # a reader holds a record against its own hash
    return RunRecord.from_dict({"config": job.to_dict(), "hash": job.hash, "label": "rte/vanilla/seed1",
                                "status": "ok", "final": {"score": 0.6}, "history": [{"epoch": 1}],
                                "baselines": {"majority": {"score": 0.5}}, **fields})


def test_a_run_is_scored_on_its_held_out_split_when_it_kept_one_else_on_dev(tmp_path):
    """One rule (`RunRecord.scored`) and one outcome (`RunOutcome.of`) for the looks, the power table and the
    report: the held-out test split's score and predictions when the run kept one."""
    from suite.stats.evidence import RunOutcome

    dev = _record(predictions="r.predictions.npz")
    held = _record(predictions="r.predictions.npz", heldout={"score": 0.7},
                   heldout_baselines={"majority": {"score": 0.55}})
    assert (dev.scored.name, dev.scored.metrics.score, dev.scored.baseline.constant) == ("dev", 0.6, 0.5)
    assert (held.scored.name, held.scored.metrics.score, held.scored.baseline.constant) == ("heldout", 0.7, 0.55)
    assert RunOutcome.of(dev, tmp_path) == RunOutcome(60.0, str(tmp_path / "r.predictions.npz"))
    assert RunOutcome.of(held, tmp_path) == RunOutcome(70.0, f"{tmp_path / 'r.predictions.npz'}#heldout")
    assert RunOutcome.of(_record(), tmp_path).predictions is None


def test_the_tuning_split_score_is_a_number_only_for_a_finished_run_that_recorded_one():
    """The grid selects by it and the report checks the selection by it: one rule (`RunRecord.tune_score`)."""
    import math

    assert _record(tune={"score": 0.8}).tune_score == 0.8
    for rec in (_record(), _record(tune={"score": None}), _record(tune={})):
        assert math.isnan(rec.tune_score)
    failed = _record(tune={"score": 0.8})
    failed.status = "failed"
    assert math.isnan(failed.tune_score)


def test_the_reader_names_what_is_no_record_and_keeps_an_unscored_run_for_the_report(tmp_path):
    import json
    import math

    import pytest

    from suite.run.record import InvalidRecord, read_record

    path = tmp_path / "r.json"
    data = _record().to_dict()
    path.write_text(json.dumps({**data, "timing": {"step_s": "fast"}}))
    with pytest.raises(InvalidRecord, match=r"r\.json: timing\.step_s is a JSON str"):
        read_record(path)
    path.write_text(json.dumps({**data, "final": {"score": None}}))   # constant predictions: no correlation
    with pytest.raises(InvalidRecord, match="final score"):
        read_record(path)   # a grid runs the job again
    assert math.isnan(read_record(path, unscored=True).final.score)   # the report shows it as "no score"
    for bad, where in (({"tune": {"score": True}}, "tune.score"), ({"tune": [0.8]}, "tune"),
                       ({"history": [{"epoch": 1, "dev": {"score": "0.5"}}]}, r"history\[0\]\.dev\.score"),
                       ({"executor": {"attempts": 1.5}}, "executor.attempts")):
        path.write_text(json.dumps({**data, **bad}))
        with pytest.raises(InvalidRecord, match=rf"r\.json: {where} is a JSON"):
            read_record(path)   # a hand-edited leaf of another type: no record, named where it is


def _written_back(path: Path) -> bytes:
    from suite.grid.store import record_json
    from suite.run.record import read_record

    return record_json(read_record(path).to_dict())


def test_a_published_record_read_and_written_back_is_the_same_bytes():
    """Typed to its leaves, a record still writes back exactly as it was read (keys in order, ints as ints, nulls as
    nulls): a sample of each published runs folder (every record, checked by hand: docs/records.md)."""
    folders = sorted(p for p in (ROOT / "results").rglob("runs") if p.is_dir())
    assert len(folders) >= 5, folders
    for folder in folders:
        files = sorted(folder.glob("*.json"))
        for path in {*files[::40], files[-1]}:   # ~35 of the ~1,000 (each folder's first and last among them)
            assert _written_back(path) == path.read_bytes(), path


def test_keys_the_suite_does_not_define_survive_a_read_and_a_write(tmp_path):
    """An older or a newer writer's keys (at the top, inside a part, inside an epoch) are kept where they were, and a
    field set after reading is written after them."""
    import json

    from suite.run.record import read_record
    from suite.run.record_parts import Artifacts

    data = {"from_the_future": [1, {"a": None}], **_record().to_dict()}
    data["timing"] = {"steps": 3, "energy_j": 12.5, "step_s": 1}
    data["history"] = [{"epoch": 1, "grad_norm": 0.3, "dev": {"score": 0.6}}]
    path = tmp_path / "r.json"
    path.write_bytes(json.dumps(data, indent=1).encode())
    assert _written_back(path) == path.read_bytes()
    rec = read_record(path)
    assert rec.timing.steps == 3 and rec.timing.step_s == 1 and rec.timing.unknown == {"energy_j": 12.5}
    assert math.isnan(rec.timing.train_s)   # not recorded
    rec.artifacts = Artifacts(model="m")
    assert list(rec.to_dict()) == [*data, "artifacts"] and rec.to_dict()["artifacts"] == {"model": "m"}


def test_a_newer_suites_record_is_named_newer_before_its_parts_are_read(tmp_path):
    """A newer suite may type a part otherwise: its record must still read as newer (kept, never rerun and
    replaced), not as a hand-edited one."""
    import json

    import pytest

    from suite.run.record import RECORD_VERSION, NewerRecord, read_record

    path = tmp_path / "r.json"
    path.write_text(json.dumps({**_record().to_dict(), "version": RECORD_VERSION + 1, "timing": {"steps": "many"}}))
    with pytest.raises(NewerRecord, match="newer than this suite reads"):
        read_record(path)
