"""The snapshot thread ends on a copy that breaks the protocol, and says so: a real peer link
to a real ZeroMQ peer answering a bad header. The parcel's outcome comes back as not delivered,
the sender's ``failure`` names the error and its ``on_failure`` is called (the replication
then fails the server over: plugins/ps/replication/adapter.py)."""

from __future__ import annotations

import threading

import zmq
from hogwild_plugins.ps.layout import ShardLayout
from hogwild_plugins.ps.replication.bucket_role_events import Sync
from hogwild_plugins.ps.replication.peer_link import PeerLink
from hogwild_plugins.ps.replication.snapshot_sender import Parcel, SnapshotSender

from hogwild.net.channel import Request
from hogwild.net.wire import MsgType

WAIT_S = 15.0  # for the one exchange to end (the bad header comes back at once)


class BadHeaderPeer:
    """A ROUTER on loopback answering every message with a header too short to unpack."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"127.0.0.1:{port}"
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frames = self.socket.recv_multipart()
            self.answered += 1  # before the answer: the test reads it once the answer is in
            self.socket.send_multipart([frames[0], b"not a header"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.socket.close()
        self.context.term()


def test_a_bad_header_ends_the_snapshot_thread_with_a_failed_outcome_and_a_failure():
    peer = BadHeaderPeer()
    layout = ShardLayout.compute(4096, 4, 2, ["127.0.0.1:1", peer.address])
    link = PeerLink(7, layout, {}, lambda: 1, lambda what: what)
    failed: list[str] = []
    told = threading.Event()

    def on_failure(reason: str) -> None:
        failed.append(reason)
        told.set()

    sender = SnapshotSender(link, {"copies_caught_up": 0, "snapshots_sent": 0},
                            lambda action: True, on_failure)  # fmt: skip
    link.open(list(layout.servers), 0, None)
    try:
        sender.start()
        action = Sync(bucket=0, server=1, epoch=1, ticket=3)
        probe = Request(1, link.header(MsgType.SNAPSHOT, 0, 0, None, offset=0, epoch=1))
        sender.send(Parcel(action, [probe], {}))
        assert told.wait(WAIT_S), "the snapshot thread never reported its failure"
        assert peer.answered >= 1
        assert len(failed) == 1 and "ProtocolError" in failed[0] and "bad header" in failed[0]
        assert sender.failure == failed[0]
        outcomes = sender.outcomes()
        assert len(outcomes) == 1
        assert outcomes[0].action.ticket == 3 and not outcomes[0].delivered
        assert not outcomes[0].fenced
        assert sender.under_way is None
        sender._thread.join(timeout=WAIT_S)
        assert not sender._thread.is_alive()  # it ended: nothing more is sent from it
    finally:
        sender.stop()
        link.close()
        peer.close()
