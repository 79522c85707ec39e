"""PrefillEta: the time a chunked prefill has left, fitted to its calls (cost a + b * position)."""

from __future__ import annotations

import pytest

from lampo.engine.prefill_eta import PrefillEta


def call_seconds(a, b, start, end):
    return sum(a + b * p for p in range(start, end))


def fed(calls, a, b, start=0):
    eta = PrefillEta(start)
    pos = start
    for end in calls:
        eta.add(end, call_seconds(a, b, pos, end))
        pos = end
    return eta


@pytest.mark.parametrize("start", [0, 70_000])  # a fresh prompt, one after a reused prefix
def test_a_cost_that_grows_with_the_position_is_predicted_exactly(start):
    a, b = 1.2e-4, 4.0e-9
    eta = fed([start + 2048, start + 4096, start + 6144], a, b, start)
    end = start + 262_000
    assert eta.seconds_left(end) == pytest.approx(call_seconds(a, b, start + 6144, end), rel=1e-9)


def test_a_constant_cost_gives_the_average_rate():
    eta = fed([2048, 4096, 6144], 1e-4, 0.0)
    assert eta.seconds_left(10_000) == pytest.approx((10_000 - 6144) * 1e-4)


def test_one_call_gives_its_rate_and_none_gives_no_estimate():
    eta = PrefillEta(0)
    assert eta.seconds_left(100) == -1.0
    eta.add(50, 2.0)
    assert eta.seconds_left(100) == pytest.approx(2.0)
    assert eta.seconds_left(50) == 0.0


def test_later_calls_that_are_faster_do_not_predict_a_negative_cost():
    eta = PrefillEta(0)
    eta.add(1000, 3.0)  # a first call that includes a warm-up
    eta.add(2000, 1.0)
    eta.add(3000, 1.0)
    left = eta.seconds_left(10_000)
    assert left >= 0.0
    assert left == pytest.approx(7000 * 5.0 / 3000)  # no growth fitted: the average rate


def test_a_call_must_move_forward():
    eta = PrefillEta(10)
    with pytest.raises(ValueError, match="after position 10"):
        eta.add(10, 1.0)
