"""The options of `python -m suite run`, each with its help text; a training flag's help is its setting's own
(`suite.run.settings.TrainSettings`), and so is the `train.KEY` listing of `run --help`.

Options default to None so that a study file (`--study`) can fill what the command line leaves out;
`suite.grid.resolve.RUN_DEFAULTS`
applies after that.
"""
from __future__ import annotations

import argparse

from suite.run.data import DATA_DIR_ENV
from suite.run.settings import ANALYSES, DEFAULT_MODEL, PRECISIONS, PRESETS, TRAIN_FIELDS, setting_help


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
    train.add_argument("--epochs", type=int, help="train.epochs: " + setting_help("epochs"))
    train.add_argument("--lr", type=float, help="train.lr: " + setting_help("lr"))
    train.add_argument("--batch-size", type=int, help="train.batch_size: " + setting_help("batch_size"))
    train.add_argument("--max-length", type=int, help="train.max_length: " + setting_help("max_length"))
    train.add_argument("--max-train-samples", type=int, help="train.max_train_samples: seeded train subset "
                                                             "(drawn per run seed, the same for every method; "
                                                             "train.data_seed fixes one draw)")
    train.add_argument("--max-eval-samples", type=int, help="train.max_eval_samples: seeded dev subset")
    train.add_argument("--precision", choices=PRECISIONS,
                       help="train.precision: " + setting_help("precision"))
    train.add_argument("--grad-accumulation", type=int, metavar="N",
                       help="train.grad_accumulation: " + setting_help("grad_accumulation"))
    train.add_argument("--early-stopping", type=int, metavar="PATIENCE",
                       help="train.early_stopping_patience: " + setting_help("early_stopping_patience"))
    train.add_argument("--compile", action="store_true", default=None, help="train.compile=true: "
                                                                            + setting_help("compile"))
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
    where.add_argument("--workers", type=int, help="local executor: worker processes (default: 1 on CPU, one per GPU)")
    where.add_argument("--max-run-minutes", type=float, metavar="M",
                       help="local executor: a run still going after M minutes (hung, stopped) is killed and recorded "
                            "failed, and the grid goes on; runs each job in a worker process (default: "
                            "$SUITE_MAX_RUN_MINUTES, else no limit)")
    where.add_argument("--address", help="ray executor: cluster to join (auto, HOST:PORT, ray://HOST:10001); "
                                         "default: start a local cluster")
    where.add_argument("--gpus-per-run", type=float, help="ray executor: GPUs per run (default 1; 0.5 packs two "
                                                          "runs per GPU)")
    where.add_argument("--cpus-per-run", type=float, help="ray executor: CPUs per run (default 1)")

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
    control.add_argument("--force", action="store_true", help="rerun jobs whose records exist")
    control.add_argument("--quiet", action="store_true",
                         help="no progress bars, only a line per finished run with the grid's ETA (what a log "
                              "file gets anyway when stderr is no terminal)")
    control.add_argument("--dry-run", action="store_true",
                         help="print the jobs (marking those whose records exist) and exit; reads no data")
