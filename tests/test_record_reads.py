"""The run record is read in one place: `suite.run.record` (its reader and typed accessors). The readers above it (the
grid, the statistics, the report, the commands) never index its JSON, so a rule about the record (the split a run is
scored on, its tuning-split score, what counts as a record at all) cannot be written twice and drift."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READERS = ("grid", "stats", "report", "commands", "profiling")   # the layers above suite.run
FIELDS = ("config|final|best|tune|heldout|heldout_baselines|timing|data|parameters|attention|method_record|"
          "baselines|provenance|analyses|artifacts|executor|environment|history")
# `rec["final"]`, `record.get("config")`, `rec.final["score"]`, `rec.timing.get("steps")`, `rec["_path"]`
INDEXING = re.compile(rf"\b(?:rec|record|run_record)(?:\.(?:{FIELDS}))?\s*(?:\[\s*[\"']|\.get\(\s*[\"'])")


def indexing_sites(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if INDEXING.search(line)]


def test_no_reader_indexes_the_records_json():
    found = {}
    for layer in READERS:
        for path in sorted((ROOT / "suite" / layer).rglob("*.py")):
            if sites := indexing_sites(path.read_text()):
                found[str(path.relative_to(ROOT))] = sites
    assert not found, f"read these through suite.run.record's accessors (RunRecord.scored, .dev, ...): {found}"


def test_the_check_sees_record_indexing():
    """The check above must be able to fail: each way records were indexed before is found, typed reads are not."""
    for line in ('score = rec["final"]["score"]', "cfg = record.get('config') or {}", 'rec.final["score"] * 100',
                 'steps = (rec.timing.get("steps"))', 'Path(rec["_path"]).parent'):
        assert indexing_sites(line), line
    for line in ("rec.scored.metrics.score", "rec.dev.score", "rec.task", "records[key]", "facts.baselines.get(t)"):
        assert not indexing_sites(line), line


def _record(**fields):
    from suite.run.record import RunRecord

    return RunRecord({"task": "rte", "method": "vanilla", "seed": 1}, "abc", "rte/vanilla/seed1", "ok",
                     final={"score": 0.6}, history=[{"epoch": 1}], baselines={"majority": {"score": 0.5}}, **fields)


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
    for rec in (_record(), _record(tune={"score": True}), _record(tune={"score": None}), _record(tune=[0.8])):
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
    assert math.isnan(read_record(path, unscored=True).dev.score)   # the report shows it as "no score"
