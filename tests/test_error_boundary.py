"""One error boundary for every command (suite.commands.boundary): whatever escapes a command is one line with the
file and the fix and an exit code (2 bad input, 130 Ctrl-C, 1 after a grid started or for a fault of the suite),
never a raw traceback; output never fails on its encoding."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from conftest import fake_ok_record

from suite.api.errors import EXIT_BAD_INPUT, EXIT_FAILED_RUNS, EXIT_INTERRUPTED
from suite.commands import COMMANDS as MODULES
from suite.commands import main
from suite.commands.boundary import failure

COMMANDS = list(MODULES)  # every command, the ones added later too


@pytest.mark.parametrize("exc, code, says", [
    (OSError(errno.ENOSPC, "No space left on device", "/out/RTE.tsv"), EXIT_BAD_INPUT,
     "/out/RTE.tsv: No space left on device (ENOSPC); free space"),
    (OSError(errno.EROFS, "Read-only file system", "/out"), EXIT_BAD_INPUT, "/out: Read-only file system (EROFS)"),
    (PermissionError(errno.EACCES, "Permission denied", "/out"), EXIT_BAD_INPUT, "/out: Permission denied"),
    (RecursionError("maximum recursion depth exceeded"), EXIT_BAD_INPUT, "nested too deeply"),
    (UnicodeEncodeError("ascii", "caf\u00e9", 3, 4, "ordinal not in range"), EXIT_BAD_INPUT,
     "cannot be written in this locale's encoding (ascii)"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), EXIT_BAD_INPUT, "is not utf-8 text"),
    (KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted"),
    (KeyError(""), EXIT_FAILED_RUNS, "failed: KeyError"),
])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_turns_what_escapes_it_into_one_line(command, exc, code, says, monkeypatch, capsys):
    """Each command's main raising each class of error: one line on stderr, its exit code, no traceback."""
    import importlib

    def raises(args):
        raise exc

    monkeypatch.setattr(importlib.import_module(MODULES[command][0]), "main", raises)
    argv = {"report": ["report", "somewhere"], "predict": ["predict", "x", "--out", "y"],
            "check": ["check", "vanilla"], "reproduce": ["reproduce", "x"]}.get(command, [command])
    assert main(argv) == (code if not isinstance(exc, OSError) or command != "run" else EXIT_FAILED_RUNS)
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_fault_keeps_its_traceback_in_a_file_the_line_names(capsys):
    try:
        {}[""]
    except KeyError as exc:
        line, code = failure(exc, "report")
    path = line.split("the traceback is in ")[1].split(":")[0]
    assert code == EXIT_FAILED_RUNS and "KeyError" in open(path).read()
    os.unlink(path)


def test_an_os_error_after_the_grid_started_says_the_records_are_kept():
    line, code = failure(OSError(errno.ENOSPC, "No space left on device", "/out/until_decided.json"), "run")
    assert code == EXIT_FAILED_RUNS and "Records written before are kept" in line


def test_output_in_an_ascii_encoding_replaces_what_it_cannot_hold():
    """With PYTHONIOENCODING=ascii the run recorded `ok`, then crashed printing '±'; processes it starts inherit
    the replacing error handler."""
    code = ("import os\nfrom suite.commands.boundary import tolerant_output\ntolerant_output()\n"
            "print('50.0 ± 0.0')\nprint(os.environ['PYTHONIOENCODING'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["50.0 \\xb1 0.0", "ascii:backslashreplace"]


def test_ctrl_c_during_a_report_is_one_line(monkeypatch, capsys, tmp_path):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("suite.commands.report.build_report", interrupted)
    assert main(["report", str(tmp_path)]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "interrupted: nothing was left half-written"


def test_a_state_file_nested_100k_deep_names_itself(tmp_path, capsys):
    """`report` on a 100,000-deep until_decided.json raised RecursionError."""
    from suite.grid.store import Store
    from suite.run.settings import RunConfig, TrainSettings

    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings(precision="fp32"))
    Store(tmp_path).write(job.filename, fake_ok_record(job))
    (tmp_path / "until_decided.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["report", str(tmp_path), "--no-figures", "--no-aso", "--allow-uncommitted"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{tmp_path / 'until_decided.json'}: cannot be read as JSON (nested too deeply)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("name", ["out\nrm -rf ~", "out\tx", "out\x1b[2J", "caf\udcff"],
                         ids=["newline", "tab", "escape", "not-utf-8"])
@pytest.mark.parametrize("command", ["report", "predict"])
def test_a_folder_name_with_control_characters_or_other_bytes_is_refused(command, name, tmp_path, capsys):
    """A newline in --out split a line of commands.txt; a non-UTF-8 name crashed writing it."""
    argv = ["report", str(tmp_path), "--out", name] if command == "report" else \
        ["predict", str(tmp_path), "--out", name]
    assert main(argv) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "--out" in err and ("control character" in err or "not UTF-8" in err) and "Traceback" not in err


def test_the_grid_refuses_such_an_out_before_anything_trains(tmp_path):
    from suite.api.errors import BadInput
    from suite.grid.preflight import check_out
    from suite.grid.store import Store

    with pytest.raises(BadInput, match="control character '\\\\n'"):
        check_out(Store(tmp_path / "a\nb"))
    assert not (tmp_path / "a\nb").exists()


@pytest.mark.parametrize("arg", ["a\nb", "it's", "tab\there", "back\\slash\n", "caf\udcff"])
def test_a_command_always_takes_one_line_of_commands_txt(arg):
    from suite.commands.run import shell_word

    word = shell_word(arg)
    assert "\n" not in word and word.encode("utf-8")
    printf = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True)
    assert printf.stdout == arg.encode("utf-8", "surrogateescape")


def test_a_record_whose_artifacts_is_not_an_object_is_named(tmp_path):
    """`--predict-test` over a record whose `artifacts` was a list crashed with AttributeError."""
    from suite.api.errors import BadInput
    from suite.grid.finished_runs import complete_outputs
    from suite.grid.store import Store
    from suite.run.outputs import RunOutputs
    from suite.run.settings import RunConfig, TrainSettings

    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings(precision="fp32"))
    store = Store(tmp_path)
    store.write(job.filename, {**fake_ok_record(job).to_dict(), "artifacts": ["model"]})
    with pytest.raises(BadInput, match=f"{store.path(job.filename)}: artifacts is not the object"):
        complete_outputs([job], store, RunOutputs(str(tmp_path), predict_test=True), None, "cpu")


def test_a_forged_cache_entry_with_token_ids_outside_the_vocabulary_is_named_and_rebuilt(tmp_path, monkeypatch):
    """An entry forged with its checksum made to match, holding token ids beyond the vocabulary, failed mid-training
    with an IndexError that did not name the cache."""
    from suite.run import cache
    from suite.run.data import Encoded
    from suite.run.runner import _ids_within, _is_tokenized

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    good = (Encoded([{"input_ids": [1, 5]}], [0]), {"": Encoded([{"input_ids": [2]}], [1])}, Encoded([], []),
            Encoded([], []), {})
    forged = (good[0], {"": Encoded([{"input_ids": [2, 10**6]}], [1])}, *good[2:])
    with open(tmp_path / "k.npz", "wb") as fh:
        cache.write_entry(fh, "k", forged)

    def fits(value):
        return _is_tokenized(value) and _ids_within(value, 100)

    with pytest.warns(UserWarning, match=f"entry {tmp_path / 'k.npz'} cannot be trusted.*not shaped"):
        value = cache.cached("k", lambda: good, fits)
    assert fits(value) and not fits(forged) and value[1][""].features == [{"input_ids": [2]}]  # rebuilt
