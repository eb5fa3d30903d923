"""The rate meter a parameter server's and a data server's status report their rates with."""

from __future__ import annotations

import pytest

from hogwild.net.rates import RateMeter


def test_rates_are_zero_until_the_first_reading_then_the_growth_per_second_since_the_last():
    meter = RateMeter(2, started_at=100.0, every_s=1.0)
    assert meter.rates == (0.0, 0.0)
    meter.tick(102.0, lambda: (10, 4096))
    assert meter.rates == (5.0, 2048.0)
    meter.tick(102.5, lambda: (30, 8192))  # before every_s has passed: the reading stands
    assert meter.rates == (5.0, 2048.0)
    meter.tick(106.0, lambda: (30, 8192))  # measured from the last reading, at 102
    assert meter.rates == (5.0, 1024.0)


def test_the_counters_are_read_only_when_a_reading_is_due():
    meter = RateMeter(1, started_at=0.0, every_s=2.0)
    reads = []
    meter.tick(1.0, lambda: reads.append(1) or (7,))
    assert reads == [] and meter.rates == (0.0,)
    meter.tick(2.0, lambda: reads.append(1) or (7,))
    assert reads == [1] and meter.rates == (3.5,)


@pytest.mark.parametrize(
    ("counters", "every_s", "message"),
    [(0, 1.0, "at least one counter, not 0"), (1, 0.0, "every_s must be > 0 seconds, not 0.0")],
)
def test_a_meter_of_no_counter_or_no_interval_is_refused(counters, every_s, message):
    with pytest.raises(ValueError, match=message):
        RateMeter(counters, 0.0, every_s)


def test_a_reading_of_the_wrong_number_of_counts_is_refused():
    meter = RateMeter(2, started_at=0.0)
    with pytest.raises(ValueError, match=r"of 2 counters read 3 counts: \(1, 2, 3\)"):
        meter.tick(5.0, lambda: (1, 2, 3))
    assert meter.rates == (0.0, 0.0)
