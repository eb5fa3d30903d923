"""The job's roster as the driver keeps it (:mod:`hogwild.cluster.identities`), and the run
directory's files a role on another node gets mirrored (:mod:`hogwild_plugins.ray.mirrors`):
real key pairs, real files, no processes."""

from __future__ import annotations

from hogwild.cluster.identities import JobKeys
from hogwild.cluster.roles import RoleSpec
from hogwild.net.auth import read_roster


def test_a_role_enters_the_roster_with_its_planned_address_or_its_ready_line(tmp_path):
    job = JobKeys(tmp_path / "keys", tmp_path / "private")
    published = []
    job.publish = published.append
    server = RoleSpec("ps", 0, ("ps", "serve", "--bind", "10.0.0.2", "--port", "7001"),
                      fixed_port=True)  # fmt: skip
    replica = RoleSpec("replica", 1, ("cluster", "replica", "--bind", "10.0.0.3"))
    _, server_key = job.identity_for(server.name)
    _, replica_key = job.identity_for(replica.name)
    job.enter(server, server_key)
    job.enter(replica, replica_key)  # its port: chosen when it starts
    assert read_roster(tmp_path / "keys") == {
        "ps 0": {"key": server_key, "address": "10.0.0.2:7001"},
        "replica 1": {"key": replica_key, "address": ""},
    }
    job.located(replica.name, "10.0.0.3:4242")  # its ready line
    assert read_roster(tmp_path / "keys")["replica 1"]["address"] == "10.0.0.3:4242"
    job.enter(replica, replica_key)  # restarted with the same key pair: nothing changes
    assert len(published) == 3 and read_roster(tmp_path / "keys")["replica 1"]["address"]


def test_a_far_role_gets_the_run_directorys_files_it_names_and_the_keys(tmp_path, monkeypatch):
    from hogwild_plugins.ray.mirrors import files_for  # needs no Ray until it talks to actors

    run = tmp_path / "run"
    (run / "keys").mkdir(parents=True)
    (run / "job.json").write_text("{}")
    (run / "keys" / "roster.json").write_text("[]")
    (tmp_path / "elsewhere.toml").write_text("")  # outside the run directory: not sent
    monkeypatch.chdir(tmp_path)
    argv = ["cluster", "--config", "run/job.json", "--data", str(tmp_path / "elsewhere.toml"),
            f"--ps.keys={run / 'keys'}", "replica"]  # fmt: skip
    assert files_for(str(run), argv) == {"job.json": b"{}"}
    found = files_for(str(run), argv, keys=str(run / "keys"))
    assert found == {"job.json": b"{}", "keys/roster.json": b"[]"}
