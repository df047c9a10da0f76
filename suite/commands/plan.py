"""`python -m suite plan`: the power of a study's design before anything runs. It takes `run`'s options (the same
study, picks, seeds and `--until-decided` give the same grid and design) and prints, per task of the primary
comparisons, the chance of each verdict and what a decision at a true difference of 0 would take
(suite.grid.power_table; docs/statistics.md, "Power before running"), then where the data comes from and what the
grid costs per device, as a dry run says. It trains nothing and writes nothing but its answer's entry in the startup
cache (`suite.api.startup_cache`): the same options, code, study file and records print the kept answer without
simulating again."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

from suite.commands.run_options import add_run_options, run_overrides

COMMAND = "plan"


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a probability between 0 and 1, got {text!r}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser(COMMAND, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Before anything runs: for each task of the primary comparisons, the chance that\n"
                                   "one ends better/worse, equivalent or undecided (and stopped for futility under\n"
                                   "--until-decided) at a true difference of 0, the margin and twice the margin, by\n"
                                   "simulating the design; and the seeds or the margin a decision at 0 would take.\n"
                                   "Each task's noise is the study's power: tasks: entry, else estimated from pilot\n"
                                   "records (--pilot DIR, else power: pilot:, else the study's out folder).\n"
                                   "Takes run's options; nothing trains.")
    power = p.add_argument_group("power")
    power.add_argument("--pilot", metavar="DIR", help="output folder of earlier runs to estimate each task's noise "
                                                      "from (its runs/ records)")
    power.add_argument("--target", type=_probability, metavar="P",
                       help="probability of a decision at a true difference of 0 that the seeds and margin columns "
                            "aim at (default: the study's power: target:, else 0.8)")
    add_run_options(p)


def main(args) -> int:
    from suite.api import startup_cache

    startup_cache.plan_only()
    keep = startup_cache.usable()   # a process that imported torch already (the tests) computes every time
    static = {**startup_cache.interpreter(), "cwd": os.getcwd(),
              "args": json.loads(json.dumps(vars(args), sort_keys=True, default=str))}
    answer = startup_cache.read(COMMAND, static) if keep else None
    if answer is None and keep:
        answer, files = startup_cache.files_read(lambda: _answer(args))
        startup_cache.write(COMMAND, static, files + startup_cache.loaded_code(), answer)
    elif answer is None:
        answer = _answer(args)
    sys.stderr.write(answer["stderr"])
    print("\n".join(answer["lines"]))
    return 0


def _answer(args) -> dict:
    """The power table's lines, the data source and cost lines, and what planning said on stderr (a note on primary
    cells without looks)."""
    from suite.commands.run import data_and_cost_lines
    from suite.grid.power_table import pilot_folder, power_lines
    from suite.grid.stages import plan_stages
    from suite.grid.study import Study, load_study

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            study = load_study(args.study) if args.study else Study()
            stages = plan_stages(study, run_overrides(args))
            lines = power_lines(stages.plan, pilot=args.pilot, target=args.target)
            lines += [""] + data_and_cost_lines(stages, pilot_folder(stages.plan, args.pilot))
    except BaseException:
        sys.stderr.write(said.getvalue())   # what planning said before it refused
        raise
    return {"lines": lines, "stderr": said.getvalue()}
