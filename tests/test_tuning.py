"""The tuning protocol (`tune:`): equal budgets, selection by the tuning split only (never dev), tuning records kept
apart from the leaderboard, tuning seeds disjoint from the final ones, both stages on the command line."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from suite.api.errors import BadInput
from suite.commands import build_parser, main
from suite.commands.run_options import run_overrides
from suite.grid.resolve import resolve_study
from suite.grid.study import load_study
from suite.grid.tuning import (
    TuningIncomplete,
    budget_text,
    configurations,
    plan_tuning_runs,
    select_configurations,
    selected_jobs,
    tuning_notes,
    write_selection,
)

STUDY = """\
methods: [vanilla, scores_dropout]
tasks: [rte]
seeds: [1, 2]
out: {out}
tune:
  holdout: 6
  seeds: [101, 102, 103]
  budget: 3
  space:
    default: {{train.lr: [1.0e-4, 3.0e-4, 1.0e-3]}}
    scores_dropout: {{scores_dropout.p: [0.05, 0.2]}}
"""


def _study(tmp_path, text=STUDY, **fill) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text.format(out=tmp_path / "out", **fill))
    return path


def _plans(path: Path, *flags):
    args = build_parser().parse_args(["run", "--study", str(path), *flags])
    plan = resolve_study(load_study(args.study), run_overrides(args))
    return plan.request, plan, plan_tuning_runs(plan.request.study.tune, plan.jobs, plan.seeds, plan.request.out)


def test_every_method_gets_the_same_budget_drawn_repeatably(tmp_path):
    request, plan, tuning = _plans(_study(tmp_path))
    per_method = {m: [c for (_, _, method), cands in tuning.cells.items() if method == m for c in cands]
                  for m in ("vanilla", "scores_dropout")}
    assert {m: len(c) for m, c in per_method.items()} == {"vanilla": 3, "scores_dropout": 3}
    assert all(len(c.jobs) == 3 and set(c.jobs) == {101, 102, 103} for cs in per_method.values() for c in cs)
    # scores_dropout's space has 6 points: a seeded draw of 3, the same every time
    assert [c.settings for c in per_method["scores_dropout"]] == configurations(request.study.tune, "scores_dropout")
    assert all(set(c.settings) == {"train.lr", "scores_dropout.p"} for c in per_method["scores_dropout"])
    assert all(j.train.holdout == 6 for j in tuning.jobs + plan.jobs)  # both stages carve the tuning split
    assert tuning.store.runs == tmp_path / "out" / "tuning" / "runs"


def test_a_space_smaller_than_the_budget_is_refused(tmp_path):
    path = _study(tmp_path, STUDY.replace("budget: 3", "budget: 4"))
    with pytest.raises(BadInput, match=r"tune.budget=4: vanilla's space has only 3 configuration"):
        _plans(path)


def test_tuning_seeds_must_differ_from_the_final_ones(tmp_path, capsys):
    path = _study(tmp_path)
    assert main(["run", "--study", str(path), "--seeds", "2,102", "--dry-run"]) == 2
    assert "tune.seeds and the final grid's seeds share 102" in capsys.readouterr().err


@pytest.mark.parametrize("tune, message", [
    ("{holdout: 6, seeds: [9], budget: 1, space: {default: {train.lr: [1]}}, budgte: 2}",
     "unknown key 'tune.budgte' (did you mean 'budget'?)"),
    ("{holdout: 6, seeds: [9], budget: 1, space: {default: {scores_dropout.p: [0.1]}}}",
     "tune.space.default.scores_dropout.p: the default space holds training settings"),
    ("{holdout: 6, seeds: [9], budget: 1, space: {vanila: {train.lr: [1]}}}", "vanila"),
    ("{holdout: 6, seeds: [9], budget: 1, space: {default: {train.holdout: [3]}}}", "cannot be searched"),
    ("{holdout: 6, seeds: [9], budget: 0, space: {default: {train.lr: [1]}}}", "tune.budget"),
])
def test_bad_tune_blocks_name_file_and_key(tmp_path, tune, message):
    path = tmp_path / "study.yaml"
    path.write_text(f"methods: [vanilla]\ntasks: [rte]\ntune: {tune}\n")
    with pytest.raises(BadInput) as info:
        load_study(path)
    assert message in str(info.value) and str(path) in str(info.value)


def _write_record(store, job, tune_score: float, dev_score: float, ok: bool = True):
    from suite.run.record import RunRecord
    from suite.run.record_parts import Epoch, Metrics

    rec = RunRecord.started_now(job)
    if ok:
        rec.status, rec.final = "ok", Metrics.from_json({"score": dev_score})
        rec.tune = Metrics.from_json({"score": tune_score})
        rec.history = (Epoch(epoch=1, dev=rec.final, tune=rec.tune),)
    store.runs.mkdir(parents=True, exist_ok=True)
    store.write(job.filename, rec)


def test_selection_reads_the_tuning_split_never_dev(tmp_path):
    """Planted: the configuration with the best dev score has the worst tuning score. The tuning score wins."""
    _, plan, tuning = _plans(_study(tmp_path))
    for cands in tuning.cells.values():
        for i, c in enumerate(cands):  # configuration 0: best on the tuning split; the last: best on dev
            for job in c.jobs.values():
                _write_record(tuning.store, job, tune_score=0.9 - 0.1 * i, dev_score=0.1 + 0.2 * i)
    selection = select_configurations(tuning)
    for cell in selection["cells"]:
        assert cell["selected"] == cell["configurations"][0]["settings"]
        assert cell["configurations"][0]["mean"] == pytest.approx(0.9)
    final = selected_jobs(plan.jobs, selection)
    lrs = {j.method: j.train.lr for j in final}
    assert lrs == {m: tuning.cells[("minilm", "rte", m)][0].settings["train.lr"] for m in lrs}
    assert sorted({j.seed for j in final}) == [1, 2]
    path = write_selection(tuning, selection)
    assert json.loads(path.read_text())["protocol"]["scored_on"].startswith("tuning split")


def test_failed_and_missing_tuning_runs(tmp_path):
    _, plan, tuning = _plans(_study(tmp_path))
    cands = tuning.cells[("minilm", "rte", "vanilla")]
    for job in cands[0].jobs.values():  # the better configuration diverged on one seed: it cannot be selected
        _write_record(tuning.store, job, 0.99, 0.5, ok=job.seed == 101)
    for job in [*cands[1].jobs.values(), *cands[2].jobs.values()]:
        _write_record(tuning.store, job, 0.6 if job in cands[1].jobs.values() else 0.5, 0.5)
    cells = {c["method"]: c for c in select_configurations(tuning)["cells"]}
    assert cells["vanilla"]["selected"] == cands[1].settings
    assert "have no record yet" in cells["scores_dropout"]["reason"]
    with pytest.raises(TuningIncomplete, match="scores_dropout"):
        selected_jobs(plan.jobs, select_configurations(tuning))


def test_tuning_records_never_reach_the_leaderboard(tmp_path):
    from suite.grid.store import Store
    from suite.report.load import load
    from tests.conftest import fake_ok_record

    _, plan, tuning = _plans(_study(tmp_path))
    for job in tuning.jobs:
        _write_record(tuning.store, job, 0.7, 0.7)
    final = Store(tmp_path / "out")
    for job in plan.jobs:
        final.write(job.filename, fake_ok_record(job))
    frame = load([tmp_path / "out"]).frame
    assert len(frame) == len(plan.jobs) and set(frame["seed"]) == {1, 2}


def test_dry_run_shows_both_stages(tmp_path, capsys):
    assert main(["run", "--study", str(_study(tmp_path)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage 1: tuning" in out and "stage 2: final grid, after tuning" in out
    assert "18 tuning jobs (0 with ok records); 4 final jobs" in out


def test_two_stages_run_end_to_end_and_resume(tmp_path, tiny_bert_dir, glue_dir, capsys):
    path = tmp_path / "study.yaml"
    path.write_text(f"""\
methods: [vanilla]
tasks: [rte]
seeds: [1]
model: null
models: [{tiny_bert_dir}]
data_dir: {glue_dir}
out: {tmp_path / 'out'}
train: {{epochs: 1, batch_size: 8, max_length: 32, train_eval_samples: 0, stats_batches: 0, analyses: none}}
tune:
  holdout: 6
  seeds: [101]
  budget: 2
  space:
    default: {{train.lr: [1.0e-4, 1.0e-3]}}
""".replace("model: null\n", ""))
    assert main(["run", "--study", str(path), "--quiet"]) == 0
    out = tmp_path / "out"
    assert len(list((out / "tuning" / "runs").glob("*.json"))) == 2
    finals = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    selection = json.loads((out / "tuning" / "selection.json").read_text())
    chosen = {c["method"]: c["selected"]["train.lr"] for c in selection["cells"]}
    assert {r["config"]["method"]: r["config"]["train"]["lr"] for r in finals} == chosen
    assert all(r["status"] == "ok" and r["config"]["seed"] == 1 and "tune" in r for r in finals)
    capsys.readouterr()
    assert main(["run", "--study", str(path), "--quiet"]) == 0  # resumes both stages: nothing runs again
    assert "2 skipped" in capsys.readouterr().err
    from suite.report.load import load
    from suite.report.stage_sections import tuning

    text = "\n".join(tuning(SimpleNamespace(loaded=load([out])), None).lines)
    assert "## Tuning" in text and text.count("✓") == 1 and "train.lr: 0.0001, 0.001" in text


def test_early_stopping_and_the_best_epoch_read_the_tuning_split_never_dev(tiny_bert_dir, glue_dir, monkeypatch):
    """Planted per-epoch scores: dev is best at epoch 1, the tuning split at epoch 2 and never again. The run stops
    two epochs after epoch 2 and ends with epoch 2's model, whatever dev says."""
    import dataclasses

    from suite.run import training
    from suite.run.runner import TokenizedCache, run_one
    from suite.run.settings import RunConfig, TrainSettings

    planted = {"tune": iter([0.2, 0.9, 0.5, 0.4, 0.3, 0.3]), "dev": iter([0.9, 0.1, 0.2, 0.3, 0.4, 0.5])}
    real = training.evaluate

    def scripted(model, enc, spec, *args, **kwargs):
        e = real(model, enc, spec, *args, **kwargs)
        kind = "tune" if len(enc) == 6 else "dev"  # glue_dir's RTE: 12 dev rows, a tuning split of 6
        return dataclasses.replace(e, metrics={"accuracy": next(planted[kind])})

    monkeypatch.setattr(training, "evaluate", scripted)
    t = TrainSettings(epochs=6, batch_size=8, max_length=32, train_eval_samples=0, stats_batches=0, analyses="none",
                      holdout=6, early_stopping_patience=2, select_epoch="best")
    rec = run_one(RunConfig(tiny_bert_dir, "rte", "vanilla", {"p": 0.1}, 1, t), glue_dir, device="cpu", quiet=True,
                  cache=TokenizedCache())
    assert rec.ok, rec.error
    assert [h.tune.score for h in rec.history] == [0.2, 0.9, 0.5, 0.4]
    assert rec.final.score == 0.1 and rec.tune.score == 0.9


def test_a_run_narrowed_to_some_methods_writes_every_cells_selection(tmp_path, glue_dir, monkeypatch, capsys):
    """`--methods vanilla` then `--methods scores_dropout`: the selection file is made from the whole study's tuning
    records each time, so it names scores_dropout's cell as waiting after the first run and holds both after the
    second (neither dropped, nor kept from an older file)."""
    from conftest import fake_ok_record

    from suite.run.record_parts import Metrics

    def fake(job, *args, **kwargs):
        rec = fake_ok_record(job)
        rec.tune = Metrics.from_json({"score": 0.6 + job.train.lr})
        return rec

    monkeypatch.setattr("suite.run.runner.run_one", fake)
    path = _study(tmp_path, STUDY + f"data_dir: {glue_dir}\n")
    selection = tmp_path / "out" / "tuning" / "selection.json"
    assert main(["run", "--study", str(path), "--methods", "vanilla", "--quiet"]) == 0
    cells = {c["method"]: c for c in json.loads(selection.read_text())["cells"]}
    assert cells["vanilla"]["selected"]["train.lr"] == 1e-3 and cells["scores_dropout"]["selected"] is None
    assert "have no record yet" in cells["scores_dropout"]["reason"]
    finals = {p.name for p in (tmp_path / "out" / "runs").glob("*.json")}
    assert finals and all("vanilla" in name for name in finals)
    assert main(["run", "--study", str(path), "--methods", "scores_dropout", "--quiet"]) == 0
    order = [c["method"] for c in json.loads(selection.read_text())["cells"]]
    cells = {c["method"]: c for c in json.loads(selection.read_text())["cells"]}
    assert cells["vanilla"]["selected"]["train.lr"] == 1e-3 and cells["scores_dropout"]["selected"] is not None
    assert order == ["vanilla", "scores_dropout"]  # the study's order, whichever part ran last


def _tune(tmp_path, block: str):
    path = tmp_path / "study.yaml"
    path.write_text(f"methods: [vanilla, no_dropout, scores_dropout]\ntasks: [rte]\nseeds: [1]\n"
                    f"out: {tmp_path / 'out'}\ntune:\n" + "".join(f"  {line}\n" for line in block.splitlines()))
    return load_study(path).tune


SPACE = ("space:\n  default: {train.lr: [1.0e-4, 3.0e-4, 1.0e-3]}\n"
         "  scores_dropout: {scores_dropout.p: [0.05, 0.1, 0.2]}")


def test_budget_all_gives_every_method_its_whole_grid(tmp_path):
    """Equal in kind: every method tries every learning rate, crossed with its own rates where it has them."""
    tune = _tune(tmp_path, f"holdout: 6\nseeds: [101, 102, 103]\nbudget: all\n{SPACE}")
    found = {m: configurations(tune, m) for m in ("vanilla", "no_dropout", "scores_dropout")}
    assert {m: len(points) for m, points in found.items()} == {"vanilla": 3, "no_dropout": 3, "scores_dropout": 9}
    assert all({p["train.lr"] for p in points} == {1e-4, 3e-4, 1e-3} for points in found.values())
    assert {(p["train.lr"], p["scores_dropout.p"]) for p in found["scores_dropout"]} == {
        (lr, p) for lr in (1e-4, 3e-4, 1e-3) for p in (0.05, 0.1, 0.2)}
    assert budget_text(tune, {m: len(p) for m, p in found.items()}) == (
        "every method's whole grid (vanilla 3, no_dropout 3, scores_dropout 9 configurations)")
    assert tuning_notes(tune, found) == []


def test_a_stratified_draw_gives_every_method_every_learning_rate(tmp_path):
    """Whatever the draw seed: each learning rate at least once, as evenly as the budget allows, repeatably."""
    for budget in (3, 4, 5):
        for draw_seed in range(12):
            tune = _tune(tmp_path, f"holdout: 6\nseeds: [101]\nbudget: {budget}\ndraw_seed: {draw_seed}\n{SPACE}")
            points = configurations(tune, "scores_dropout")
            counts = [sum(p["train.lr"] == lr for p in points) for lr in (1e-4, 3e-4, 1e-3)]
            assert len(points) == budget and min(counts) >= 1 and max(counts) - min(counts) <= 1, (budget, counts)
            assert len({tuple(p.items()) for p in points}) == budget  # no point twice
            assert points == configurations(tune, "scores_dropout")
            assert not any("never tries" in note for note in tuning_notes(tune, {"scores_dropout": points}))


def test_a_budget_too_small_for_every_learning_rate_is_refused(tmp_path):
    tune = _tune(tmp_path, f"holdout: 6\nseeds: [101]\nbudget: 2\n{SPACE}")
    with pytest.raises(BadInput, match=r"each of the 3 points of train.lr at least once.*raise the budget to 3"):
        configurations(tune, "scores_dropout")


def test_the_uniform_draw_is_the_published_studys_and_the_notes_name_what_it_missed(tmp_path):
    """`draw: uniform` plans exactly the configurations the committed tuning records ran (results/), and the
    warnings say which learning rates a method never tried and that one tuning seed decided."""
    root = Path(__file__).resolve().parents[1]
    tune = load_study(root / "studies" / "glue-minilm.yaml").tune
    published = json.loads((root / "results" / "tuning" / "selection.json").read_text())
    for cell in published["cells"]:
        assert configurations(tune, cell["method"]) == [c["settings"] for c in cell["configurations"]], cell["method"]
    points = {m: configurations(tune, m) for m in ("scores_dropout", "no_dropout")}
    notes = tuning_notes(tune, points)
    assert "rests on 1 tuning seed(s), fewer than 3" in notes[0] and "Bouthillier" in notes[0]
    assert "scores_dropout never tries train.lr=0.0002" in notes[1] and "no_dropout" not in notes[1]


def test_fewer_than_three_tuning_seeds_still_run_with_a_warning(tmp_path, capsys):
    path = _study(tmp_path, STUDY.replace("seeds: [101, 102, 103]", "seeds: [101, 102]"))
    assert main(["run", "--study", str(path), "--dry-run"]) == 0
    assert "warning: tuning: the selection rests on 2 tuning seed(s), fewer than 3" in capsys.readouterr().err
    assert main(["run", "--study", str(_study(tmp_path)), "--dry-run"]) == 0
    assert "warning: tuning" not in capsys.readouterr().err


def test_batch_size_and_epochs_are_chosen_on_the_tuning_split(tmp_path):
    """A budget (batch size, epochs) is a training setting a tune space searches; the final grid runs the one with
    the best tuning-split score."""
    text = STUDY.replace("budget: 3", "budget: all").replace(
        "default: {{train.lr: [1.0e-4, 3.0e-4, 1.0e-3]}}",
        "default: {{train.lr: [1.0e-4], train.batch_size: [8, 16], train.epochs: [2, 3]}}").replace(
        "    scores_dropout: {{scores_dropout.p: [0.05, 0.2]}}\n", "")
    _, plan, tuning = _plans(_study(tmp_path, text))
    cands = tuning.cells[("minilm", "rte", "vanilla")]
    assert sorted((c.settings["train.batch_size"], c.settings["train.epochs"]) for c in cands) == [
        (8, 2), (8, 3), (16, 2), (16, 3)]
    assert all(j.train.batch_size == c.settings["train.batch_size"] and j.train.epochs == c.settings["train.epochs"]
               for c in cands for j in c.jobs.values())
    for c in tuning.cells[("minilm", "rte", "scores_dropout")] + cands:
        for job in c.jobs.values():  # the tuning split prefers 16 x 3; dev (never read) the opposite
            best = job.train.batch_size == 16 and job.train.epochs == 3
            _write_record(tuning.store, job, tune_score=0.9 if best else 0.6, dev_score=0.1 if best else 0.9)
    final = selected_jobs(plan.jobs, select_configurations(tuning))
    assert {(j.train.batch_size, j.train.epochs) for j in final} == {(16, 3)}


def test_a_budget_an_also_grid_sets_on_purpose_cannot_be_searched(tmp_path):
    """A data-efficiency curve scales its epochs with the training-set size; a tuned train.epochs would replace them
    in every grid that runs the cell."""
    path = tmp_path / "study.yaml"
    path.write_text("methods: [vanilla]\ntasks: [rte]\nalso:\n  - {tasks: [rte], train: {epochs: 8}}\n"
                    "tune: {holdout: 6, seeds: [9], budget: all, space: {default: {train.epochs: [2, 3]}}}\n")
    with pytest.raises(BadInput, match=r"tune.space.default.train.epochs: also\[0\].train sets epochs on purpose"):
        load_study(path)
    path.write_text(path.read_text().replace("epochs: 8", "max_train_samples: 250"))
    assert load_study(path).tune.budget == "all"
