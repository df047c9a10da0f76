"""Logs made for files: no progress bars when stderr is no terminal, `--quiet` keeps the per-run lines with the ETA,
and `--dry-run` prints the warnings a real run prints."""
import io

from suite.commands import main
from suite.grid.executors.status import GridStatus
from suite.run.record import RunRecord
from suite.run.settings import RunConfig, TrainSettings
from suite.run.training import _progress


def test_no_training_bar_when_stderr_is_no_terminal(capsys):
    bar = _progress(5, "rte/vanilla/seed1 ep1/1", quiet=False)  # pytest's captured stderr is no terminal
    bar.update(5)
    bar.close()
    assert bar.disable and "\r" not in capsys.readouterr().err
    assert _progress(5, "x", quiet=True).disable


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_quiet_drops_the_bar_but_keeps_the_lines_with_their_eta():
    job = RunConfig("minilm", "rte", "vanilla", {}, 1, TrainSettings())
    for stream, quiet in ((Terminal(), True), (io.StringIO(), False)):
        status = GridStatus(2, quiet=quiet, stream=stream)
        assert status._bar is None
        status.started(job)
        status.finished_run(job, RunRecord(job.to_dict(), job.hash, job.label, "ok", final={"score": 0.5},
                                           wall_s=3.0))
        (line,) = stream.getvalue().splitlines()
        assert line.startswith("  done rte/vanilla/seed1: score 0.5000") and "[1/2: 1 done" in line
        assert "ETA" in line and "\r" not in stream.getvalue()


def test_dry_run_prints_the_warnings_of_a_real_run(tmp_path, capsys):
    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--out", str(tmp_path),
            "--set", "scores_dropout.p=0.2", "--dry-run"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "rte/vanilla/seed1" in out
    assert "warning: --set scores_dropout.p=0.2 has no effect" in err
