"""Two hosts for real on one machine: two ranks in two Linux network namespaces joined by a veth pair, each with an
address of its own, meeting in a c10d rendezvous over that link, gloo bound to the veth interface
(`GLOO_SOCKET_IFNAME`): the multi-host path over a network interface, not loopback. Needs root (CAP_NET_ADMIN);
skipped with the reason where namespaces cannot be made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sessions import start

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.213.7"
PORT = 29477
RUN = ["train_timed.py", "--distributed", "--config", "config/cartpole.yaml", "--set", "logging.progress=off",
       "--set", "run.limit_seconds=0", "--set", "logging.tensorboard=false", "--num-envs-total", "16",
       "--total-steps", "2048"]


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Namespaces h0 and h1 with veth ends v0 (SUBNET.1) and v1 (SUBNET.2); removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    tag = f"ppo{os.getpid()}"
    hosts = [f"{tag}h0", f"{tag}h1"]
    links = [f"{tag}v0", f"{tag}v1"]
    try:
        made = ip("netns", "add", hosts[0])
        if made.returncode != 0:
            pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
        for step in (["netns", "add", hosts[1]],
                     ["link", "add", links[0], "type", "veth", "peer", "name", links[1]],
                     *(["link", "set", link, "netns", host] for link, host in zip(links, hosts, strict=True))):
            assert ip(*step).returncode == 0, f"ip {' '.join(step)} failed"
        for i, (host, link) in enumerate(zip(hosts, links, strict=True)):
            for step in (["addr", "add", f"{SUBNET}.{i + 1}/24", "dev", link], ["link", "set", link, "up"],
                         ["link", "set", "lo", "up"]):
                done = ip("netns", "exec", host, "ip", *step)
                assert done.returncode == 0, done.stderr
        yield hosts, links
    finally:
        for host in hosts:
            ip("netns", "delete", host)  # takes its end of the veth pair with it


def test_two_ranks_in_two_network_namespaces_train_in_step(two_hosts, tmp_path):
    hosts, links = two_hosts
    out = tmp_path / "run"
    endpoint = f"{SUBNET}.1:{PORT}"
    procs = []
    for node, (host, link) in enumerate(zip(hosts, links, strict=True)):
        launcher = ["ip", "netns", "exec", host, sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                    "--nproc_per_node", "1", "--node_rank", str(node), "--rdzv_backend", "c10d",
                    "--rdzv_endpoint", endpoint, "--rdzv_id", "multihost-test", "--local_addr", f"{SUBNET}.{node + 1}",
                    "--rdzv_conf", f"is_host={node == 0}"]  # the endpoint is no name this host's name resolves to
        env = {**os.environ, "GLOO_SOCKET_IFNAME": link}
        procs.append(start([*launcher, *RUN, "--output-dir", str(out)], cwd=ROOT, env=env))
    results = [proc.communicate(timeout=240) for proc in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
    summary = json.loads((out / "summary.json").read_text())
    ranks = summary["distributed"]["ranks"]
    assert summary["world_size"] == 2 and summary["total_env_steps"] == 2048, summary
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["checksum"] for r in ranks}) == 1
    received = ip("netns", "exec", hosts[1], "cat", f"/sys/class/net/{links[1]}/statistics/rx_bytes")
    assert int(received.stdout) > 1_000_000, "the gradients did not travel over the veth link"
