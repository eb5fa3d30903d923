"""The CURVE keys a cluster job's roles use, chosen by the driver before any role starts.

Every role (servers, replicas, data servers, the driver's control channel) and client reads the
job's keys in ``ps.keys``. They are, in order: ``cluster.keys`` (or ``ps.keys``), one key pair the
user made, shared; else, when the roles listen beyond loopback, a key pair per role, the job's
roster in ``RUN_DIR/keys`` (:mod:`hogwild.cluster.identities`); else, on loopback, one key pair
made for the job in ``RUN_DIR/job-keys`` where ``cluster.auth`` asks for CURVE there
(:func:`~hogwild.net.exposure.curve_reason`), or none. A resumed job keeps the keys it had.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hogwild.cluster.identities import JobKeys
from hogwild.net.address import is_loopback, parse_address
from hogwild.net.auth import make_keys
from hogwild.net.exposure import curve_reason

__all__ = ["job_keys", "with_job_keys"]


def with_job_keys(config, run_dir: Path, say: Callable[[str], None]):
    """``(config, roster)``: ``config`` with the job's CURVE keys in ``ps.keys`` (see the module
    docstring), and the job's roster when its roles have a key pair each (else None); what was
    chosen said through ``say``."""
    keys = config.cluster.keys or config.ps.keys
    if not keys and not is_loopback(parse_address(f"{config.cluster.host}:0")):
        roster = JobKeys.make(run_dir)  # a resumed job keeps its roster
        say(f"CURVE keys: a key pair per role, the job's roster in {roster.keys}")
        keys = str(roster.keys)
        return (config.override({"ps.keys": keys}) if keys != config.ps.keys else config), roster
    return job_keys(config, run_dir, say), None


def job_keys(config, run_dir: Path, say: Callable[[str], None]):
    """``config`` with the job's CURVE keys in ``ps.keys``, where every role (servers, replicas,
    data servers, this driver's control channel) and client reads them: ``cluster.keys`` (or
    ``ps.keys``) if given, else made in ``run_dir/job-keys`` when :func:`curve_reason` says the
    roles need them (``cluster.auth``), the reason said through ``say``. Not ``run_dir/keys``:
    that is the roster of a job whose roles had a key pair each (:mod:`.identities`), and one
    checkpoint directory may serve both kinds of run."""
    keys = config.cluster.keys or config.ps.keys
    if not keys:
        loopback = is_loopback(parse_address(f"{config.cluster.host}:0"))
        reason = curve_reason(config.cluster.auth, loopback)
        if reason is not None:
            made = run_dir / "job-keys"
            if not (made / "server.key").exists():  # a resumed job keeps its keys
                make_keys(made)
            say(f"CURVE keys for the job's roles in {made} ({reason})")
            keys = str(made)
    return config.override({"ps.keys": keys}) if keys != config.ps.keys else config
