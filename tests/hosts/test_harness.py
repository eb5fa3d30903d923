"""The hosts harness itself (:mod:`tests.hosts.harness`): hosts reach each other and nothing else,
cuts and heals, a cut between two hosts only, a lost host, and nothing left after closing.

Reachability is a real TCP connection: a listener started in one host, a client in another that
connects within ``CONNECT_S`` (exit 0) or not (exit 1).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.hosts.harness import PREFIX, Hosts, HostsError, namespaces, pids_in

pytestmark = pytest.mark.kernel_free

PORT = 7000
CONNECT_S = 1.0
# The listener and the client need only the standard library: without ``site`` (-S) an
# interpreter starts in under half the CPU time (no site-packages, no .pth files), and these
# tests start about 25 of them.
PYTHON = [sys.executable, "-S", "-c"]
LISTENER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    server.accept()[0].close()
"""
CLIENT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError:
    sys.exit(1)
"""


def listen(hosts: Hosts, host: int) -> subprocess.Popen:
    process = hosts.run(
        host, [*PYTHON, LISTENER, hosts.address(host), str(PORT)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout.readline().strip() == "ready"
    return process


def reaches(hosts: Hosts, here: int, there: int) -> bool:
    argv = [*PYTHON, CLIENT, hosts.address(there), str(PORT), str(CONNECT_S)]
    return subprocess.run(hosts.argv(here, argv), timeout=30).returncode == 0


def test_every_host_reaches_every_other_and_sees_only_its_own_interfaces(hosts3):
    for host in (1, 2, 3):
        listen(hosts3, host)
    sent = hosts3.sent_bytes(1)
    for here in (1, 2, 3):
        for there in (1, 2, 3):
            assert reaches(hosts3, here, there), (here, there)
    assert hosts3.sent_bytes(1) > sent  # its connections to hosts 2 and 3 crossed its link
    addresses = hosts3.check(2, ["ip", "-o", "-4", "addr", "show"])
    assert sorted(line.split()[3] for line in addresses.splitlines()) == [
        "10.213.0.2/24", "127.0.0.1/8"
    ]  # fmt: skip
    assert hosts3.address(2) == "10.213.0.2"
    with pytest.raises(ValueError, match="expected 1 to 3"):
        hosts3.address(4)


def test_a_cut_host_is_unreachable_until_healed(hosts3):
    listen(hosts3, 2)
    assert reaches(hosts3, 1, 2)
    hosts3.cut(2)
    assert not reaches(hosts3, 1, 2)
    assert not reaches(hosts3, 3, 2)
    hosts3.heal(2)
    assert reaches(hosts3, 1, 2)


def test_cut_between_two_hosts_leaves_the_others_linked(hosts3):
    for host in (1, 2, 3):
        listen(hosts3, host)
    hosts3.cut_between(1, 2)
    assert not reaches(hosts3, 1, 2) and not reaches(hosts3, 2, 1)
    assert reaches(hosts3, 1, 3) and reaches(hosts3, 3, 2) and reaches(hosts3, 2, 3)
    hosts3.cut_between(2, 1)  # cutting twice is cutting once
    hosts3.heal_between(2, 1)
    assert reaches(hosts3, 1, 2) and reaches(hosts3, 2, 1)
    with pytest.raises(ValueError, match="two different hosts"):
        hosts3.cut_between(3, 3)


def test_losing_a_host_kills_every_process_in_it_and_only_there(hosts3):
    listen(hosts3, 1)
    # a process tree: a shell whose children are not known to the harness
    hosts3.run(2, ["sh", "-c", "sleep 600 & sleep 600 & wait"])
    survivor = hosts3.run(3, ["sleep", "600"])
    tree = []
    for _ in range(100):
        tree = hosts3.pids(2)
        if len(tree) == 3:
            break
        subprocess.run(["sleep", "0.05"])
    assert len(tree) == 3, tree
    killed = hosts3.lose(2)
    assert set(tree) <= set(killed)
    assert hosts3.pids(2) == []
    assert survivor.poll() is None and hosts3.pids(3) == [survivor.pid]
    assert not reaches(hosts3, 3, 2)  # a lost host is off the network too
    hosts3.heal(2)
    listen(hosts3, 2)
    assert reaches(hosts3, 3, 2)


def test_closing_removes_every_namespace_and_process_even_after_a_failure():
    with pytest.raises(RuntimeError, match="a failed test"):
        with Hosts(2) as hosts:
            names = [hosts.namespace(1), hosts.namespace(2), hosts.switch]
            sleeper = hosts.run(1, ["sleep", "600"])
            home = hosts.home(1)
            assert set(names) <= set(namespaces())
            raise RuntimeError("a failed test")
    assert not set(names) & set(namespaces())
    assert sleeper.returncode is not None
    assert not home.exists()
    with pytest.raises(HostsError, match="closed"):
        hosts.address(1)


def test_namespaces_of_a_dead_owner_are_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid names the stale namespace; nothing lives there any more
    stale = f"{PREFIX}{dead.pid}-0-sw"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    orphan = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
    try:
        for _ in range(100):
            if pids_in(stale):
                break
            subprocess.run(["sleep", "0.05"])
        with Hosts(1):
            assert stale not in namespaces()
        assert orphan.wait(5) == -9
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)
