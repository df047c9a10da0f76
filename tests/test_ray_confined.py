"""Ray kept on loopback. Ray listens on every interface it finds (its GCS on `*`, its agents and client server on the
host's address, whatever `--node-ip-address` says), so the tests that start Ray (marked `starts_ray`) run only inside
a network namespace whose one interface is `lo`: conftest skips them anywhere else, and the first test here runs them
all in one (`unshare -n`, then `lo` up: tests/loopback_ns.py). The second, run in there, starts a cluster the way
`run --executor ray` does and finds every listening socket on a loopback address."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import loopback_ns  # this folder is on sys.path under pytest (as conftest is)
import pytest

ROOT = Path(__file__).resolve().parents[1]
INNER_TIMEOUT_S = 900


def test_the_ray_tests_run_in_a_loopback_only_network_namespace(tmp_path):
    pytest.importorskip("ray")
    if loopback_ns.confined():
        pytest.skip("already in a loopback-only network namespace: the Ray tests run here directly")
    prefix = loopback_ns.confine_prefix()
    if prefix is None:
        pytest.skip("cannot make a network namespace here (`unshare -n` as root, or `unshare -rn` with user "
                    "namespaces): the Ray tests stay skipped rather than listen beyond loopback")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    inner = ["-n", "0", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner"), "-q", "-m", "starts_ray"]
    proc = subprocess.run([*prefix, sys.executable, str(ROOT / "tests" / "loopback_ns.py"), *inner, "tests"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=INNER_TIMEOUT_S)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, f"the Ray tests in their namespace:\n{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"
    assert "passed" in summary and "skipped" not in summary, proc.stdout[-8000:]


@pytest.mark.starts_ray
def test_the_suites_own_local_cluster_listens_on_loopback_only():
    """While a cluster started by the executor's own code path is up (`connected` with no address: what `run
    --executor ray` does without --address), no TCP socket listens and no UDP socket is bound beyond loopback, and the
    namespace holds nothing but `lo` (where a wildcard address could only mean loopback)."""
    ray = pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    from suite.grid.executors.ray import connected

    loopback_ns.require_confined()
    assert loopback_ns.interfaces() == {"lo"}
    assert not ray.is_initialized()
    with connected(ray, None, quiet=True):
        assert ray.is_initialized()
        sockets = psutil.net_connections(kind="inet")  # this namespace's sockets, every process's
        ss = subprocess.run(["ss", "-ltnuH"], capture_output=True, text=True, check=False).stdout \
            if shutil.which("ss") else ""
    assert not ray.is_initialized()
    listening = [s.laddr for s in sockets
                 if s.laddr and (s.status == psutil.CONN_LISTEN or s.type == socket.SOCK_DGRAM)]
    assert len(listening) >= 3, sockets  # the GCS, the raylet, the object manager at least
    beyond = [f"{a.ip}:{a.port}" for a in listening if not loopback_ns.is_loopback(a.ip)]
    assert not beyond, f"listening beyond loopback: {beyond}\n{ss}"
    for line in ss.splitlines():  # the same from `ss`, where it is installed
        local = line.split()[4]
        assert loopback_ns.is_loopback(local.rsplit(":", 1)[0].strip("[]")), line
