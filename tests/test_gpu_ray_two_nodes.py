"""The cluster path GPU users take (`--executor ray --address`), on two Ray nodes started on this machine: a head
that runs nothing (0 CPUs) and a worker node that runs every task. Through the command line with --predict-test and
--save-model: the test split is shipped with the data, and the model folder and test predictions come back into the
driver's output folder, so the record's artifacts are true where the record is. (Both nodes share this machine's
filesystem; the outputs still travel back through Ray, as they would from another machine.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import loopback_ns  # this folder is on sys.path under pytest (as conftest is)
import pytest

from suite import commands

pytestmark = pytest.mark.starts_ray  # run inside a loopback-only network namespace (conftest)


@pytest.fixture(scope="module")
def two_nodes():
    pytest.importorskip("ray")
    loopback_ns.require_confined()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        yield cluster
    finally:
        cluster.shutdown()  # only this cluster's processes


def test_cli_on_a_two_node_cluster_brings_outputs_home(two_nodes, tiny_bert_dir, glue_dir, tmp_path):
    data = tmp_path / "glue"
    shutil.copytree(glue_dir, data)
    (data / "RTE" / "test.tsv").write_text("index\tsentence1\tsentence2\n"
                                           + "".join(f"{i}\tthe cat sat\ta dog ran\n" for i in range(4)))
    out = tmp_path / "out"
    code = commands.main(["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--model", tiny_bert_dir,
                          "--data-dir", str(data), "--epochs", "1", "--batch-size", "8", "--out", str(out), "--quiet",
                          "--executor", "ray", "--address", two_nodes.address, "--predict-test", "--save-model",
                          "--precision", "fp32", "--device", "cpu"])  # the driver cannot see a remote cluster's
    # device or its precision: both are given (a GPU cluster: --device cuda --precision bf16)
    assert code == 0
    (path,) = (out / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "ok" and rec["executor"]["name"] == "ray" and rec["executor"]["attempts"] == 1
    runs = Path(out, "runs")
    assert (runs / rec["artifacts"]["model"] / "config.json").is_file()
    assert len((runs / rec["artifacts"]["test_predictions"]["RTE"]).read_text().splitlines()) == 5
    assert sorted(rec["executor"]["outputs_returned"]) == sorted(
        f"runs/{name}" for name in (rec["artifacts"]["model"], rec["artifacts"]["test_predictions"]["RTE"][:-8]))
