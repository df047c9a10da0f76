"""A declared pre-registration (`report: preregistered:`) is labelled pre-registered only where git shows it fixed
before the first run started (suite/report/preregistration.py); otherwise the report says what failed."""
from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from suite.report.load import Col
from suite.report.preregistration import check_preregistration as check_file


def check_preregistration(*args, **kwargs):
    """The registration file's check, with a study check that finds nothing (tested below, with the command's)."""
    kwargs.setdefault("registration", lambda first: [])
    return check_file(*args, **kwargs)

BEFORE, FIRST_RUN, AFTER = "2025-12-31T23:00:00+00:00", "2026-01-01T00:00:01+0000", "2026-01-02T00:00:00+00:00"


def git(repo: Path, *args: str, date: str = BEFORE) -> str:
    env = {**os.environ, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date}
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "PREREGISTRATION.md").write_text("endpoint, test, seeds, horizon\n")
    git(tmp_path, "add", "PREREGISTRATION.md")
    git(tmp_path, "commit", "-qm", "pre-registration")
    return tmp_path


def records(*started: str) -> pd.DataFrame:
    return pd.DataFrame({Col.STARTED: list(started)})


def test_a_file_committed_before_the_first_run_is_verified(repo):
    found = check_preregistration("PREREGISTRATION.md", records("2026-01-01T00:00:05+0000", FIRST_RUN), repo)
    assert found.verified and found.commit == git(repo, "rev-parse", "HEAD")
    assert found.first_started == "2026-01-01T00:00:01+00:00"
    assert "checked against git" in found.text() and found.commit[:12] in found.text()


def test_a_file_changed_after_the_first_run_is_not(repo):
    (repo / "PREREGISTRATION.md").write_text("endpoint changed after the results\n")
    git(repo, "commit", "-qam", "revised", date=AFTER)
    found = check_preregistration("PREREGISTRATION.md", records(FIRST_RUN), repo)
    assert not found.verified and "not before the first run started" in found.problems[0]
    assert "not verified" in found.text() and "re-analysis" in found.text()


def test_uncommitted_edits_and_untracked_files_are_not_verified(repo):
    (repo / "PREREGISTRATION.md").write_text("edited, not committed\n")
    assert check_preregistration("PREREGISTRATION.md", records(FIRST_RUN), repo).problems == (
        "`PREREGISTRATION.md` has uncommitted edits",)
    (repo / "plan.md").write_text("never committed\n")
    assert "has no commit" in check_preregistration("plan.md", records(FIRST_RUN), repo).problems[0]


def test_a_commit_may_be_named_instead_of_a_file(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert check_preregistration(head[:9], records(FIRST_RUN), repo).verified
    missing = check_preregistration("no-such-thing", records(FIRST_RUN), repo)
    assert "neither a file nor a commit" in missing.problems[0]


def test_records_that_do_not_say_when_they_started_cannot_show_the_order(repo):
    assert "cannot be shown" in check_preregistration("PREREGISTRATION.md", records(""), repo).problems[0]
    partly = check_preregistration("PREREGISTRATION.md", records(FIRST_RUN, ""), repo)
    assert partly.problems == ("1 record(s) do not say when they started",)


def test_the_report_prints_the_check(repo, tmp_path_factory, monkeypatch, capsys):
    from test_report import write_single_seed  # records started 2026-01-01T00:00:01

    from suite.report import ReportOptions, build_report

    runs = write_single_seed(tmp_path_factory.mktemp("runs"))
    monkeypatch.chdir(repo)
    def options(registration=lambda first: []):
        return ReportOptions(figures=False, preregistered="PREREGISTRATION.md", registration=registration)

    md = build_report([runs], options()).read_text()
    assert "Pre-registered, checked against git" in md.replace("\n", " ")
    md = build_report([runs], options(lambda first: ["the study file changed its report.margin"])).read_text()
    assert "**not verified**: the study file changed its report.margin" in md.replace("\n", " ")
    md = build_report([runs], options(None)).read_text()
    assert "the report read no study file" in md.replace("\n", " ")
    (repo / "PREREGISTRATION.md").write_text("revised\n")
    git(repo, "commit", "-qam", "revised", date=AFTER)
    md = build_report([runs], options()).read_text()
    assert "not verified" in md.replace("\n", " ") and "not before the first run started" in md.replace("\n", " ")
    assert "warning: Declared pre-registered" in capsys.readouterr().err


def test_a_link_a_subfolder_and_the_record_time_format_of_python_3_10(repo):
    (repo / "docs").mkdir()
    (repo / "docs" / "plan_v1.md").write_text("the analysis\n")
    (repo / "PLAN.md").symlink_to("docs/plan_v1.md")
    git(repo, "add", "docs/plan_v1.md", "PLAN.md")
    git(repo, "commit", "-qm", "plan")
    assert check_preregistration("PLAN.md", records(FIRST_RUN), repo).verified  # the file the link points to
    assert check_preregistration("docs/plan_v1.md", records(FIRST_RUN), repo / "docs").verified  # from the top
    assert check_preregistration("PLAN.md", records("2026-01-01 00:00:01"), repo).problems == (  # no time zone
        "no record says when it started, so the order cannot be shown",)
    assert check_preregistration("PLAN.md", pd.DataFrame({"other": [1]}), repo).problems == (
        "no record says when it started, so the order cannot be shown",)


def test_a_commit_dated_at_the_first_start_is_not_before_it(repo):
    (repo / "PREREGISTRATION.md").write_text("changed at the very second the first run started\n")
    git(repo, "commit", "-qam", "same second", date="2026-01-01T00:00:01+00:00")
    assert "not before" in check_preregistration("PREREGISTRATION.md", records(FIRST_RUN), repo).problems[0]


def test_a_commit_without_a_readable_date_is_not_verified(repo, monkeypatch):
    from suite.report import preregistration

    real = preregistration.git_output
    monkeypatch.setattr(preregistration, "git_output",
                        lambda cwd, *args: None if args[0] == "show" else real(cwd, *args))
    head = git(repo, "rev-parse", "HEAD")
    assert "no readable date" in check_preregistration(head, records(FIRST_RUN), repo).problems[0]



STUDY = """methods: [vanilla, topk]
tasks: [mrpc]
seeds: [1, 2]
out: out
report:
  baseline: vanilla
  primary: [topk]
  margin: {mrpc: 1.5}
  collapse_floor: 1.0
  preregistered: PREREGISTRATION.md
until_decided: {start: 5, step: 5, cap: 20}
"""
FIRST = datetime.fromisoformat("2026-01-01T00:00:01+00:00")


@pytest.fixture
def study_repo(repo, monkeypatch) -> Path:
    (repo / "study.yaml").write_text(STUDY)
    git(repo, "add", "study.yaml")
    git(repo, "commit", "-qm", "the study file")
    monkeypatch.chdir(repo)
    (repo / "out").mkdir()
    (repo / "out" / "commands.txt").write_text(RUN_AS_REGISTERED + "\n")
    write_state(repo / "out")
    return repo


def write_state(out: Path, start: int = 5, seed_order: tuple[int, ...] = (1, 2, *range(3, 21))) -> None:
    """OUT/until_decided.json as `run --until-decided` writes it (no comparison looked at yet)."""
    import json

    schedule = {"start": start, "step": 5, "cap": 20, "spending": "obrien-fleming", "futility": 0.07}
    (out / "until_decided.json").write_text(json.dumps({
        "written": "2026-01-01T00:00:02+00:00", "schedule": schedule, "looks": [start, 10, 15, 20],
        "seed_order": list(seed_order), "alpha": 0.05, "primary": 1, "alpha_each": 0.05, "rule": "as registered",
        "comparisons": []}))


RUN_AS_REGISTERED = "python -m suite run --study study.yaml --until-decided --workers 2 --stop-by 2h50m --quiet"


def study_check(*flags: str, more: tuple[str, ...] = ()) -> list[str]:
    """What `report --study study.yaml FLAGS` finds against the registration, for records first started at FIRST."""
    import argparse

    from suite.commands import report

    parser = argparse.ArgumentParser()
    report.add_parser(parser.add_subparsers())
    _, options = report.report_request(parser.parse_args(["report", "--study", "study.yaml", *flags, *more]))
    return options.registration(FIRST)


def test_a_study_file_as_committed_before_the_first_run_with_its_own_options_is_the_registered_analysis(study_repo):
    assert study_check() == []
    assert "--margin 1.5 (registered: {'mrpc': 1.5})" in study_check("--margin", "1.5")[0]  # another form: flagged
    assert study_check("--baseline", "vanilla", "--alpha", "0.05", "--correction", "holm") == []  # study, defaults
    assert study_check("--primary", "TOPK") == []                                                 # one name, its case


@pytest.mark.parametrize("edit, says", [
    (lambda t: t.replace("mrpc: 1.5", "mrpc: 3.0"), "changed its report.margin"),        # wider, after the results
    (lambda t: t.replace("cap: 20", "cap: 40"), "changed its until_decided"),             # more seeds than planned
    (lambda t: t + "also:\n  - {tasks: [rte]}\n", "changed its also"),                  # a new primary cell
    (lambda t: t.replace("seeds: [1, 2]", "seeds: [2, 1]"), "changed its seeds"),         # the order seeds are added
    (lambda t: t.replace("primary: [topk]", "primary: [topk, '${oc.env:EXTRA,topk}']"), "from the environment"),
])
def test_a_study_file_changed_where_it_decides_verdicts_is_not_the_registered_analysis(study_repo, edit, says):
    (study_repo / "study.yaml").write_text(edit(STUDY))
    assert says in study_check()[0]
    git(study_repo, "commit", "-qam", "after the first run", date=AFTER)
    assert says in study_check()[0]


def test_what_decides_no_verdict_may_change_after_the_first_run(study_repo):
    (study_repo / "study.yaml").write_text("description: the same study, described\n" + STUDY.replace(
        "collapse_floor: 1.0", "collapse_floor: 2.0") + "executor: {name: local, workers: 2}\ndevice: cpu\n")
    git(study_repo, "commit", "-qam", "words, a descriptive floor, workers, the device", date=AFTER)
    assert study_check() == []
    assert study_check(more=("out/runs",)) == []   # its out: folder, named by its runs/ folder


def test_a_free_key_the_suite_no_longer_knows_does_not_unverify_the_registration(repo, monkeypatch):
    monkeypatch.chdir(repo)
    (repo / "study.yaml").write_text(STUDY + "executor: {name: local, retired_option: 3}\n")  # a since-renamed key
    git(repo, "add", "study.yaml")
    git(repo, "commit", "-qm", "registered with an option the suite later renamed")
    (repo / "study.yaml").write_text(STUDY)
    (repo / "out").mkdir()
    (repo / "out" / "commands.txt").write_text(RUN_AS_REGISTERED + "\n")
    write_state(repo / "out")
    assert study_check() == []


def test_the_report_of_a_registered_study_is_labelled_and_a_tuning_run_before_the_registration_unverifies_it(
        study_repo, capsys):
    from test_report import write_single_seed  # records started 2026-01-01T00:00:01

    from suite import commands

    write_single_seed(study_repo / "out")
    (study_repo / "out" / "commands.txt").write_text(RUN_AS_REGISTERED + "\n")
    (study_repo / "out" / "until_decided.json").unlink()  # these records were made at fixed seeds
    (study_repo / "study.yaml").write_text(STUDY.replace("[vanilla, topk]", "[vanilla, scores_dropout]").replace(
        "[topk]", "[scores_dropout]").replace("mrpc", "rte").replace("until_decided: {start: 5, step: 5, cap: 20}\n",
                                                                      ""))
    git(study_repo, "commit", "-qam", "the study of these records", date=BEFORE)
    assert commands.main(["report", "--study", "study.yaml", "--no-figures"]) == 0
    assert "Pre-registered, checked against git" in (study_repo / "out" / "leaderboard.md").read_text()
    with open(study_repo / "out" / "commands.txt", "a") as fh:  # more seeds than it plans, from the command line
        fh.write("python -m suite run --study study.yaml --seeds 101\n")
    assert commands.main(["report", "--study", "study.yaml", "--no-figures"]) == 0
    assert "1 run command(s) in" in " ".join((study_repo / "out" / "leaderboard.md").read_text().split())
    (study_repo / "out" / "commands.txt").write_text(RUN_AS_REGISTERED + "\n")
    (study_repo / "out" / "tuning" / "runs").mkdir(parents=True)
    first = next((study_repo / "out" / "runs").glob("*.json"))
    (study_repo / "out" / "tuning" / "runs" / first.name).write_text(  # a tuning run a year before the registration
        first.read_text().replace("2026-01-01T00:00:01", "2025-01-01T00:00:01"))
    assert commands.main(["report", "--study", "study.yaml", "--no-figures"]) == 0
    md = (study_repo / "out" / "leaderboard.md").read_text().replace("\n", " ")
    assert "not verified" in md and "2025-01-01" in md


def test_flags_and_folders_other_than_the_registered_ones_are_a_re_analysis(study_repo):
    assert "--margin 3.0 (registered: {'mrpc': 1.5})" in study_check("--margin", "3")[0]
    assert "--alpha 0.1" in study_check("--alpha", "0.1")[0]
    assert "--primary ('drophead', 'topk')" in study_check("--primary", "topk,drophead")[0]
    (study_repo / "more").mkdir()
    assert "reads records from more besides the registered out: folder out" in study_check(more=("out", "more"))[0]


def test_a_study_file_committed_only_at_or_after_the_first_run_was_not_registered_before_it(repo, monkeypatch):
    monkeypatch.chdir(repo)
    (repo / "study.yaml").write_text(STUDY)
    git(repo, "add", "study.yaml")
    git(repo, "commit", "-qm", "the study file, at the first run's second", date="2026-01-01T00:00:01+00:00")
    assert "has no commit before the first run" in study_check()[0]


@pytest.mark.parametrize("line", [
    "python -m suite run --study study.yaml --seeds 1,2,3,4,5,6",          # seeds the rule did not add
    "python -m suite run --study study.yaml --set train.lr=2e-4",          # another setting
    "python -m suite run --study study.yaml --methods topk",               # a part of it, rerun at will
    "python -m suite run --study study.yaml --until-decided --force",      # records replaced
    "python -m suite run --study other.yaml --until-decided",              # another study into its folder
    "python -m suite run --methods vanilla,topk --tasks mrpc --out out",   # no study at all
    "python -m suite report out",                                          # no run
])
def test_a_run_that_shaped_its_jobs_otherwise_than_the_study_is_named(study_repo, line):
    with open(study_repo / "out" / "commands.txt", "a") as fh:
        fh.write(line + "\n")
    assert study_check() == [next(p for p in study_check() if "run command(s)" in p)]
    assert line in study_check()[0]


def test_runs_without_their_commands_cannot_be_shown_to_be_the_study_s(study_repo):
    (study_repo / "out" / "commands.txt").unlink()
    assert "cannot be read" in study_check()[0]


def test_a_change_committed_after_the_first_run_and_reverted_since_is_not_the_registered_analysis(study_repo):
    (study_repo / "study.yaml").write_text(STUDY.replace("cap: 20", "cap: 10"))  # fewer looks while it stood
    git(study_repo, "commit", "-qam", "cap 10, after the first run", date=AFTER)
    changed = git(study_repo, "rev-parse", "HEAD")
    (study_repo / "study.yaml").write_text(STUDY)
    git(study_repo, "commit", "-qam", "back to the registered cap", date=AFTER)
    problems = study_check()
    assert len(problems) == 1 and f"in `{changed[:12]}`: its until_decided" in problems[0]
    assert "even if changed back since" in problems[0]


def test_a_later_commit_that_changes_only_free_keys_keeps_the_registration(study_repo):
    (study_repo / "study.yaml").write_text("description: words only\n" + STUDY)
    git(study_repo, "commit", "-qam", "words", date=AFTER)
    (study_repo / "study.yaml").write_text(STUDY)
    git(study_repo, "commit", "-qam", "no words", date=AFTER)
    assert study_check() == []


@pytest.mark.parametrize("state, says", [
    (lambda out: (out / "until_decided.json").unlink(), "does not exist: no look has been taken yet (the first "
                                                        "comes when every primary comparison has its first 5 seeds)"),
    (lambda out: (out / "until_decided.json").unlink() or (out / "commands.txt").write_text(
        RUN_AS_REGISTERED.replace(" --until-decided", "") + "\n"), "does not exist: its runs were not made under it"),
    (lambda out: write_state(out, start=10), "looked under the schedule"),              # another schedule
    (lambda out: write_state(out, seed_order=(2, 1, *range(3, 21))), "added seeds in the order"),
])
def test_looks_not_made_under_the_registered_stopping_rule_are_not_the_registered_analysis(study_repo, state, says):
    state(study_repo / "out")
    assert says in study_check()[0]


def test_looks_under_a_stopping_rule_the_study_does_not_register_are_named(repo, monkeypatch):
    monkeypatch.chdir(repo)
    (repo / "study.yaml").write_text(STUDY.replace("until_decided: {start: 5, step: 5, cap: 20}\n", ""))
    git(repo, "add", "study.yaml")
    git(repo, "commit", "-qm", "a study at fixed seeds")
    (repo / "out").mkdir()
    (repo / "out" / "commands.txt").write_text("python -m suite run --study study.yaml\n")
    assert study_check() == []
    write_state(repo / "out")
    assert "does not register" in study_check()[0]


def test_an_empty_commands_file_shows_no_run_and_a_passed_deadline_is_no_other_run(study_repo):
    (study_repo / "out" / "commands.txt").write_text("\n")
    assert "names no command" in study_check()[0]
    (study_repo / "out" / "commands.txt").write_text(
        "python -m suite run --study study.yaml --until-decided --stop-by 2026-01-01T13:15\n"   # passed long ago
        "python -m suite run --study study.yaml --until-decided --stop-by=13:15 --workers 2\n")
    assert study_check() == []
