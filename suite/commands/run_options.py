"""The options of `python -m suite run`, each with its help text, and the command line as overrides of a study
(`suite.grid.overrides.Overrides`). A training shortcut is declared once, in TRAIN_SHORTCUTS: its type, choices and
help are its setting's own (`suite.run.settings.TrainSettings`), and so is the `train.KEY` listing of `run --help`;
the executor options are declared in `suite.grid.executors.options`.

Options default to None so that a study file (`--study`) can fill what the command line leaves out;
`suite.grid.overrides.STUDY_DEFAULTS` applies after that.
"""
from __future__ import annotations

import argparse
import typing

from suite.grid.executors.options import EXECUTOR_OPTIONS, flag_parser
from suite.grid.overrides import NAME_KEYS, Overrides
from suite.run.data import DATA_DIR_ENV
from suite.run.settings import ANALYSES, DEFAULT_MODEL, PRESETS, TRAIN_FIELDS, TrainSettings, setting_help

# what the rest of the suite uses; other names are this module's own
__all__ = ["TRAIN_SHORTCUTS", "add_run_options", "run_overrides", "train_keys_help"]

# flag -> the training setting it sets (`--set train.KEY=V`, over the study's train: section)
TRAIN_SHORTCUTS = {"--epochs": "epochs", "--lr": "lr", "--batch-size": "batch_size", "--max-length": "max_length",
                   "--max-train-samples": "max_train_samples", "--max-eval-samples": "max_eval_samples",
                   "--precision": "precision", "--grad-accumulation": "grad_accumulation",
                   "--early-stopping": "early_stopping_patience", "--compile": "compile"}
_SHORTCUT_METAVARS = {"--grad-accumulation": "N", "--early-stopping": "PATIENCE"}
# flags that replace a study's value: their destination -> the study's dotted key
STUDY_FLAGS = {"preset": "preset", "data_dir": "data_dir", "out": "out", "device": "device",
               "executor": "executor.name", **{name: f"executor.{name}" for name in EXECUTOR_OPTIONS},
               "save_model": "outputs.save_model", "predict_test": "outputs.predict_test",
               "report_to": "outputs.report_to"}


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


def presets_help() -> str:
    parts = []
    for name in PRESETS.names():
        preset = PRESETS.get(name)
        train = ", ".join(f"{k}={v}" for k, v in preset.train.items()) or "the train.* defaults below"
        parts.append(f"{name}: models {','.join(preset.models)}; {train}")
    return "; ".join(parts)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from None


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
    what.add_argument("--preset", choices=PRESETS.names(), help=f"training recipe (default quick). {presets_help()}")
    what.add_argument("--data-dir", help=f"folder of task data (GLUE TSVs in the classic layout); else "
                                         f"${DATA_DIR_ENV}, else the hub")
    what.add_argument("--out", help="output folder; records go to OUT/runs/ (default ./runs)")

    train = p.add_argument_group("training (shortcuts for --set train.KEY=VALUE; every key is listed below)")
    for flag, key in TRAIN_SHORTCUTS.items():
        train.add_argument(flag, **_shortcut_options(flag, key))
    train.add_argument("--set", dest="sets", action="append", default=[], metavar="M.KEY=V",
                       help="fix a hyper-parameter of method M (or train.KEY=V; METHOD:train.KEY=V for one "
                            "method only); repeatable")
    train.add_argument("--sweep", dest="sweeps", action="append", default=[], metavar="M.KEY=V1,V2",
                       help="add a grid axis (train.lr=2e-5,3e-5; METHOD:train.lr=... sweeps one method's "
                            "learning rate); several sweeps multiply")

    where = p.add_argument_group("where it runs")
    where.add_argument("--device", help="auto (CUDA when present; default), cpu, cuda, cuda:1 ...")
    where.add_argument("--executor",
                       help="local (default: sequential; one worker process per GPU when several are visible) or ray")
    for name, option in EXECUTOR_OPTIONS.items():
        where.add_argument("--" + name.replace("_", "-"), type=flag_parser(option), metavar=option.metavar,
                           help=option.flag_help)

    outputs = p.add_argument_group("what each run leaves besides its record")
    outputs.add_argument("--save-model", action=argparse.BooleanOptionalAction, default=None,
                         help="keep the fine-tuned weights and tokenizer in OUT/runs/RUN.model/ (off by default)")
    outputs.add_argument("--predict-test", action=argparse.BooleanOptionalAction, default=None,
                         help="write test-set predictions in the GLUE server's format to OUT/runs/RUN.test/")
    outputs.add_argument("--analyses", metavar="NAMES",
                         help="train.analyses: end-of-run analyses on fixed dev examples, a comma list of "
                              f"{', '.join(ANALYSES)} (docs/analyses.md; off by default: they can take as long as a "
                              "short run; a study file asks for them with train: {analyses: ...})")
    outputs.add_argument("--report-to", metavar="TRACKERS",
                         help="comma list of tensorboard, mlflow, wandb: log config and tags, the training loss "
                              "every 25 batches, per-epoch curves and final metrics (local stores under "
                              "OUT/tracking/; wandb offline; experiment: $MLFLOW_EXPERIMENT_NAME, else the study's "
                              "name; docs/tracking.md)")

    control = p.add_argument_group("control")
    control.add_argument("--until-decided", action="store_true",
                         help="add seeds in rounds only to the primary comparisons still undecided, under a "
                              "group-sequential rule that spends alpha across looks (the study's until_decided: "
                              "start, step, cap; default 5, 5, 20 seeds); docs/sequential.md")
    control.add_argument("--replay", action="store_true",
                         help="with --until-decided: train nothing; decide every look again from the records there "
                              "are, with this code's statistics (after an update), and rewrite the state file; a "
                              "comparison whose next look needs seeds without records stays open")
    control.add_argument("--force", action="store_true", help="rerun jobs whose records exist")
    control.add_argument("--quiet", action="store_true",
                         help="no progress bars and no per-epoch lines, only a line per finished run with the "
                              "grid's ETA (a log file, when stderr is no terminal, gets no bars either, but a line "
                              "per run start and epoch and one a minute within a long epoch)")
    control.add_argument("--dry-run", action="store_true",
                         help="print the jobs (marking those whose records exist) and exit; reads no data")
