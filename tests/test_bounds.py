"""Bounds on what an input can make the suite allocate or loop over, each refused before any work with exit 2 and
the fix in one line. The inputs that were memory bombs run in a child process capped at 2 GiB of address space
(conftest.run_under_memory_limit): each took 6-9 GB before it was bounded."""
from __future__ import annotations

import pytest
from conftest import run_under_memory_limit

from suite import commands
from suite.api.errors import EXIT_BAD_INPUT


def _values(start: float, n: int, scale: float = 1.0) -> str:
    return "[" + ", ".join(f"{(start + i) * scale:.6g}" for i in range(n)) + "]"


BOMBS = {
    # every look and seed was built up front: 9 GB in 37 s
    "cap-1e9": ("methods: [vanilla, no_dropout]\ntasks: [rte]\nseeds: [1, 2]\nuntil_decided: {cap: 1000000000}\n",
                ["--until-decided"], "cap: 1,000,000,000 seeds is beyond the suite's limit of 1,000"),
    "looks": ("methods: [vanilla, no_dropout]\ntasks: [rte]\nseeds: [1, 2]\n"
              "until_decided: {start: 2, step: 1, cap: 1000}\n", ["--until-decided"], "999 looks, beyond"),
    # budget: all over 300 x 300 x 300 in a dry run: 6.2 GB
    "space": ("methods: [vanilla]\ntasks: [rte]\ntune: {holdout: 0.2, seeds: [101, 102, 103], budget: all, space: "
              f"{{default: {{train.lr: {_values(1, 300, 1e-5)}, train.epochs: {_values(1, 300)}, "
              f"train.batch_size: {_values(1, 300)}}}}}}}\n", [],
              "27,000,000 configurations (300 train.lr x 300 train.epochs x 300 train.batch_size), beyond the suite's "
              "limit of 10,000"),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_inputs_that_exhausted_memory_are_refused_under_a_memory_limit(case, tmp_path):
    text, flags, message = BOMBS[case]
    study = tmp_path / "study.yaml"
    study.write_text(text)
    out = run_under_memory_limit(["run", "--study", str(study), "--dry-run", "--out", str(tmp_path / "out"), *flags])
    assert out.returncode == EXIT_BAD_INPUT, out.stderr[-3000:]
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]


@pytest.mark.parametrize("text, message", [
    ("methods: [vanilla, no_dropout]\ntasks: [rte]\nseeds: [1, 2]\nuntil_decided: {cap: true}\n",
     "until_decided.cap: Value error, true is not a number"),
    ("methods: [vanilla]\ntasks: [rte]\n"
     "tune: {holdout: 0.2, seeds: [101], budget: true, space: {default: {train.lr: [1.0e-4]}}}\n",
     "true is not a number"),  # read as a budget of 1
], ids=["cap-true", "budget-true"])
def test_true_where_a_count_belongs_is_refused(text, message, tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text(text)
    assert commands.main(["run", "--study", str(study), "--dry-run", "--until-decided", "--out",
                          str(tmp_path / "out")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("flag, value, message", [
    ("--epochs", str(10**12), "train.epochs=1000000000000 is beyond the suite's limit: it must be <= 1,000"),
    ("--batch-size", str(10**9), "train.batch_size=1000000000 is beyond the suite's limit: it must be <= 65,536"),
    ("--set", "train.grad_accumulation=100000", "train.grad_accumulation=100000 is beyond the suite's limit"),
])
def test_absurd_epochs_and_steps_are_refused_before_any_work(flag, value, message, tmp_path, capsys):
    """`--epochs 10**12` trained without end or warning."""
    assert commands.main(["run", "--methods", "vanilla", "--tasks", "rte", flag, value, "--dry-run", "--out",
                          str(tmp_path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
