"""The request table (a server's replies kept for retries) has a bound in entries, not only in
senders and requests per sender: 4,096 senders of 4,096 requests each would keep 16.7 million
replies (about 5 GiB of acknowledgements), and a sender of the job is anyone who knows its name.

Past :data:`~hogwild.net.dedup.MAX_ENTRIES` the least recently heard sender's oldest replies go
first, as whole senders already went past ``max_senders``: a client that is still sending keeps
the replies of its requests in flight, so its retries are still answered from the table.
"""

from __future__ import annotations

from hogwild.net.dedup import MAX_ENTRIES, RequestWindow, Seen


def fill(window: RequestWindow, sender: int, seqs) -> None:
    for seq in seqs:
        assert window.check(sender, seq)[0] is Seen.NEW
        window.finish(sender, seq, [b"ack %d" % seq])


def test_a_flood_of_senders_keeps_at_most_max_entries():
    window = RequestWindow()
    for sender in range(1, 4097):
        fill(window, sender, range(1, 65))  # 4096 x 64 = 262,144 requests answered
        assert len(window) <= MAX_ENTRIES
    assert len(window) == MAX_ENTRIES


def test_a_sender_still_sending_keeps_its_requests_in_flight():
    window = RequestWindow(max_entries=1000)
    honest = 7
    fill(window, honest, range(1, 65))
    for sender in range(100, 200):  # the flood, the honest client sending between its senders
        fill(window, sender, range(1, 21))
        fill(window, honest, range(65 + (sender - 100) * 2, 67 + (sender - 100) * 2))
        assert len(window) <= 1000
    last = 66 + 99 * 2
    for seq in range(last - 63, last + 1):  # its last window of requests: answered again
        assert window.check(honest, seq) == (Seen.DONE, [b"ack %d" % seq])


def test_forgetting_keeps_the_count_exact():
    window = RequestWindow(per_sender=10, max_senders=3, max_entries=25)
    for sender in range(1, 6):
        fill(window, sender, range(1, 16))
        window.check(sender, 100)
        window.finish(sender, 100, None)  # an idempotent request: forgotten
        assert len(window) == sum(len(s) for s in window._senders.values()) <= 25
