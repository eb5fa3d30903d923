"""Unit tests of the arena, segment naming and the sweeper, all within this one process."""

from __future__ import annotations

import errno
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import posix_ipc
import pytest

from hogwild.errors import SharedMemoryError
from hogwild.shm import sweeper
from hogwild.shm.arena import ALIGN, Arena, ArenaLayout
from hogwild.shm.naming import (
    SegmentOwner,
    owner_alive,
    parse_segment_name,
    segment_name,
)

SHM = Path("/dev/shm")


def _exists(name: str) -> bool:
    return (SHM / name.lstrip("/")).exists()


def _our_segments() -> set[str]:
    owners = {e: parse_segment_name(e) for e in os.listdir(SHM) if e.startswith("hogwild")}
    return {e for e, o in owners.items() if o is not None and o.pid == os.getpid()}


def _layout() -> ArenaLayout:
    layout = ArenaLayout()
    layout.add("w1", np.float32, (3, 5))
    layout.add("b1", np.float32, (5,))
    layout.add("step", np.int64, 1)
    layout.add("flag", np.bool_, (7,))
    layout.add("w2", np.float64, (2, 2))
    return layout


def test_layout_regions_are_64_byte_aligned_and_packed():
    layout = _layout()
    regions = list(layout.regions.values())
    assert [r.name for r in regions] == ["w1", "b1", "step", "flag", "w2"]
    end = 0
    for r in regions:
        assert r.offset % ALIGN == 0
        assert r.offset >= end and r.offset - end < ALIGN
        assert r.nbytes == int(np.prod(r.shape)) * r.dtype.itemsize
        end = r.offset + r.nbytes
    assert layout.total_bytes % ALIGN == 0 and layout.total_bytes >= end
    assert regions[0].shape == (3, 5) and regions[2].shape == (1,)


def test_layout_json_round_trip_and_validation():
    layout = _layout()
    again = ArenaLayout.from_json(layout.to_json())
    assert again == layout
    assert again.total_bytes == layout.total_bytes
    assert again.regions["w2"].dtype == np.dtype(np.float64)
    with pytest.raises(ValueError, match="already"):
        layout.add("w1", np.float32, 1)
    with pytest.raises(ValueError, match="plain numeric"):
        layout.add("obj", object, 1)
    with pytest.raises(ValueError, match="not an arena layout"):
        ArenaLayout.from_json('{"regions": [{"name": "x"}], "version": 1}')


def test_create_attach_share_memory_and_are_aligned():
    layout = _layout()
    with Arena.create("unit test/ä", layout) as owner:
        assert owner.is_owner and _exists(owner.name)
        w1 = owner.array("w1")
        assert w1.shape == (3, 5) and w1.dtype == np.float32
        assert not w1.any(), "a new arena is zero-filled"
        other = Arena.attach(owner.name, ArenaLayout.from_json(layout.to_json()))
        assert not other.is_owner
        for name in layout.regions:
            assert other.array(name).ctypes.data % ALIGN == 0
        w1[:] = np.arange(15, dtype=np.float32).reshape(3, 5)
        np.testing.assert_array_equal(other.array("w1"), w1)
        other.array("step")[0] = 42
        assert owner.array("step")[0] == 42
        assert owner.array("w1").ctypes.data != other.array("w1").ctypes.data
        del w1
        other.close()
        other.close()
        with pytest.raises(SharedMemoryError, match="closed"):
            other.array("w1")
    assert not _exists(owner.name), "leaving the owner's context unlinks the segment"
    assert owner.closed


def test_close_with_live_views_does_not_crash():
    layout = _layout()
    arena = Arena.create("views", layout)
    view = arena.array("w2")
    arena.close()  # the view still exports the buffer: the mmap is left to the GC
    view[:] = 3.0  # the mapping is still valid while the view lives
    assert view.sum() == 12.0
    del view
    arena.unlink()


def test_unlink_twice_and_after_removal_is_fine():
    arena = Arena.create("twice", _layout())
    arena.unlink()
    arena.unlink()
    assert not _exists(arena.name)
    arena.close()
    with pytest.raises(SharedMemoryError, match="no shared-memory segment"):
        Arena.attach(arena.name, _layout())


def test_attach_rejects_a_larger_layout():
    small = ArenaLayout()
    small.add("x", np.uint8, 10)
    big = ArenaLayout()
    big.add("x", np.float64, 100_000)
    with Arena.create("small", small) as arena:
        with pytest.raises(SharedMemoryError, match="layout needs"):
            Arena.attach(arena.name, big)


def test_too_large_request_names_needed_and_free_space_and_leaves_nothing():
    st = os.statvfs(SHM)
    free = st.f_bavail * st.f_frsize
    layout = ArenaLayout()
    layout.add("huge", np.uint8, free + 2**30)
    before = _our_segments()
    with pytest.raises(SharedMemoryError) as info:
        Arena.create("huge", layout)
    message = str(info.value)
    needed = layout.total_bytes
    assert f"needs {needed} bytes" in message
    match = re.search(r"has (\d+) bytes \([\d.]+ MB\) free", message)
    assert match, message
    assert abs(int(match[1]) - free) < 2**30  # other processes may use /dev/shm meanwhile
    assert "/dev/shm" in message
    assert _our_segments() == before


def test_failed_reservation_unlinks_the_half_made_segment(monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    before = _our_segments()
    with pytest.raises(SharedMemoryError, match=r"needs \d+ bytes .* free"):
        Arena.create("nospace", _layout())
    assert _our_segments() == before
    assert not sweeper._owned


def test_segment_name_parses_back_and_is_sanitised():
    name = segment_name("my job/v2.-" + "x" * 300)
    assert name.startswith("/hogwild-") and len(name) < 128
    owner = parse_segment_name(name)
    assert owner is not None
    assert owner.pid == os.getpid()
    assert re.fullmatch(r"[A-Za-z0-9_]+", owner.job) and owner.job == "my_job_v2__" + "x" * 37
    assert parse_segment_name(name.lstrip("/")) == owner
    assert owner_alive(owner)
    assert segment_name("a") != segment_name("a"), "two names of one process differ"
    for foreign in ("/hogwild", "/psm_1234", "hogwild-x-12-abc", "/hogwild-a-b-c-deadbeef"):
        assert parse_segment_name(foreign) is None


def test_owner_alive_detects_a_reused_pid():
    owner = parse_segment_name(segment_name("reuse"))
    assert owner is not None
    ten_s_earlier = np.base_repr(int(owner.token, 36) - 1000, 36).lower()
    assert owner.start_time - SegmentOwner("j", owner.pid, ten_s_earlier).start_time == 10.0
    assert not owner_alive(owner._replace(token=ten_s_earlier))
    assert not owner_alive(owner._replace(pid=2**22 + 7))  # above pid_max: no such process
    # An owner in another PID namespace, or a name that does not say, cannot be checked here.
    assert owner_alive(owner._replace(pid=2**22 + 7, namespace="othernamespace"))
    assert owner_alive(owner._replace(pid=2**22 + 7, namespace=None))


def test_sweep_removes_only_what_is_provably_ours_and_dead_and_reports_the_rest(
    tmp_path, monkeypatch
):
    from hogwild.shm.naming import pid_namespace

    dead = 2**22 + 7  # above pid_max: no such process
    token = parse_segment_name(segment_name("x")).token
    ours = f"hogwild-job-{dead}-{token}-n{pid_namespace()}-0000000a"
    container = f"hogwild-job-{dead}-{token}-nothercontainer-0000000b"
    older = f"hogwild-job-{dead}-{token}-0000000c"
    someone = f"hogwild-job-{dead}-{token}-n{pid_namespace()}-0000000d"
    for name in (ours, container, older, someone):
        (tmp_path / name).write_bytes(b"x")
    os.chown(tmp_path / someone, 65534, 65534)  # another user's
    report = "\n".join(sweeper.sweep_report(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([container, older, someone])
    assert f"removed /{ours}" in report
    assert f"left /{container} (1 B): its owner lives in another PID namespace" in report
    assert f"left /{older} (1 B): its name (an older hogwild's) does not say" in report
    assert f"left /{someone} (1 B): its owner is dead but it belongs to another user" in report
    (tmp_path / ours).write_bytes(b"x")

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(sweeper.os, "unlink", refuse)
    report = "\n".join(sweeper.sweep_report(tmp_path))  # no traceback: a line
    assert f"could not remove /{ours}: not permitted" in report


def test_sweeper_removes_dead_owner_segments_and_keeps_live_ones(tmp_path):
    """The listing and the dry run look at a folder of this test's own (a copy of the dead
    owner's segment and of the live arena's entry): in /dev/shm any other process's sweep (the
    other test worker's leak check, a trainer starting) may remove a dead owner's segment at any
    moment. The real /dev/shm sweep then removes a dead owner's segment and keeps a live one's,
    which holds whoever of us swept first."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_name = segment_name("sweep_dead", owner_pid=child.pid)
    child.wait()
    seg = posix_ipc.SharedMemory(dead_name, posix_ipc.O_CREX, size=4096)
    seg.close_fd()
    try:
        with Arena.create("sweep_live", _layout()) as live:
            for name, size in ((dead_name, 4096), (live.name, 1)):
                (tmp_path / name.lstrip("/")).write_bytes(b"x" * size)
            infos = {i.name: i for i in sweeper.list_segments(tmp_path)}
            assert infos[dead_name].alive is False and infos[dead_name].removable
            assert infos[dead_name].size == 4096
            assert infos[live.name].alive is True and not infos[live.name].removable
            assert sweeper.sweep(dry_run=True, shm_dir=tmp_path) == [dead_name]
            assert (tmp_path / dead_name.lstrip("/")).exists()
            table = sweeper.format_segments(list(infos.values()))
            assert "dead owner" in table and live.name in table
            assert sweeper.sweep(shm_dir=tmp_path) == [dead_name]
            assert sorted(p.name for p in tmp_path.iterdir()) == [live.name.lstrip("/")]

            assert live.name not in sweeper.sweep()  # /dev/shm, through shm_unlink
            assert not _exists(dead_name)
            assert _exists(live.name)
    finally:
        sweeper.unlink_segment(dead_name)


def test_sweeping_one_dead_owner_leaves_every_other_owner_alone(tmp_path):
    """What the role server does when its driver was SIGKILLed: that driver's segments go, and
    another dead process's stay for whoever sweeps next (a folder of the test's own)."""
    names = {}
    for owner in ("driver", "other"):
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        names[owner] = (child.pid, segment_name(f"sweep_{owner}", owner_pid=child.pid))
        child.wait()
        (tmp_path / names[owner][1].lstrip("/")).write_bytes(b"x" * 64)
    with Arena.create("sweep_live", _layout()) as live:
        (tmp_path / live.name.lstrip("/")).write_bytes(b"x")
        assert sweeper.sweep_owner(os.getpid(), tmp_path) == []  # alive: never removed
        assert sweeper.sweep_owner(names["driver"][0], tmp_path) == [names["driver"][1]]
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(n.lstrip("/") for n in (names["other"][1], live.name))


def test_sweeper_ignores_names_that_are_not_ours(tmp_path):
    (tmp_path / "hogwild_other").write_bytes(b"x")
    (tmp_path / "hogwild-a-1-zz-0000000g").write_bytes(b"x")  # bad random part
    infos = sweeper.list_segments(tmp_path)
    assert [i.owner for i in infos] == [None, None]
    assert sweeper.sweep(shm_dir=tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hogwild-a-1-zz-0000000g",
        "hogwild_other",
    ]
    assert "not ours" in sweeper.format_segments(infos)
    assert "no hogwild" in sweeper.format_segments([])


def test_region_alignment_is_kept_through_json_and_checked():
    layout = ArenaLayout()
    layout.add("small", np.int8, (3,))
    page = layout.add("paged", np.float32, (10,), align=mmap.PAGESIZE)
    assert page.offset == mmap.PAGESIZE and page.align == mmap.PAGESIZE
    again = ArenaLayout.from_json(layout.to_json())
    assert again == layout and again.regions["paged"].offset == mmap.PAGESIZE
    for bad in (32, 96, 0):
        with pytest.raises(ValueError, match="align must be a power of two >= 64"):
            layout.add(f"bad{bad}", np.float32, (1,), align=bad)
