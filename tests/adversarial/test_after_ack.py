"""No acknowledgement for a write that may still fail: what is acknowledged is applied.

- A push into a new named vector is acknowledged as soon as it is queued (``ack = "queued"``);
  its room among ``ps.max_vectors`` is held from then on, so two pushes into two new names with
  room for one are not both acknowledged while the update thread is busy: the second is refused
  at once, naming the limit, and the first lands.
- A copy's ``COMMIT`` applies all of what it commits or none of it: with the copy's update queues
  full it refuses at once (``BUSY``), having committed nothing, and its network thread goes on
  answering; the primary drops it, re-syncs it once there is room, and both copies end equal.

The update thread is held busy for real (its shard's lock taken by the test, as the network
thread takes it to apply a push itself) and the queues filled for real (their slots taken).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server

from hogwild.errors import HogwildError

N = 2048
GEOMETRY = ModelGeometry(N)  # shard_kib=4: two shards of 1024 floats


def test_two_new_names_with_room_for_one_are_not_both_acknowledged():
    with local_server(GEOMETRY, job="ack", shard_kib=4, threads=1, max_vectors=1) as server:
        with PSClient([str(server.address)], "ack", client_id=5, timeout_s=3.0) as client:
            busy = server.engine.claim_idle(0)  # the update thread waits before its next batch
            assert busy is not None
            try:
                client.push_deltas(np.ones(N, np.float32), into="a")  # acknowledged, queued
                with pytest.raises(HogwildError, match="1 named vectors"):
                    client.push_deltas(np.ones(N, np.float32), into="b")
            finally:
                busy.release()
            out = np.zeros(N, np.float32)
            deadline = time.monotonic() + 10
            while [sorted(s.vectors) for s in server.shards] != [["a"], ["a"]]:
                assert time.monotonic() < deadline, [sorted(s.vectors) for s in server.shards]
                time.sleep(0.01)
            for shard in server.shards:
                out[shard.lo : shard.lo + shard.values.size] = shard.vectors["a"]
            np.testing.assert_array_equal(out, np.ones(N, np.float32))
            status = client.status()[0]
            assert status["failures"] == [] and "INTERNAL" not in status["errors"]
            assert status["errors"]["BAD_NAME"] >= 1
