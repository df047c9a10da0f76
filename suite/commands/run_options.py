"""The options of `python -m suite run`, each with its help text, and the command line as overrides of a study
(`suite.grid.overrides.Overrides`). A training shortcut is declared once, in TRAIN_SHORTCUTS: its type, choices and
help are its setting's own (`suite.run.settings.TrainSettings`), and so is the `train.KEY` listing of `run --help`;
the flags of the study's other keys (preset, data, output folder, device, executor and its options, outputs) are
made from their declarations (`suite.grid.overrides.STUDY_KEYS`).

Options default to None so that a study file (`--study`) can fill what the command line leaves out;
`suite.grid.overrides.STUDY_DEFAULTS` applies after that.
"""
from __future__ import annotations

import argparse
import typing

from suite.grid.overrides import NAME_KEYS, STUDY_FLAGS, STUDY_KEYS, Overrides, StudyKey, flag_dest
from suite.run.settings import ANALYSES, DEFAULT_MODEL, TRAIN_FIELDS, TrainSettings, setting_help

# what the rest of the suite uses; other names are this module's own
__all__ = ["TRAIN_SHORTCUTS", "add_run_options", "run_overrides", "train_keys_help"]

# flag -> the training setting it sets (`--set train.KEY=V`, over the study's train: section)
TRAIN_SHORTCUTS = {"--epochs": "epochs", "--lr": "lr", "--batch-size": "batch_size", "--max-length": "max_length",
                   "--max-train-samples": "max_train_samples", "--max-eval-samples": "max_eval_samples",
                   "--precision": "precision", "--grad-accumulation": "grad_accumulation",
                   "--early-stopping": "early_stopping_patience", "--compile": "compile"}
_SHORTCUT_METAVARS = {"--grad-accumulation": "N", "--early-stopping": "PATIENCE"}


def _shortcut_options(flag: str, key: str) -> dict:
    """The argparse options of a training shortcut, from its setting: a switch for a true/false setting, else a
    value of the setting's type (or one of its choices)."""
    hint = typing.get_type_hints(TrainSettings)[key]
    kind = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if kind is bool:
        return {"action": "store_true", "default": None, "help": f"train.{key}=true: " + setting_help(key)}
    options = {"type": kind, "metavar": _SHORTCUT_METAVARS.get(flag), "help": f"train.{key}: " + setting_help(key)}
    choices = TRAIN_FIELDS[key].metadata["choices"]
    return {**options, "choices": choices, "metavar": None} if choices else options


def _study_flag(group: argparse._ArgumentGroup, key: str, declared: StudyKey) -> None:
    """The flag of a study key, from its declaration: a --flag/--no-flag switch, or a value read as declared."""
    flag = "--" + flag_dest(key).replace("_", "-")
    if declared.switch:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=declared.flag_help())
        return
    options = {"metavar": declared.metavar, "help": declared.flag_help()}
    if declared.choices:
        options["choices"] = declared.choices()
    reader = declared.parse or declared.flag_type
    if reader:
        options["type"] = _flag_reader(reader)
    group.add_argument(flag, **options)


def _flag_reader(reader):
    """An argparse type: the declared reader, its ValueError as argparse's own message."""
    def parsed(text: str):
        try:
            return reader(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parsed


def _study_flags(group: argparse._ArgumentGroup, where: str) -> None:
    for key, declared in STUDY_KEYS.items():
        if declared.group == where:
            _study_flag(group, key, declared)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def run_overrides(args: argparse.Namespace) -> Overrides:
    """The command line of `run` as overrides of its study (the empty study without --study): the values it gives
    (an empty name flag is no flag), `--analyses` as the last assignment (it changes no run's hash)."""
    values = {key: getattr(args, dest) for dest, key in STUDY_FLAGS.items()}
    values |= {f"train.{key}": getattr(args, _dest(flag)) for flag, key in TRAIN_SHORTCUTS.items()}
    analyses = [f"train.analyses={args.analyses}"] if args.analyses else []
    return Overrides({k: v for k, v in values.items() if v is not None},
                     {key: getattr(args, key) for key in NAME_KEYS if getattr(args, key)},
                     tuple(args.seeds) if args.seeds else None, (*args.sets, *analyses), tuple(args.sweeps),
                     args.until_decided)


def train_keys_help() -> str:
    """One line per training setting: `train.KEY (default): what it does`."""
    import textwrap

    lines = []
    for f in TRAIN_FIELDS.values():
        head = f"  train.{f.name:<24} {f.default!r:<8} "
        lines.append(textwrap.fill(f.metadata["help"], 100, initial_indent=head, subsequent_indent=" " * len(head)))
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


def _stop_by(text: str):
    from suite.grid.executors.gate import parse_stop_by  # not at import: `run --help` loads no grid code

    try:
        return parse_stop_by(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_run_options(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to run")
    what.add_argument("--study", metavar="FILE", help="a study file (studies/*.yaml) that declares the whole grid; "
                                                      "--methods/--tasks/--model pick from it, other flags "
                                                      "override it")
    what.add_argument("--methods", help="comma list of names, wildcards ('scores_*') or 'all'")
    what.add_argument("--tasks", help="comma list of task names (case/dash-insensitive) or a group ('glue')")
    what.add_argument("--seeds", type=_ints, help="comma list (default 1,2,3)")
    what.add_argument("--model", help=f"comma list of local folders or hub ids (default: the preset's; "
                                      f"'{DEFAULT_MODEL}' is the offline MiniLM)")
    _study_flags(what, "what")

    train = p.add_argument_group("training (shortcuts for --set train.KEY=VALUE; every key is listed below)")
    for flag, key in TRAIN_SHORTCUTS.items():
        train.add_argument(flag, **_shortcut_options(flag, key))
    train.add_argument("--set", dest="sets", action="append", default=[], metavar="M.KEY=V",
                       help="fix a hyper-parameter of method M (or train.KEY=V; METHOD:train.KEY=V for one "
                            "method only); repeatable")
    train.add_argument("--sweep", dest="sweeps", action="append", default=[], metavar="M.KEY=V1,V2",
                       help="add a grid axis (train.lr=2e-5,3e-5; METHOD:train.lr=... sweeps one method's "
                            "learning rate); several sweeps multiply")

    _study_flags(p.add_argument_group("where it runs"), "where")

    outputs = p.add_argument_group("what each run leaves besides its record")
    _study_flags(outputs, "outputs")
    outputs.add_argument("--analyses", metavar="NAMES",
                         help="train.analyses: end-of-run analyses on fixed dev examples, a comma list of "
                              f"{', '.join(ANALYSES)} (docs/analyses.md; off by default: they can take as long as a "
                              "short run; a study file asks for them with train: {analyses: ...})")

    control = p.add_argument_group("control")
    control.add_argument("--until-decided", action="store_true",
                         help="add seeds in rounds only to the primary comparisons still undecided, under a "
                              "group-sequential rule that spends alpha across looks (the study's until_decided: "
                              "start, step, cap; default 5, 5, 20 seeds); docs/sequential.md")
    control.add_argument("--replay", action="store_true",
                         help="with --until-decided: train nothing; decide every look again from the records there "
                              "are, with this code's statistics (after an update), and rewrite the state file; a "
                              "comparison whose next look needs seeds without records stays open")
    control.add_argument("--stop-by", type=_stop_by, metavar="WHEN",
                         help="start no run that is not expected to end by WHEN (90m, 2h30m; 10:20; "
                              "2026-12-07T10:20): each run's planned steps at its kind's measured seconds per step; "
                              "runs under way finish, then the command exits 75 and the same command resumes (local "
                              "executor; SIGUSR1 drains the grid the same way at any time)")
    control.add_argument("--force", action="store_true", help="rerun jobs whose records exist")
    control.add_argument("--quiet", action="store_true",
                         help="no progress bars and no per-epoch lines, only a line per finished run with the "
                              "grid's ETA (a log file, when stderr is no terminal, gets no bars either, but a line "
                              "per run start and epoch and one a minute within a long epoch)")
    control.add_argument("--dry-run", action="store_true",
                         help="print the jobs (marking those whose records exist) and exit; reads no data")
