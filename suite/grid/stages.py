"""The stages a study runs in, planned before anything trains: its tuning stage (`tune:`, suite.grid.tuning), then
the final grid, all at once or in rounds of seeds (`--until-decided`, suite.grid.until_decided).

A command that picks part of a study (`--tasks stsb`) is part of the whole study, which is resolved from the same
`Study` (`resolve_study`) with only the command's place flags: the part is checked against the study's primary
family (alpha is spent over all of it), and its tuning selections are written beside the whole study's cells.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from suite.api.errors import BadInput
from suite.grid.overrides import Overrides
from suite.grid.resolve import GridPlan, RunRequest, resolve_study
from suite.grid.study import Study
from suite.grid.tuning import TuningPlan, plan_tuning_runs

__all__ = ["StudyStages", "plan_stages"]  # what the rest of the suite uses; other names are this module's own


@dataclass
class StudyStages:
    plan: GridPlan                             # the final grid (every seed up to the cap under --until-decided)
    tuning: TuningPlan | None = None           # the study's tuning stage, run before the final grid
    whole_tuning: TuningPlan | None = None     # the whole study's, when the flags picked part of it

    @property
    def request(self) -> RunRequest:
        return self.plan.request


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def plan_stages(study: Study, overrides: Overrides, note: Callable[[str], None] = _stderr) -> StudyStages:
    """Every stage of the study with the command line's overrides; BadInput (exit 2) for anything a stage would
    refuse later: a tuning space, a missing reference or primary comparison, a pick that shrinks the primary family.
    `note` hears what goes ahead in part (primary cells that get no looks)."""
    plan = resolve_study(study, overrides)
    request = plan.request
    whole = None
    if request.picked and (overrides.until_decided or study.tune is not None):
        whole = _of_whole(request, lambda: resolve_study(study, overrides.of_whole_study(request.defines)))
    if overrides.until_decided:  # no primary comparison, a sweep or a missing reference: exit 2 before training
        check_primary_family(plan, whole, note)
    if plan.outputs.report_to:  # trackers group the runs by study and grid
        from suite.run.tracking import with_grid_tags

        plan.jobs = with_grid_tags(plan.jobs, study.source)
    stages = StudyStages(plan)
    if study.tune is not None:  # first the tuning stage; the final grid runs the configurations it selects
        stages.tuning = plan_tuning_runs(study.tune, plan.jobs, plan.seeds, request.out)
        if whole is not None:
            stages.whole_tuning = _of_whole(request, lambda: plan_tuning_runs(study.tune, whole.jobs, whole.seeds,
                                                                              whole.request.out))
    return stages


def check_primary_family(plan: GridPlan, whole: GridPlan | None, note: Callable[[str], None]) -> None:
    """The grid has primary comparisons to look at, and a picked part keeps every one of the whole study's."""
    from suite.grid.until_decided import primary_comparisons, same_family

    whole_primary = _of_whole(plan.request, lambda: primary_comparisons(whole)) if whole is not None else None
    try:
        primary = primary_comparisons(plan, note=note)
    except BadInput:
        if whole_primary is None:
            raise
        primary = []  # the pick left no primary comparison: same_family says which of the study's it drops
    if whole_primary is not None:
        same_family(primary, whole_primary, plan.request.picked_flags())


def _of_whole(request: RunRequest, make):
    """`make()`, whose BadInput names the whole study it came from."""
    try:
        return make()
    except BadInput as exc:
        raise BadInput(f"{request.source} as a whole (this run, with {request.picked_flags()}, is part of it and is "
                       f"checked against it): {exc}") from None
