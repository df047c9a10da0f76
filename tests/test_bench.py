"""`python -m suite bench` on a tiny shape: the table, its baselines, the file, failures and bad input.
No timing assertions: only that the measurements exist and the baseline ratios are 1 by construction."""

import pytest
import torch

import suite
from suite import commands
from suite import profiling as bench
from suite.api.attention import AttentionMethod, register_method
from suite.commands import bench as bench_command

TINY = ["bench", "--shapes", "tiny", "--seq-len", "16", "--batch-size", "2", "--reps", "2", "--warmup", "2",
        "--device", "cpu", "--threads", "1"]


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def rows_of(markdown: str) -> dict[str, dict[str, str]]:
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0]] = dict(zip(headers, cells))
    return rows


def test_bench_table_baselines_and_out_file(tmp_path, capsys):
    out = tmp_path / "bench" / "table.md"
    rc = commands.main(TINY + ["--methods", "vanilla,topk,attendout", "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    assert text.strip() == capsys.readouterr().out.strip()
    assert "tiny: 2 layers, hidden 64, 4 heads" in text and "batch 2 x sequence 16" in text
    assert "torch " + torch.__version__ in text
    rows = rows_of(text)
    assert list(rows) == [bench.SDPA, bench.EAGER, "vanilla", "topk", "attendout"]
    assert rows[bench.SDPA]["time x sdpa"] == "1.00" and rows[bench.SDPA]["mem x sdpa"] == "1.00"
    assert rows[bench.EAGER]["time x eager"] == "1.00"
    for name, row in rows.items():
        assert float(row["step ms (median)"]) > 0, name
        assert float(row["time x sdpa"]) > 0 and float(row["time x eager"]) > 0, name
        assert float(row["step peak MB"]) > 0, name
    # AttendOut runs through its own step (look-ahead passes, G update) and counts G's parameters
    assert "own training step" in rows["attendout"]["note"]
    assert int(rows["attendout"]["extra params"].replace(",", "")) > 0
    assert "--methods vanilla,topk,attendout" in text and "--shapes tiny" in text


def test_a_failing_method_is_reported_and_the_rest_measured(capsys):
    @register_method("bench_test_broken")
    class Broken(AttentionMethod):
        """Raises in its attention function."""

        def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
            raise RuntimeError("deliberately broken")

    try:
        rc = commands.main(TINY + ["--methods", "bench_test_broken,no_dropout", "--no-memory"])
    finally:
        suite.METHODS.remove("bench_test_broken")
    assert rc == 0
    rows = rows_of(capsys.readouterr().out)
    assert rows["bench_test_broken"]["note"].startswith("failed: RuntimeError: deliberately broken")
    assert rows["bench_test_broken"]["step ms (median)"] == "-"
    assert float(rows["no_dropout"]["step ms (median)"]) > 0
    assert rows["no_dropout"]["step peak MB"] == "n/a"


def test_hyper_parameters_reach_the_method():
    import argparse

    args = argparse.Namespace(methods="topk", sets=["topk.k=3"])
    [(name, method)] = bench_command._methods(args)
    assert name == "topk" and method.cfg.k == 3


@pytest.mark.parametrize("bad", [["--shapes", "nope"], ["--seq-len", "0"], ["--padding", "1.5"],
                                 ["--methods", "no_such_method"], ["--seq-len", "1000"]])
def test_bad_input_exits_2(bad, capsys):
    argv = list(TINY)
    for i in range(0, len(bad), 2):
        if bad[i] in argv:
            argv[argv.index(bad[i]) + 1] = bad[i + 1]
        else:
            argv += bad[i:i + 2]
    assert commands.main(argv + ["--no-memory"]) == 2
    assert "error:" in capsys.readouterr().err


def test_candidates_share_the_weights_and_differ_in_attention():
    cfg = bench.shape_config("tiny")
    cands = bench.build_candidates(cfg, [("no_dropout", suite.METHODS.get("no_dropout")())], torch.device("cpu"),
                                   None)
    models = [c.ctx.model for c in cands]
    ptrs = [m.bert.embeddings.word_embeddings.weight.data_ptr() for m in models]
    assert len(set(ptrs)) == 1
    assert [m.config._attn_implementation for m in models] == ["sdpa", "eager", "suite_no_dropout"]


def test_cpu_peak_counts_a_known_temporary():
    def step():
        a = torch.ones(1_000_000)          # 4 MB
        b = torch.ones(2_000_000)          # 8 MB, both alive: 12 MB
        del a, b
        c = torch.ones(500_000)            # 2 MB after the frees
        return c

    peak = bench.cpu_step_peak_bytes(step)
    assert 12e6 <= peak < 13e6


def test_padding_leaves_the_first_row_full():
    cfg = bench.shape_config("tiny")
    b1, b2 = bench.make_batches(cfg, 4, 20, 0.5, torch.device("cpu"), seed=0)
    assert b1["attention_mask"][0].all() and b1["attention_mask"].sum(1).min() >= 10
    assert not torch.equal(b1["input_ids"], b2["input_ids"])


def test_profile_section_for_named_methods(capsys):
    assert commands.main(TINY + ["--methods", "no_dropout", "--no-memory", "--reps", "1",
                                 "--profile", "no_dropout"]) == 0
    out = capsys.readouterr().out
    assert "Where the time of one `no_dropout` step goes" in out
    assert "| operator" in out and "--profile no_dropout" in out


def test_targets_are_judged_against_eager():
    cands = [bench.Candidate(bench.SDPA, times=[1.0]), bench.Candidate(bench.EAGER, times=[2.0]),
             bench.Candidate("rela", times=[2.6], target=suite.METHODS.get("rela").cost_target),
             bench.Candidate("topk", times=[2.4], target=suite.METHODS.get("topk").cost_target),
             bench.Candidate("uniform", times=[9.0], target=suite.METHODS.get("uniform").cost_target)]
    assert [c.name for c in bench.missed_targets(cands)] == ["rela"]  # 1.3x eager > 1.2; topk 1.2x <= 1.3
    rows = rows_of(bench.table(cands))
    assert rows["rela"]["CUDA target (x eager)"] == "<= 1.2 MISSED"
    assert rows["topk"]["CUDA target (x eager)"] == "<= 1.3 met"
    assert rows["uniform"]["CUDA target (x eager)"] == "-"
    assert rows["rela"]["time x eager"] == "1.30" and rows["rela"]["time x sdpa"] == "2.60"
