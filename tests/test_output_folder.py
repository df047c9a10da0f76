"""The output folder's layout (suite.run.layout): the state files read back through their models and written again
give the same bytes, and a damaged one stops with its path and the field that is wrong, never a traceback."""
import json
from pathlib import Path

import pytest

from suite.api.errors import BadInput
from suite.run.layout import OutputFolder, SelectionFile, UntilDecidedFile, read_state, state_json

RESULTS = OutputFolder(Path(__file__).resolve().parents[1] / "results")


@pytest.mark.parametrize("path, kind", [(RESULTS.selection, SelectionFile), (RESULTS.until_decided, UntilDecidedFile)])
def test_the_published_state_files_round_trip_byte_for_byte(path, kind):
    assert state_json(read_state(path, kind)) == path.read_bytes()


def test_paths_of_an_output_folder(tmp_path):
    out = OutputFolder(tmp_path)
    assert out.runs == tmp_path / "runs" and out.tuning.runs == tmp_path / "tuning" / "runs"
    assert out.selection == tmp_path / "tuning" / "selection.json"
    assert out.until_decided == tmp_path / "until_decided.json"
    stem = "rte__vanilla__seed1__m__abc"
    assert out.artifact(f"{stem}.json", "model") == tmp_path / "runs" / f"{stem}.model"


def _damaged_selections():
    good = json.loads(RESULTS.selection.read_text())
    cell = good["cells"][0]
    yield "not json", "{", "cannot be read as JSON"
    yield "a list", "[]", "the whole file"
    yield "no protocol", json.dumps({"cells": []}), "protocol: Field required"
    yield "a cell's model a number", json.dumps({**good, "cells": [{**cell, "model": 3}]}), "cells.0.model"
    yield "scores a list", json.dumps({**good, "cells": [{**cell, "configurations": [{"settings": {}, "scores": [],
                                                                                     "mean": None}]}]}), "scores"


@pytest.mark.parametrize("name, text, says", list(_damaged_selections()), ids=[d[0] for d in _damaged_selections()])
def test_a_damaged_state_file_names_itself_and_the_field(tmp_path, name, text, says):
    path = tmp_path / "selection.json"
    path.write_text(text)
    with pytest.raises(BadInput, match="delete it and give the run's command again") as err:
        read_state(path, SelectionFile)
    assert str(path) in str(err.value) and says in str(err.value)


def test_fields_a_newer_version_adds_are_kept(tmp_path):
    data = json.loads(RESULTS.until_decided.read_text()) | {"added_later": {"x": 1}}
    path = tmp_path / "until_decided.json"
    path.write_text(json.dumps(data, indent=1))
    assert json.loads(state_json(read_state(path, UntilDecidedFile)))["added_later"] == {"x": 1}


def test_a_link_planted_at_the_tracking_folder_is_replaced(tmp_path):
    """OUT/tracking pointing out of the output folder: trackers never write through it."""
    from suite.run.tracking import RunTracking

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tracking").symlink_to(outside, target_is_directory=True)
    from suite.run.settings import RunConfig, TrainSettings

    config = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings()).to_dict()
    RunTracking([], tmp_path / "out" / "tracking", "run", config)
    assert (tmp_path / "out" / "tracking").is_dir() and not (tmp_path / "out" / "tracking").is_symlink()
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["../../evil_task", "sub/dir", ".hidden", "back\\slash"])
def test_a_name_that_would_leave_the_output_folder_is_refused_at_registration(name):
    """Records are named TASK__METHOD__...: a registered name must be a plain file-name part, for every registry."""
    import dataclasses

    from suite.api.tasks import TASKS, get_task, register_task

    with pytest.raises(ValueError, match="cannot name files"):
        register_task(dataclasses.replace(get_task("rte"), name=name))
    assert name not in TASKS


@pytest.mark.parametrize("plant", ["tuning is a file", "selection is a folder", "looks are a folder",
                                   "tuning is read-only"])
def test_the_folders_and_state_files_a_grid_will_write_are_probed_before_training(tmp_path, plant):
    """OUT/tuning as a file or read-only, or a state file that is a folder, gave a raw OSError after training."""
    import os

    from suite.grid.preflight import check_out
    from suite.grid.store import Store

    out = OutputFolder(tmp_path / "out")
    out.root.mkdir()
    if plant == "tuning is a file":
        out.tuning.root.write_text("x")
    elif plant == "selection is a folder":
        out.selection.mkdir(parents=True)
    elif plant == "looks are a folder":
        out.until_decided.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        out.tuning.root.mkdir()
        out.tuning.root.chmod(0o500)
    with pytest.raises(BadInput, match=f"--out {out.root}"):
        check_out(Store(out.root), tuning=True, until_decided=True)


def test_a_link_planted_at_the_tuning_folder_is_replaced_before_the_probe(tmp_path):
    from suite.grid.preflight import check_out
    from suite.grid.store import Store

    outside, out = tmp_path / "outside", OutputFolder(tmp_path / "out")
    outside.mkdir()
    out.root.mkdir()
    out.tuning.root.symlink_to(outside, target_is_directory=True)
    check_out(Store(out.root), tuning=True)
    assert not out.tuning.root.is_symlink() and out.tuning.runs.is_dir() and list(outside.iterdir()) == []


def test_files_returned_by_a_ray_worker_replace_links_planted_at_their_folders(tmp_path):
    """A link at RUN.model crashed the grid (the tar filter refuses to extract through it) and the rerun wrote no
    record; returned files now replace the link, and nothing outside the output folder changes."""
    import io
    import tarfile

    from suite.grid.executors.returned import unpack

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("runs/RUN.model/model.safetensors", "tracking/tensorboard/events"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"data"))
    outside, out = tmp_path / "outside", tmp_path / "out"
    outside.mkdir()
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "RUN.model").symlink_to(outside, target_is_directory=True)
    (out / "tracking").symlink_to(outside, target_is_directory=True)
    unpack(buffer.getvalue(), out)
    assert list(outside.iterdir()) == []
    assert (out / "runs" / "RUN.model" / "model.safetensors").read_bytes() == b"data"
    assert not (out / "runs" / "RUN.model").is_symlink() and not (out / "tracking").is_symlink()


def _rescore(d, value):
    """The first configuration's one tuning score set to `value`, its mean following (None when it is not a number)."""
    c = d["cells"][0]["configurations"][0]
    c["scores"]["101"], c["mean"] = value, value if value == value else None


@pytest.mark.parametrize("edit, says", [
    (lambda d: _rescore(d, 0.5), "the file is stale or edited"),
    (lambda d: _rescore(d, float("nan")), "scored nan here, but its record 0.772"),  # abs(nan - x) > 1e-12 is False
    (lambda d: d["cells"][0]["configurations"][0].update(mean=float("nan")), "has mean nan, but its scores"),
    (lambda d: d["cells"][0]["configurations"][0].update(mean=0.99), "has mean 0.99, but its scores"),
    (lambda d: d["cells"][0].update(selected=next(c["settings"] for c in d["cells"][0]["configurations"]
                                                  if c["settings"] != d["cells"][0]["selected"])),
     "but the best mean tuning-split score is"),
])
def test_a_stale_or_edited_selection_is_refused_naming_the_file(tmp_path, edit, says):
    """A stale selection.json was printed as the study's selection and decided which runs the tables show."""
    import shutil

    from suite.api.errors import ReportError
    from suite.report.state_checks import check_selection

    shutil.copytree(RESULTS.tuning.root, tmp_path / "tuning")
    path = OutputFolder(tmp_path).selection
    check_selection(path, read_state(path, SelectionFile))  # as committed: it agrees with its records
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=says) as refused:
        check_selection(path, read_state(path, SelectionFile))
    assert str(path) in str(refused.value)


@pytest.fixture(scope="module")
def published_frame():
    from suite.report.load import load

    return load([RESULTS.root]).frame


def _swap_selection(d):
    """The first cell selects another configuration, with the means swapped so that the choice follows from them."""
    cell = d["cells"][0]
    chosen = next(c for c in cell["configurations"] if c["settings"] == cell["selected"])
    other = next(c for c in cell["configurations"] if c["settings"]["train.lr"] != cell["selected"]["train.lr"])
    chosen["scores"], other["scores"] = other["scores"], chosen["scores"]
    chosen["mean"], other["mean"] = other["mean"], chosen["mean"]
    cell["selected"] = other["settings"]


def _never_ran(d):
    cell = json.loads(json.dumps(d["cells"][0]))
    cell["method"] = "dropkey"   # built in, and never run in the quick-preset study
    d["cells"].append(cell)


@pytest.mark.parametrize("edit, says", [
    (_swap_selection, "but no final run of the cell trained with it"),
    (_never_ran, "dropkey never ran on sst2"),
], ids=["swapped-lr", "never-ran"])
def test_a_selection_without_its_tuning_records_is_held_against_the_final_runs(tmp_path, published_frame, edit,
                                                                              says):
    """With the tuning records removed, a swapped learning rate was reported as selected though every final run
    trained at the other rate, and a cell of a method that never ran was listed as tuned."""
    from suite.api.errors import ReportError
    from suite.report.state_checks import check_selection

    path = OutputFolder(tmp_path).selection
    path.parent.mkdir()
    data = json.loads(RESULTS.selection.read_text())
    path.write_text(json.dumps(data))
    check_selection(path, read_state(path, SelectionFile), published_frame)  # as committed, without its records
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=says) as refused:
        check_selection(path, read_state(path, SelectionFile), published_frame)
    assert str(path) in str(refused.value)
