"""Study files: one YAML declares the grid; flags override it; unknown keys and wrong types name file and key."""
import json
from pathlib import Path

import pytest

from suite.api.errors import BadInput
from suite.commands import main
from suite.grid.study import load_study

ROOT = Path(__file__).resolve().parents[1]


def _resolve(*argv: str):
    """The grids `python -m suite run ARGV` plans: its study resolved with the command line's overrides."""
    from suite.commands import build_parser
    from suite.commands.run_options import run_overrides
    from suite.grid.resolve import resolve_study

    args = build_parser().parse_args(["run", *argv])
    return resolve_study(load_study(args.study), run_overrides(args))


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_committed_studies_load_and_plan_their_records():
    """Each studies/*.yaml is valid, and every committed record in results/ is a job the results study plans (found
    by hash, so the study resumes instead of running it again): a tuning record is one of its tuning runs, a final
    record one of its final jobs (up to the until-decided cap) with one of the cell's tuning configurations."""
    from suite.grid.tuning import apply_settings, plan_tuning_runs

    studies = sorted((ROOT / "studies").glob("*.yaml"))
    assert studies
    for path in studies:
        load_study(path)
    plan = _resolve("--study", str(ROOT / "studies" / "glue-minilm.yaml"), "--until-decided")
    tuning = plan_tuning_runs(plan.request.study.tune, plan.jobs, plan.seeds, ROOT / "results")
    assert tuning.jobs and len(plan.seeds) >= 20
    possible = {apply_settings(j, c.settings).hash for j in plan.jobs
                for c in tuning.cells[j.model, j.task, j.method]}
    runs = ROOT / "results"
    tuned = [json.loads(p.read_text()) for p in (runs / "tuning" / "runs").glob("*.json")]
    final = [json.loads(p.read_text()) for p in (runs / "runs").glob("*.json")]
    assert not [r["label"] for r in tuned if r["hash"] not in {j.hash for j in tuning.jobs}]
    assert not [r["label"] for r in final if r["hash"] not in possible]


@pytest.mark.parametrize("text, message", [
    ("methods: [vanilla]\ntasks: rte\ntrain: {epoch: 2}\n", "study.yaml: unknown key 'train.epoch' (did you mean "
                                                             "'epochs'?)"),
    ("methods: [vanilla]\ntasks: rte\nmethod: x\n", "unknown key 'method' (did you mean 'methods'?)"),
    ("methods: [vanilla]\ntasks: rte\ntrain: {lr: fast}\n", "study.yaml: train.lr: Input should be a valid number"),
    ("methods: [vanilla]\nseeds: [1, two]\n", "study.yaml: seeds.1: Input should be a valid integer"),
    ("methods: [vanilla]\nsweep: {scores_dropout.q: [0.1]}\n", "study.yaml: sweep.scores_dropout.q: scores_dropout "
                                                                "has no hyper-parameter 'q'"),
    ("methods: [vanilla]\nexecutor: {workers: many}\n",
     "study.yaml: executor.workers: Value error, 'many': give a number"),
    ("methods: [vanilla]\nreport: {alpha: .nan}\n", "study.yaml: report.alpha: Input should be greater than 0"),
    ("methods: [vanilla]\nreport: {alpha: 2}\n", "study.yaml: report.alpha: Input should be less than 1"),
    ("methods: [vanilla]\nreport: {alpha: 0}\n", "study.yaml: report.alpha: Input should be greater than 0"),
    ("methods: [vanilla]\nreport: {margin: -1}\n", "study.yaml: report.margin"),
    ("methods: [vanilla]\nreport: {margin: {rte: 0}}\n", "study.yaml: report.margin"),
    ("methods: [vanilla]\nreport: {collapse_floor: -2}\n", "study.yaml: report.collapse_floor"),
    ("methods: [vanilla]\ntune: {holdout: true, seeds: [9], budget: 1, space: {}}\n",
     "study.yaml: tune.holdout: Value error, true is not a number"),
    ("- just\n- a list\n", "a study file is a YAML mapping"),
    ("methods: [vanilla\n", "not a readable study file"),
])
def test_bad_study_files_name_file_and_key(tmp_path, text, message):
    with pytest.raises(BadInput, match=None) as info:
        load_study(_write(tmp_path, text))
    assert message in str(info.value) and str(tmp_path / "study.yaml") in str(info.value)


def test_bad_study_exits_2_before_training(tmp_path, capsys):
    assert main(["run", "--study", str(_write(tmp_path, "methods: [vanilla]\ntrain: {lrr: 1}\n"))]) == 2
    assert "unknown key 'train.lrr'" in capsys.readouterr().err


def test_flags_override_the_study(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDY_OUT", str(tmp_path / "from-env"))
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte]\nseeds: [1, 2]\n"
                            "out: ${oc.env:STUDY_OUT}\n"
                            "train: {lr: 1.0e-4, epochs: 2, max_train_samples: null}\n"
                            "set: {scores_dropout.p: 0.2}\nsweep: {train.batch_size: [8, 16]}\n"
                            "outputs: {save_model: true}\n")
    plan = _resolve("--study", str(path), "--lr", "3e-4", "--seeds", "5", "--sweep", "train.batch_size=4",
                    "--no-save-model")
    assert plan.request.out == str(tmp_path / "from-env") and plan.seeds == [5] and not plan.outputs.save_model
    assert {(j.method, j.train.lr, j.train.epochs, j.train.batch_size, j.train.max_train_samples) for j in plan.jobs} \
        == {("vanilla", 3e-4, 2, 4, None), ("scores_dropout", 3e-4, 2, 4, None)}
    assert {j.hparams.get("p") for j in plan.jobs if j.method == "scores_dropout"} == {0.2}


def test_the_command_line_is_typed_overrides_of_the_study():
    """Without a study file the flags override the empty study: dotted keys, picks, seeds and assignments; each
    training shortcut is built from its setting's declaration."""
    from suite.commands import build_parser
    from suite.commands.run_options import TRAIN_SHORTCUTS, run_overrides
    from suite.grid.overrides import Overrides
    from suite.grid.resolve import resolve_study
    from suite.grid.study import Study
    from suite.run.settings import setting_help

    parser = build_parser()
    args = parser.parse_args(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "4", "--lr", "3e-4",
                              "--epochs", "2", "--workers", "2", "--set", "train.holdout=0.1"])
    overrides = run_overrides(args)
    assert overrides == Overrides({"train.lr": 3e-4, "train.epochs": 2, "executor.workers": 2},
                                  {"methods": "vanilla", "tasks": "rte"}, (4,), ("train.holdout=0.1",))
    plan = resolve_study(Study(), overrides)
    assert {(j.method, j.seed, j.train.lr, j.train.epochs, j.train.holdout) for j in plan.jobs} == {
        ("vanilla", 4, 3e-4, 2, 0.1)}
    assert plan.request.executor_options["workers"] == 2 and plan.request.out == "runs"
    with pytest.raises(ValueError, match="train.lrr"):
        Overrides({"train.lrr": 1.0})
    run = next(a for a in parser._actions if a.dest == "command").choices["run"]
    helps = {opt: action.help for action in run._actions for opt in action.option_strings}
    assert all(setting_help(key) in helps[flag] and f"train.{key}" in helps[flag]
               for flag, key in TRAIN_SHORTCUTS.items())


def test_study_without_methods_says_how(tmp_path, capsys):
    assert main(["run", "--study", str(_write(tmp_path, "tasks: [rte]\n")), "--dry-run"]) == 2
    assert "no methods given" in capsys.readouterr().err


def test_report_study_uses_its_out_and_report_section(tmp_path):
    from suite.commands import build_parser
    from suite.commands.report import report_request

    path = _write(tmp_path, "methods: [vanilla]\nout: results\nreport: {baseline: scores_dropout, alpha: 0.1, "
                            "primary: [topk], allow_uncommitted: true}\n")

    def request(*argv):
        argv = ["report", "--study", str(path), *argv]
        return report_request(build_parser(argv).parse_args(argv))

    dirs, options = request()
    assert dirs == ["results"] and (options.baseline, options.alpha, options.out) == ("scores_dropout", 0.1, None)
    assert options.primary == ("topk",) and options.allow_uncommitted and options.correction == "holm"
    dirs, options = request("other", "--baseline", "vanilla", "--primary", "drophead,", "--no-aso")
    assert dirs == ["other"] and (options.baseline, options.alpha, options.primary) == ("vanilla", 0.1, ("drophead",))
    assert not options.aso and options.figures  # the flags win; what neither gives is the declared default


def test_the_documented_study_example_is_valid(tmp_path):
    example = (ROOT / "docs" / "studies.md").read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    path = _write(tmp_path, example)
    study = load_study(path)
    assert study.methods and study.train_values()["lr"] == 3.0e-4 and study.outputs.report_to == ["tensorboard"]
    jobs = _resolve("--study", str(path)).jobs  # it plans, too
    assert jobs and {j.method for j in jobs} == set(study.methods)


def test_also_grids_inherit_the_study_and_flags_narrow_them(tmp_path):
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte]\nseeds: [1, 2]\n"
                            "train: {epochs: 2}\nset: {scores_dropout.p: 0.2}\n"
                            "also:\n"
                            "  - {description: more seeds, methods: [vanilla], seeds: [1, 2, 3]}\n"
                            "  - methods: [vanilla, scores_dropout]\n"
                            "    tasks: [mrpc]\n"
                            "    train: {lr: 1.0e-4}\n"
                            "    sweep: {train.max_train_samples: [100, 200]}\n")

    def plan(*flags):
        return _resolve("--study", str(path), *flags)

    jobs = {(j.task, j.method, j.seed, j.train.epochs, j.train.lr, j.train.max_train_samples, j.hparams.get("p"))
            for j in plan().jobs}
    default_lr, default_n = 5e-5, 2000  # TrainSettings defaults for RTE (no preset values); the file sets all of MRPC's
    first = {("rte", m, s, 2, default_lr, default_n, p) for m, p in (("vanilla", 0.1), ("scores_dropout", 0.2))
             for s in (1, 2)}
    more_seeds = {("rte", "vanilla", 3, 2, default_lr, default_n, 0.1)}
    sizes = {("mrpc", m, s, 2, 1e-4, n, p) for m, p in (("vanilla", 0.1), ("scores_dropout", 0.2))
             for s in (1, 2) for n in (100, 200)}
    assert jobs == first | more_seeds | sizes  # vanilla seeds 1-2 on RTE appear once, not twice
    # --seeds replaces what the grids inherit; a grid that gives the key itself keeps what both name, or drops out
    flagged = plan("--seeds", "7", "--set", "scores_dropout.p=0.3")
    assert {j.seed for j in flagged.jobs} == {7}
    assert {j.hparams["p"] for j in flagged.jobs if j.method == "scores_dropout"} == {0.3}
    assert {(j.task, j.train.lr) for j in flagged.jobs} == {("rte", default_lr), ("mrpc", 1e-4)}  # 'more seeds' out
    rte = {(j.task, j.method, j.seed, j.train.lr) for j in plan("--tasks", "RTE").jobs}
    assert rte == {("rte", m, s, default_lr) for m, s in (("vanilla", 1), ("scores_dropout", 1), ("vanilla", 2),
                                                          ("scores_dropout", 2), ("vanilla", 3))}
    one_method = {(j.task, j.method, j.seed) for j in plan("--methods", "scores_dropout", "--seeds", "2").jobs}
    assert one_method == {("rte", "scores_dropout", 2), ("mrpc", "scores_dropout", 2)}


def test_name_flags_pick_from_every_grid_of_a_study_with_its_own_settings(tmp_path, capsys):
    """`--tasks mrpc` runs the study's MRPC grid at its own 3 epochs, not the top grid moved to MRPC at 2; a name that
    no grid gives stops with the study's names."""
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte]\nseeds: [1, 2]\ntrain: {epochs: 2}\n"
                            "also:\n"
                            "  - {tasks: [mrpc], train: {epochs: 3}}\n"
                            "  - {methods: [sparsemax]}\n")

    def plan(*flags):
        return _resolve("--study", str(path), *flags)

    assert {(j.task, j.method, j.train.epochs) for j in plan("--tasks", "mrpc").jobs} == {
        ("mrpc", "vanilla", 3), ("mrpc", "scores_dropout", 3)}
    assert {(j.task, j.method) for j in plan("--methods", "sparsemax").jobs} == {("rte", "sparsemax")}
    assert {(j.task, j.method, j.seed) for j in plan("--methods", "vanilla", "--tasks", "rte", "--seeds", "3").jobs} \
        == {("rte", "vanilla", 3)}
    with pytest.raises(BadInput, match=r"--tasks sst2: .* runs no sst2 \(its tasks: rte, mrpc\)"):
        plan("--tasks", "sst2")
    with pytest.raises(BadInput, match="no grid of .* runs that combination"):
        plan("--methods", "sparsemax", "--tasks", "mrpc")
    assert main(["run", "--study", str(path), "--methods", "rela", "--dry-run"]) == 2
    assert "runs no rela (its methods: vanilla, scores_dropout, sparsemax)" in capsys.readouterr().err


def test_wildcards_and_groups_pick_what_the_study_has_and_empty_flags_are_no_flags(tmp_path, capsys):
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte]\nseeds: [1]\n"
                            "also:\n  - {tasks: [mrpc], methods: [sparsemax]}\n")

    def plan(*flags):
        return {(j.task, j.method) for j in _resolve("--study", str(path), *flags).jobs}

    assert plan("--methods", "scores_*") == {("rte", "scores_dropout")}
    assert plan("--tasks", "glue", "--methods", "all") == plan() == {
        ("rte", "vanilla"), ("rte", "scores_dropout"), ("mrpc", "sparsemax")}
    assert plan("--methods", "") == plan()
    assert main(["run", "--methods", "", "--tasks", "rte", "--dry-run"]) == 2
    assert "no methods given" in capsys.readouterr().err


def test_a_picked_plan_is_part_of_the_whole_study_so_it_resumes_into_it(glue_dir):
    """The property resuming depends on: the jobs (and tuning jobs) a picked command plans are jobs of the whole
    study, found by hash, up to the until-decided cap."""
    from suite.grid.tuning import plan_tuning_runs

    def hashes(*flags):
        plan = _resolve("--study", str(ROOT / "studies" / "glue-minilm.yaml"), "--data-dir", glue_dir,
                        "--until-decided", *flags)
        tuning = plan_tuning_runs(plan.request.study.tune, plan.jobs, plan.seeds, plan.request.out)
        return {j.hash for j in plan.jobs}, {j.hash for j in tuning.jobs}

    whole = hashes()
    for flags in (("--tasks", "stsb"), ("--methods", "vanilla,topk"), ("--methods", "sparsemax", "--tasks", "stsb"),
                  ("--tasks", "sst2", "--seeds", "1,2")):
        finals, tuning = hashes(*flags)
        assert finals and tuning and finals <= whole[0] and tuning <= whole[1], flags
    with pytest.raises(BadInput, match="no grid of .* runs that combination"):  # the secondary family skips CoLA
        hashes("--methods", "sparsemax", "--tasks", "cola")


def test_until_decided_refuses_flags_that_leave_out_primary_comparisons(tmp_path, capsys):
    """Alpha is split over the study's whole primary family: a picked part would test at a looser level."""
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte, mrpc]\nseeds: [1, 2]\n"
                            "report: {primary: [scores_dropout]}\nalso:\n  - {methods: [vanilla, sparsemax]}\n")
    assert main(["run", "--study", str(path), "--until-decided", "--tasks", "rte", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "whole primary family (2 comparisons), but --tasks rte leaves out 1" in err and "mrpc/scores_dropout" in err
    # picking away only what is not primary keeps the family: allowed
    assert main(["run", "--study", str(path), "--until-decided", "--methods", "vanilla,scores_dropout",
                 "--dry-run"]) == 0


def test_a_flag_that_gives_the_top_grid_its_methods_is_part_of_the_whole_study(tmp_path, capsys):
    """A top grid without `methods:` takes the flag's, also when an also: grid names methods: the study's own
    command (planned for tuning and until-decided) keeps the flag instead of failing for want of methods."""
    path = _write(tmp_path, "tasks: [rte]\nseeds: [1, 2]\n"
                            "tune: {holdout: 6, seeds: [101], budget: 1, space: {default: {train.lr: [1.0e-4]}}}\n"
                            "also:\n  - {methods: [sparsemax]}\n")
    assert main(["run", "--study", str(path), "--methods", "vanilla,sparsemax", "--dry-run"]) == 0, \
        capsys.readouterr().err
    assert "rte/vanilla/seed101" in capsys.readouterr().out


def test_until_decided_names_a_pick_that_leaves_no_primary_comparison(tmp_path, capsys):
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte]\nseeds: [1, 2]\n"
                            "report: {primary: [scores_dropout]}\n")
    assert main(["run", "--study", str(path), "--until-decided", "--methods", "vanilla", "--dry-run"]) == 2
    assert "but --methods vanilla leaves out 1 of them" in capsys.readouterr().err


def test_until_decided_checks_only_the_primary_family_of_the_whole_study(tmp_path, capsys):
    """A sweep or a missing reference outside the primary family blocks neither the whole study nor a picked part;
    `--model` picks too (from an also: grid's models) and cannot shrink the family unnoticed."""
    path = _write(tmp_path, "methods: [vanilla, scores_dropout]\ntasks: [rte]\nseeds: [1, 2]\n"
                            "report: {primary: [scores_dropout]}\nalso:\n"
                            "  - {methods: [sparsemax], sweep: {train.lr: [1.0e-4, 3.0e-4]}}\n"
                            "  - {tasks: [mrpc], methods: [sparsemax]}\n"
                            "  - {model: [bert-base-uncased]}\n".replace("model:", "models:"))
    for flags in ((), ("--methods", "vanilla,scores_dropout"), ("--tasks", "rte", "--methods", "vanilla,scores_*")):
        assert main(["run", "--study", str(path), "--until-decided", *flags, "--dry-run"]) == 0, flags
    capsys.readouterr()
    assert main(["run", "--study", str(path), "--until-decided", "--model", "minilm", "--dry-run"]) == 2
    assert "--model minilm leaves out 1 of them (e.g. rte/scores_dropout vs vanilla (bert-base-uncased))" in (
        capsys.readouterr().err)
    assert main(["run", "--study", str(path), "--model", "all", "--dry-run"]) == 2
    assert "runs no all (its models: minilm, bert-base-uncased)" in capsys.readouterr().err


def test_also_grid_errors_name_the_grid(tmp_path):
    with pytest.raises(BadInput) as info:
        load_study(_write(tmp_path, "methods: [vanilla]\nalso:\n  - {methodz: [vanilla]}\n"))
    assert "unknown key 'also.0.methodz' (did you mean 'methods'?)" in str(info.value)
    with pytest.raises(BadInput) as info:
        load_study(_write(tmp_path, "methods: [vanilla]\nalso:\n  - {set: {vanilla.q: 1}}\n"))
    assert "also[0].set.vanilla.q" in str(info.value)


@pytest.mark.parametrize("flag, value", [("--alpha", "0"), ("--alpha", "nan"), ("--alpha", "2"), ("--margin", "-1"),
                                         ("--margin", "0"), ("--collapse-floor", "-1"), ("--collapse-floor", "inf")])
def test_report_refuses_impossible_levels_margins_and_floors(flag, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path), flag, value])
    assert exit_.value.code == 2 and f"argument {flag}: {value!r} is not" in capsys.readouterr().err
