"""Study files: a whole study (models, tasks, methods, seeds, training settings, sets and sweeps, data, output folder,
executor, outputs, report options) in one YAML file, run with `python -m suite run --study FILE` and reported with
`python -m suite report --study FILE`. Command-line flags override the file.

OmegaConf reads the YAML (`${oc.env:VAR}` is the one interpolation read, bounded: `_resolved`) and pydantic checks
it: an unknown key or a value of the wrong type is an error that names the file and the key. Paths are relative to
the folder the command runs in, as flags are.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import io
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import pydantic

from suite.api.errors import BadInput
from suite.grid.overrides import STUDY_KEYS, Names
from suite.grid.plan import parse_assignment
from suite.run.settings import TrainSettings
from suite.stats.report_options import REPORT_FIELDS, checked_per_task

# what the rest of the suite uses; other names are this module's own
__all__ = ["AlsoGrid", "Study", "bounded_study_text", "load_study", "names"]

Scalar = Union[bool, int, float, str, None]


class _Section(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=False, frozen=True)


def _not_a_truth_value(value: Any) -> Any:
    """YAML's true/false where a number belongs is an error: pydantic would read it as 1 or 0 (`lr: true` ran at
    a learning rate of 1.0)."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a number")
    return value


def _no_truth_values(hint: Any) -> Any:
    """The optional form of a setting's type; a number refuses true/false."""
    args = typing.get_args(hint) or (hint,)
    if bool not in args and any(a in (int, float) for a in args):
        return typing.Annotated[Optional[hint], pydantic.BeforeValidator(_not_a_truth_value)]
    return Optional[hint]


def _train_section() -> type[pydantic.BaseModel]:
    """Every TrainSettings field, optional (absent: the preset's value); null is kept where the field allows it."""
    hints = typing.get_type_hints(TrainSettings)
    fields = {f.name: (_no_truth_values(hints[f.name]), None) for f in dataclasses.fields(TrainSettings)}
    return pydantic.create_model("TrainSection", __base__=_Section, **fields)


TrainSection = _train_section()


def _study_fields(section: str) -> dict[str, Any]:
    """The declared study keys of a section ("": the top level) as optional fields, each of its declared type (read
    by its `parse` first, where it has one): `suite.grid.overrides.STUDY_KEYS`."""
    fields = {}
    for key, declared in STUDY_KEYS.items():
        where, _, name = key.rpartition(".")
        if where == section:
            kind = Annotated[declared.type, pydantic.BeforeValidator(declared.parse)] if declared.parse \
                else declared.type
            fields[name] = (Optional[kind], None)
    return fields


ExecutorSection = pydantic.create_model("ExecutorSection", __base__=_Section, **_study_fields("executor"))
OutputsSection = pydantic.create_model("OutputsSection", __base__=_Section, **_study_fields("outputs"))


def _bounded(low: float | None = None, high: float | None = None, at_least: float | None = None) -> Any:
    """A number within bounds (NaN fails every bound); true/false is no number."""
    limits = {k: v for k, v in (("gt", low), ("lt", high), ("ge", at_least)) if v is not None}
    return Annotated[float, pydantic.BeforeValidator(_not_a_truth_value), pydantic.Field(**limits)]


Level = _bounded(0, 1)       # a level strictly between 0 and 1
Positive = _bounded(0)
NonNegative = _bounded(at_least=0)
Count = Annotated[int, pydantic.BeforeValidator(_not_a_truth_value)]  # a number of seeds: true is not 1


def _report_section() -> type[pydantic.BaseModel]:
    """The report's options a study file gives (`suite.stats.report_options.ReportOptions`, each declared there with
    its values), optional: a comma list as a YAML list or a comma string, a bounded number within its bounds (one
    number, or task -> number where it may differ per task)."""
    fields = {}
    for name, declared in REPORT_FIELDS.items():
        meta = declared.metadata
        if meta["study"] is None:
            continue
        kind = Names if meta["comma_list"] else meta["study"]
        if meta["bounds"]:
            bounds = meta["bounds"]
            kind = _bounded(bounds.above, bounds.below, bounds.at_least)
        if meta["per_task"]:  # one number, or task -> number: checked in the suite's words (report_options)
            kind = Annotated[Any, pydantic.BeforeValidator(functools.partial(checked_per_task, f"report.{name}",
                                                                             bounds=meta["bounds"]))]
        fields[name] = (Optional[kind], None)
    return pydantic.create_model("ReportSection", __base__=_Section, **fields)


ReportSection = _report_section()


class UntilDecidedSection(_Section):
    """`run --until-decided` (suite.grid.until_decided): looks at start, start + step, ... seeds up to cap; the
    alpha-spending function (obrien-fleming or pocock) and the futility threshold (predictive power; 0: never)."""

    start: Optional[Count] = None
    step: Optional[Count] = None
    cap: Optional[Count] = None
    spending: Optional[str] = None
    futility: Optional[float] = None


class TuneSection(_Section):
    """The tuning protocol (docs/protocol.md): a tuning split carved from the train set, seeds kept for tuning, and
    per method either its whole grid (`budget: all`) or an equal budget of configurations drawn from it."""

    holdout: Positive                     # a fraction of the train split, or a count; the final runs keep it too
    holdout_seed: Optional[int] = None
    seeds: list[int]                      # tuning seeds: disjoint from the final grid's; 3 or more recommended
    # configurations per method, the same for every method; `all`: every method's whole grid (the shared settings'
    # grid crossed with its own hyper-parameters)
    budget: Union[Annotated[pydantic.PositiveInt, pydantic.BeforeValidator(_not_a_truth_value)], Literal["all"]]
    space: dict[str, dict[str, list[Scalar]]]  # method (or default) -> KEY -> values, as --sweep writes them
    draw_seed: int = 0                    # seed of the draw of `budget` configurations from a larger space
    # how `budget` points are drawn from a larger grid: stratified (every point of the default space, e.g. every
    # learning rate, at least once) or uniform (a plain draw from the whole grid, as the quick-preset study ran)
    draw: Literal["stratified", "uniform"] = "stratified"


class TaskNoise(_Section):
    """A task's noise for the power table, points x100 (docs/statistics.md, "Power before running")."""

    seed_sd: Positive                    # sd of one seed's paired difference (method - reference)
    example_se: NonNegative = 0.0        # sd of the dev-set offset all seeds share (sqrt of v_shared)


class PowerSection(_Section):
    """The power table of `run --dry-run` (suite.grid.power_table): each task's noise, declared here or estimated
    from the records of a pilot folder (default: the study's own `out`), and the decision probability its seeds and
    margin columns aim at."""

    tasks: dict[str, TaskNoise] = pydantic.Field(default_factory=dict)   # task (or default) -> its noise
    pilot: Optional[str] = None           # a folder of records (OUT of an earlier study) for the tasks not declared
    target: Optional[Level] = None        # probability of a decision at a true difference of 0 (default 0.8)


class _Grid(_Section):
    """What one grid of a study varies: models x tasks x methods x seeds, its training settings, sets and sweeps."""

    models: Optional[Names] = None
    tasks: Optional[Names] = None
    methods: Optional[Names] = None
    seeds: Optional[list[int]] = None
    train: TrainSection = pydantic.Field(default_factory=TrainSection)
    set: dict[str, Scalar] = pydantic.Field(default_factory=dict)
    sweep: dict[str, list[Scalar]] = pydantic.Field(default_factory=dict)
    description: Optional[str] = None

    def train_values(self) -> dict[str, Any]:
        """The training settings the file gives (null included: `max_train_samples: null` means all)."""
        return self.train.model_dump(exclude_unset=True)

    def assignments(self) -> tuple[list[str], list[str]]:
        """`set` and `sweep` as the command line writes them (METHOD.KEY=V, METHOD.KEY=V1,V2)."""
        sets = [f"{k}={_text(v)}" for k, v in self.set.items()]
        sweeps = [f"{k}={','.join(_text(v) for v in values)}" for k, values in self.sweep.items()]
        return sets, sweeps


class AlsoGrid(_Grid):
    """A further grid of the study (`also:`): it inherits every key it does not give from the study's top level;
    its train:, set: and sweep: entries add to the top level's."""


# the keys every grid of a study shares, as STUDY_KEYS declares them: preset, data_dir, out, device, and the
# executor: and outputs: sections
_SharedKeys = pydantic.create_model(
    "_SharedKeys", __base__=_Grid, **_study_fields(""),
    executor=(ExecutorSection, pydantic.Field(default_factory=ExecutorSection)),
    outputs=(OutputsSection, pydantic.Field(default_factory=OutputsSection)))


class Study(_SharedKeys):
    """A whole study, frozen once read: its top grid, the keys every grid shares (preset, data, output folder,
    executor, outputs: declared in `suite.grid.overrides.STUDY_KEYS`), the report's options, its further grids
    (`also:`), its tuning stage and its rounds of seeds. A command line overrides it
    (`suite.grid.resolve.resolve_study`); the empty study is a command without a file."""

    report: ReportSection = pydantic.Field(default_factory=ReportSection)
    also: list[AlsoGrid] = pydantic.Field(default_factory=list)  # further grids, written to the same folder
    tune: Optional[TuneSection] = None  # tune every method on a held-out split first (suite.grid.tuning)
    until_decided: Optional[UntilDecidedSection] = None  # run --until-decided: seeds in rounds where undecided
    power: Optional[PowerSection] = None  # the dry run's power table: declared noise, pilot folder, target
    _source: Optional[str] = pydantic.PrivateAttr(default=None)  # the file as the command named it (messages)

    @property
    def source(self) -> str | None:
        """The study file as the command named it; None for the empty study of a command without one."""
        return self._source

    def report_options(self) -> dict[str, Any]:
        """The report: section as the options of `report` (comma lists as lists); None: not given."""
        given = self.report.model_dump()
        return {key: names(value).split(",") if REPORT_FIELDS[key].metadata["comma_list"] and value is not None
                else value for key, value in given.items()}


def _text(value: Scalar) -> str:
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def names(value: Names | None) -> str | None:
    """A YAML list or comma string as the comma list the command line takes."""
    if value is None:
        return None
    return ",".join(value) if isinstance(value, list) else value


def _section_keys(model: type[pydantic.BaseModel], loc: tuple) -> list[str]:
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list such as also:
            continue
        field = model.model_fields.get(str(part))
        annotation = field and (typing.get_args(field.annotation) or [field.annotation])[0]
        if not (isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _explain(path: Path, error: pydantic.ValidationError) -> str:
    lines = []
    for e in error.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            valid = _section_keys(Study, e["loc"])
            close = difflib.get_close_matches(str(e["loc"][-1]), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{path}: unknown key {key!r}{hint}. Valid keys here: {', '.join(valid)}")
        else:
            lines.append(f"{path}: {e['msg'].removeprefix('Value error, ')}" if e["type"] == "value_error" and
                         key.startswith("report.") else f"{path}: {key}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


# Bounds on what a study file may make the reader hold: a study is a few kilobytes and a few hundred values.
MAX_STUDY_BYTES = 1 << 20        # the file
MAX_STUDY_NODES = 100_000        # YAML values with every alias (*name) expanded: an alias bomb stops here
ENV_INTERPOLATION = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^${}]*))?\}")


def _bounded_text(path: Path) -> str:
    """The file's text, refused beyond MAX_STUDY_BYTES or MAX_STUDY_NODES values once aliases are expanded."""
    with open(path, "rb") as f:
        return bounded_study_text(f.read(MAX_STUDY_BYTES + 1))


def bounded_study_text(blob: bytes) -> str:
    """A study file's bytes as text; ValueError beyond MAX_STUDY_BYTES or MAX_STUDY_NODES values once aliases are
    expanded (an alias bomb)."""
    import yaml

    if len(blob) > MAX_STUDY_BYTES:
        raise ValueError(f"larger than {MAX_STUDY_BYTES // 1024} KiB; a study file declares a grid in a few "
                         "kilobytes")
    text = blob.decode("utf-8")
    sizes: dict[int, int] = {}

    def size(node) -> int:  # the composed graph shares an alias's node: each node's expanded size once
        if id(node) not in sizes:
            sizes[id(node)] = MAX_STUDY_NODES + 1  # a node inside itself (a recursive alias) counts as too many
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
            sizes[id(node)] = min(MAX_STUDY_NODES + 1, 1 + sum(size(child) for child in children))
        return sizes[id(node)]

    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is not None and size(document) > MAX_STUDY_NODES:
            raise ValueError(f"more than {MAX_STUDY_NODES:,} values once its aliases (*name) are expanded")
    return text


def _resolved(path: Path, data: Any, where: str = "") -> Any:
    """`data` with each `${oc.env:VAR}` / `${oc.env:VAR,default}` replaced by the environment's value. Any other
    interpolation (`${key}`, another resolver) is refused: OmegaConf resolved every one of them, unknown keys included,
    before the file could be checked, and 40 lines of `sN: '${sN-1}${sN-1}'` took 18.6 GB."""
    import os

    if isinstance(data, dict):
        return {k: _resolved(path, v, f"{where}{k}.") for k, v in data.items()}
    if isinstance(data, list):
        return [_resolved(path, v, f"{where}[{i}].") for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data
    key = where.rstrip(".")

    def env(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise BadInput(f"{path}: {key}: the environment variable {name} is not set (${{oc.env:{name}}}); set it "
                           f"or give a default: ${{oc.env:{name},DEFAULT}}")
        return default.strip()

    whole = ENV_INTERPOLATION.fullmatch(data)
    if whole and whole.group(2) is not None and whole.group(2).strip() == "null" and whole.group(1) not in os.environ:
        return None
    value = ENV_INTERPOLATION.sub(env, data)
    if "${" in ENV_INTERPOLATION.sub("", data):
        raise BadInput(f"{path}: {key}: {data[:80]!r}: a study file reads only ${{oc.env:VAR}} (or "
                       "${oc.env:VAR,default}) interpolations, not references to other keys or other resolvers; "
                       "write the value out (docs/studies.md)")
    return value


def load_study(path: str | Path) -> Study:
    """Read and check a study file; BadInput names the file and every bad key."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    given, path = path, Path(path)
    if not path.is_file():
        raise BadInput(f"study file {path} does not exist (studies live in studies/*.yaml)")
    try:
        text = _bounded_text(path)
        data = OmegaConf.to_container(OmegaConf.load(io.StringIO(text)), resolve=False)  # resolved below, bounded
    except (OmegaConfBaseException, yaml.YAMLError, ValueError, OSError, RecursionError) as exc:  # yaml: the line
        raise BadInput(f"{path}: not a readable study file: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a study file is a YAML mapping (keys such as methods:, tasks:, train:)")
    data = _resolved(path, data)
    try:
        study = Study.model_validate(data)
    except pydantic.ValidationError as exc:
        raise BadInput(_explain(path, exc)) from None
    study._source = str(given)
    for where, grid in [("", study), *((f"also[{i}].", g) for i, g in enumerate(study.also))]:
        sets, sweeps = grid.assignments()
        for section, texts, sweep in (("set", sets, False), ("sweep", sweeps, True)):
            for text in texts:
                try:
                    parse_assignment(text, sweep=sweep)
                except BadInput as exc:
                    raise BadInput(f"{path}: {where}{section}.{text.split('=', 1)[0]}: {exc}") from None
    if study.tune is not None:
        from suite.grid.tuning import check_space

        try:
            check_space(study.tune, [(f"also[{i}].train", g.train_values()) for i, g in enumerate(study.also)])
        except BadInput as exc:
            raise BadInput(f"{path}: {exc}") from None
    return study
