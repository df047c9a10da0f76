"""The output folder's layout, in one place: where every file of `OUT` lives, and typed readers and writers for the
two state files a grid leaves beside its records (the tuning stage's selection, the sequential design's looks).

    OUT/runs/                      the final grid's records (STEM.json), prediction sidecars, saved models, test sets
    OUT/tuning/runs/               the tuning stage's records, where no leaderboard looks
    OUT/tuning/selection.json      each cell's tuning-split scores and the configuration chosen (SelectionFile)
    OUT/until_decided.json         the sequential design's looks and decisions (UntilDecidedFile)
    OUT/commands.txt               the commands that wrote the folder (the report's header prints them)
    OUT/tracking/                  tracker logs (train.report_to)

The grid writes the state files and the report reads them through the same models, so neither holds a file name
or a field of its own; a damaged file stops the reader with its path and the field that is wrong (BadInput, exit 2),
never a traceback.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pydantic

from suite.api.errors import BadInput

__all__ = ["COMMANDS", "RUNS", "SELECTION", "TRACKING", "TUNING", "UNTIL_DECIDED", "OutputFolder", "check_folder_name",
           "own_folder",
           "SelectedCell", "TuningProtocol", "SelectionFile", "Look", "TrackedComparison",
           "UntilDecidedFile", "read_state", "state_json"]

RUNS = "runs"
TUNING = "tuning"
SELECTION = "selection.json"
UNTIL_DECIDED = "until_decided.json"
COMMANDS = "commands.txt"
TRACKING = "tracking"


class OutputFolder:
    """The paths of one output folder (`OUT`); `tuning` is the tuning stage's own folder inside it."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def runs(self) -> Path:
        return self.root / RUNS

    @property
    def tuning(self) -> OutputFolder:
        return OutputFolder(self.root / TUNING)

    @property
    def selection(self) -> Path:
        return self.root / TUNING / SELECTION

    @property
    def until_decided(self) -> Path:
        return self.root / UNTIL_DECIDED

    @property
    def commands(self) -> Path:
        return self.root / COMMANDS

    @property
    def tracking(self) -> Path:
        return self.root / TRACKING

    def artifact(self, record_filename: str, kind: str) -> Path:
        """OUT/runs/STEM.KIND beside the record OUT/runs/STEM.json (kind: model, test)."""
        return self.runs / f"{record_filename.removesuffix('.json')}.{kind}"


def check_folder_name(flag: str, folder: str | Path) -> None:
    """BadInput when a folder named on the command line or in a study holds a control character (a newline would
    split the line of commands.txt that names it, and every line that prints it) or bytes that are not text in the
    file system's encoding (a non-UTF-8 name under a UTF-8 locale, which no record or printed line can hold)."""
    text = str(folder)
    if not text.strip():  # Path('') is the current folder: an empty out: wrote into ./runs
        raise BadInput(f"{flag} {text!r} names no folder: give a folder's name (e.g. {flag} runs), or leave the key "
                       "out for the default")
    control = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if control is not None:
        raise BadInput(f"{flag} {text!r} holds the control character {control!r}: give a folder name without "
                       "newlines, tabs or other control characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes arrive as lone surrogates (surrogateescape)
        raise BadInput(f"{flag} {text.encode('utf-8', 'backslashreplace').decode()} is not UTF-8 text (bytes of "
                       "another encoding in the name): give a folder name in UTF-8 (or ASCII)") from None


def own_folder(folder: str | Path) -> Path:
    """`folder`, made a real folder of the output folder's own before anything is written into it: a symbolic link
    planted at it (to a folder elsewhere, or dangling) is removed, never written through, and so are links inside
    it. Every folder the suite creates under `OUT` goes through here (run artifacts, tuning, tracking)."""
    folder = Path(folder)
    if folder.is_symlink():
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.is_symlink():
            entry.unlink()
    return folder


class _Model(pydantic.BaseModel):
    # fields a newer version adds are kept as they are (and written back), so an older reader never drops them
    model_config = pydantic.ConfigDict(extra="allow", frozen=True)


# ---------------------------------------------------------------------------------------------------------
# OUT/tuning/selection.json
# ---------------------------------------------------------------------------------------------------------

class Configuration(_Model):
    settings: dict[str, Any]                  # {"train.lr": 1e-4, "METHOD.KEY": value}
    scores: dict[str, Optional[float]]        # tuning seed -> tuning-split score (None: no record; NaN: failed)
    mean: Optional[float]                     # over the tuning seeds; None unless every run has a score


class SelectedCell(_Model):
    model: str
    task: str
    method: str
    higher_is_better: bool
    configurations: list[Configuration]
    selected: Optional[dict[str, Any]]        # the chosen configuration's settings; None: not chosen yet
    reason: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.model, self.task, self.method


class TuningProtocol(_Model):
    holdout: Optional[float]
    holdout_seed: Optional[int]
    seeds: list[int]
    budget: int | str                         # configurations per method; "all": each method's whole grid
    draw_seed: int
    draw: Optional[str] = None                # stratified or uniform; absent: written before draws had a name
    space: dict[str, dict[str, list[Any]]]    # method -> "train.lr"/"METHOD.KEY" -> the values searched
    scored_on: str


class SelectionFile(_Model):
    protocol: TuningProtocol
    cells: list[SelectedCell]


# ---------------------------------------------------------------------------------------------------------
# OUT/until_decided.json
# ---------------------------------------------------------------------------------------------------------

class Look(_Model):
    look: int
    planned_seeds: int
    n: int
    seeds: list[int]
    reason: str                               # efficacy, equivalence, futility, cap, continue
    verdict: str                              # better, worse, equivalent, undecided
    note: Optional[str] = None
    level: Optional[float] = None
    level_equiv: Optional[float] = None
    diff: Optional[float] = None
    se: Optional[float] = None
    df: Optional[float] = None
    low: Optional[float] = None
    high: Optional[float] = None
    p: Optional[float] = None
    p_equiv: Optional[float] = None
    margin: Optional[float] = None
    seed_sd: Optional[float] = None
    example_se: Optional[float] = None
    predictive_power: Optional[float] = None    # of a futility stop
    conditional_power: Optional[float] = None   # what futility stops wrote before predictive power
    # the collapse endpoint: `seeds` are those where neither run degenerated, `paired` all paired seeds
    paired: Optional[int] = None
    degenerate: Optional[int] = None
    degenerate_reference: Optional[int] = None
    collapse_p: Optional[float] = None


class TrackedComparison(_Model):
    model: str
    task: str
    method: str
    reference: str
    reason: str
    verdict: str
    looks: list[Look]


class ScheduleSection(_Model):
    start: int
    step: int
    cap: int
    spending: str
    futility: float


class UntilDecidedFile(_Model):
    written: str
    schedule: ScheduleSection
    looks: list[int]
    seed_order: list[int]
    alpha: float
    primary: int
    alpha_each: float
    rule: str
    comparisons: list[TrackedComparison]


# ---------------------------------------------------------------------------------------------------------
# Reading and writing
# ---------------------------------------------------------------------------------------------------------

def read_state(path: Path, kind: type[_Model]):
    """The state file at `path` as `kind`; BadInput naming the file and what is wrong when it cannot be one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise BadInput(f"{path}: cannot be read as JSON ({why}); it is written by `python -m suite run`: delete it "
                       "and give the run's command again to write it anew") from None
    try:
        return kind.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the whole file"
        raise BadInput(f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s)); it is written by "
                       "`python -m suite run`: delete it and give the run's command again to write it anew") from None


def state_json(state: _Model) -> bytes:
    """The bytes a state file holds: JSON indented by one, fields in their declared order, unset ones left out."""
    return json.dumps(state.model_dump(mode="json", exclude_unset=True), indent=1, default=str).encode()
