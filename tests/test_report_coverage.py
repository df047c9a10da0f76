"""The report says what it lacks and what its runs cost: N of M planned jobs (the run commands of commands.txt
planned again) with the cells that have no record, and run hours per cell on each device."""
from test_report import MODEL, make_record

from suite.commands.report import planned_jobs
from suite.grid.store import Store
from suite.report import ReportOptions, build_report

PLANNED = ReportOptions(figures=False, aso=False, allow_uncommitted=True, planner=planned_jobs)  # the command's


def _grid(root, records, command):
    store = Store(root)
    for name, rec in records:
        store.write(name, rec)
    (root / "commands.txt").write_text(command + "\n")


def _record_of(job, accuracy=0.6, **kw):
    """A record of exactly the planned job (its settings and hash), as the grid would write it."""
    name, rec = make_record(job.task, job.method, job.seed, {"accuracy": accuracy}, hparams=job.hparams,
                            train=job.to_dict()["train"], **kw)
    rec["config"], rec["hash"] = job.to_dict(), job.hash
    return name.rsplit("__", 1)[0] + f"__{job.hash}.json", rec


def _jobs(command):
    return {(j.method, j.seed): j for j in planned_jobs(command)}


def test_an_incomplete_grid_names_its_missing_cells_and_each_cells_hours(tmp_path):
    command = (f"python -m suite run --methods vanilla,scores_dropout --tasks rte --seeds 1,2,3,4 --model {MODEL} "
               "--out x")
    jobs = _jobs(command)
    records = [_record_of(jobs["vanilla", s], 0.6 + s / 100) for s in (1, 2, 3)]
    records += [_record_of(jobs["scores_dropout", 1])]
    records += [_record_of(jobs["scores_dropout", 2], env={"device": "cuda", "gpu": "H200"})]
    for _, rec in records:
        rec["wall_s"] = 1800.0
    _grid(tmp_path, records, command)
    md = build_report([tmp_path], PLANNED).read_text()
    line = next(x for x in md.splitlines() if x.startswith("- **Jobs"))
    assert line.startswith("- **Jobs: 5 of 8 jobs the commands plan have ok records**; 3 without: "
                           "RTE/scores_dropout seeds 3–4; RTE/vanilla seed 4"), line
    table = md.split("#### Compute per cell")[1].split("\n\n")[1].splitlines()
    assert [c.strip() for c in table[2].split("|")[1:3]] == ["vanilla", "1.50 CPU"]
    assert table[3].split("|")[2].strip() == "0.50 CPU + 0.50 GPU"
    assert "2.00 CPU-hours in all, 0.50 GPU-hours in all" in md and "GPU: H200" in md


def test_a_complete_grid_says_so_and_a_command_that_no_longer_plans_is_named(tmp_path):
    command = f"python -m suite run --methods vanilla --tasks rte --seeds 1,2 --model {MODEL} --out x"
    records = [_record_of(job, 0.6 + job.seed / 100) for job in _jobs(command).values()]
    _grid(tmp_path, records, command)
    md = build_report([tmp_path], PLANNED).read_text()
    assert "- **Jobs:** all 2 jobs the commands plan have ok records\n" in md
    looped = command.replace("--methods vanilla", "--methods vanilla,topk") + " --until-decided"
    first = _jobs(looped)   # the loop's first round: its schedule's starting seeds
    _grid(tmp_path / "looped", [_record_of(job) for job in first.values()], looped)
    md = build_report([tmp_path / "looped"], PLANNED).read_text()
    assert (f"- **Jobs:** all {len(first)} jobs the commands plan have ok records (their first round: "
            "`--until-decided` adds seeds") in " ".join(md.split())
    (tmp_path / "commands.txt").write_text("python -m suite run --study gone.yaml\n")
    md = build_report([tmp_path], PLANNED).read_text()
    assert "- **Jobs:** the planned jobs are unknown (could not plan command 1 (" in md


def test_a_job_at_another_budget_or_swept_value_is_not_covered_by_a_record_of_another(tmp_path):
    """Two commands at two budgets (a --max-train-samples each) and a swept value: the records of one budget and one
    value cover only their own jobs, and the missing ones are named with the setting that tells them apart."""
    base = f"python -m suite run --methods vanilla --tasks rte --seeds 1,2 --model {MODEL} --out x"
    small, large = f"{base} --max-train-samples 64", f"{base} --max-train-samples 128 --sweep vanilla.p=0.1,0.2"
    records = [_record_of(job) for job in _jobs(small).values()]
    records += [_record_of(j) for j in planned_jobs(large) if j.hparams["p"] == 0.1 and j.seed == 1]
    _grid(tmp_path, records, small)
    with open(tmp_path / "commands.txt", "a") as fh:
        fh.write(large + "\n")
    md = build_report([tmp_path], PLANNED).read_text()
    line = " ".join(md.split("- **Jobs")[1].split("\n- ")[0].split())  # the item, unwrapped
    assert ("- **Jobs" + line).startswith("- **Jobs: 3 of 6 jobs the commands plan have ok records**; 3 without: "
                           "RTE/vanilla seed 2 (vanilla.p=0.1, train.max_train_samples=128); "
                           "RTE/vanilla seeds 1–2 (vanilla.p=0.2, train.max_train_samples=128)"), line


def test_a_tuned_studys_jobs_are_planned_at_the_configuration_its_tuning_records_select(tmp_path):
    """The final grid of a tuned study runs what tuning selects: before the tuning records exist its jobs are the
    grid's own settings (no record can have them yet), after, the selected learning rate's."""
    from suite.run.layout import OutputFolder

    out = tmp_path / "out"
    study = tmp_path / "study.yaml"
    study.write_text(f"methods: [vanilla]\ntasks: [rte]\nseeds: [1, 2]\nmodels: [{MODEL}]\nout: {out}\n"
                     "tune: {holdout: 20, seeds: [101], budget: all, space: {default: {train.lr: [1.0e-4, 3.0e-4]}}}\n")
    command = f"python -m suite run --study {study}"
    before = planned_jobs(command)
    assert len(before) == 2 and {j.train.lr for j in before} == {before[0].train.lr} != {3e-4}
    tuning = Store(OutputFolder(out).tuning.root)
    for lr, score in ((1e-4, 0.55), (3e-4, 0.70)):
        job = next(j for j in before if j.seed == 1)
        job = job.__class__(job.model, job.task, job.method, job.hparams, 101,
                            job.train.__class__(**{**job.to_dict()["train"], "lr": lr}), job.data_source)
        name, rec = _record_of(job)
        rec["tune"] = {"accuracy": score, "score": score}
        tuning.write(name, rec)
    after = planned_jobs(command)
    assert sorted(j.seed for j in after) == [1, 2] and {j.train.lr for j in after} == {3e-4}
