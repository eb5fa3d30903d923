"""The request table (a server's replies kept for retries) has a bound in entries, not only in
senders and requests per sender: 4,096 senders of 4,096 requests each would keep 16.7 million
replies (about 5 GiB of acknowledgements), and a sender of the job is anyone who knows its name.

Past :data:`~hogwild.net.dedup.MAX_ENTRIES` the answered requests of the senders holding the most
go first, oldest first, never one in progress and never one of a sender's newest
:data:`~hogwild.net.dedup.KEEP` (a client's window in flight): a client whose reply was lost
finds its request again when it re-sends, however many others sent meanwhile, so an
acknowledged update is never applied twice for the bound's sake.
"""

from __future__ import annotations

from hogwild.net.dedup import KEEP, MAX_ENTRIES, RequestWindow, Seen

SLACK = MAX_ENTRIES // 16  # answered since the table last looked, when kept ones fill it


def fill(window: RequestWindow, sender: int, seqs) -> None:
    for seq in seqs:
        assert window.check(sender, seq)[0] is Seen.NEW
        window.finish(sender, seq, [b"ack %d" % seq])


def kept(window: RequestWindow) -> int:
    return sum(len(seen) for seen in window._senders.values())


def test_a_flood_of_senders_keeps_at_most_max_entries_and_every_senders_newest_window():
    window = RequestWindow()
    for sender in range(1, 1025):
        fill(window, sender, range(1, 2 * KEEP + 1))  # 1,024 x 128 = 131,072 answered
        assert len(window) <= MAX_ENTRIES + SLACK
    # every sender's newest 64, and at most a sixteenth more since the table last looked
    assert 1024 * KEEP <= len(window) == kept(window) <= 1024 * KEEP + SLACK
    for sender in (1, 512, 1024):
        for seq in range(KEEP + 1, 2 * KEEP + 1):
            assert window.check(sender, seq) == (Seen.DONE, [b"ack %d" % seq])


def test_a_client_whose_reply_was_lost_finds_its_request_after_a_flood():
    """The review's case: one client's last reply lost; before it re-sends, others make far
    more requests than the table holds. Its request in progress stays in progress, and once
    answered, its re-send is answered from the table (not applied again)."""
    window = RequestWindow(max_entries=1000)
    waiting = 7
    fill(window, waiting, range(1, KEEP))
    assert window.check(waiting, KEEP)[0] is Seen.NEW  # applied; its reply not yet recorded
    for sender in range(100, 140):
        fill(window, sender, range(1, 201))  # 8,000 requests of 40 other senders
        # its bound, or what it may not forget (every sender's newest 64, its own too)
        assert len(window) <= max(1000, KEEP * (sender - 98)) + 1000 // 16
    assert window.check(waiting, KEEP) == (Seen.IN_PROGRESS, None)
    window.finish(waiting, KEEP, [b"ack %d" % KEEP])
    for seq in range(1, KEEP + 1):  # its whole window: answered again, never NEW
        assert window.check(waiting, seq) == (Seen.DONE, [b"ack %d" % seq])


def test_requests_in_progress_are_never_forgotten_for_the_bound():
    window = RequestWindow(max_entries=500)
    slow = 3
    for seq in range(1, 301):  # 300 in progress, beyond its newest 64
        assert window.check(slow, seq)[0] is Seen.NEW
    for sender in range(10, 30):
        fill(window, sender, range(1, 101))
    for seq in range(1, 301):
        assert window.check(slow, seq) == (Seen.IN_PROGRESS, None)
    # what it may not forget: 300 in progress, every other sender's newest 64
    assert 300 + 20 * KEEP <= len(window) == kept(window) <= 300 + 20 * KEEP + 500 // 16


def test_the_sender_holding_the_most_loses_its_oldest_first():
    window = RequestWindow(max_entries=1000)
    for sender in range(2, 6):
        fill(window, sender, range(1, 101))  # 4 x 100, heard least recently
    fill(window, 1, range(1, 901))  # the big sender, heard last: 300 past the bound
    seen = window._senders
    assert all(len(seen[s]) == 100 for s in range(2, 6))  # the small ones kept everything
    assert len(seen[1]) < 900
    assert list(seen[1]) == list(range(901 - len(seen[1]), 901))  # its newest, in order
    assert len(window) == kept(window) <= 1000


def test_senders_within_their_window_are_all_kept_past_the_bound():
    """Nothing beyond a sender's newest 64 to forget: the table holds more than its bound
    (at most max_senders x 64 answered), and forgets nothing a client may re-send."""
    window = RequestWindow(max_entries=100)
    for sender in range(1, 51):
        fill(window, sender, range(1, KEEP + 1))
    assert len(window) == kept(window) == 50 * KEEP
    for sender in (1, 50):
        assert window.check(sender, 1) == (Seen.DONE, [b"ack 1"])


def test_forgetting_keeps_the_count_exact():
    window = RequestWindow(per_sender=100, max_senders=3, max_entries=150)
    for sender in range(1, 6):
        fill(window, sender, range(1, 91))
        window.check(sender, 200)
        window.finish(sender, 200, None)  # an idempotent request: forgotten
        assert len(window) == kept(window) <= 150 + 150 // 16 + KEEP
