"""Rate limiters: backoff per item, an overall token bucket, and their combination."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from queue_helpers import FakeClock, FixedDelay

from mcruntime._control.ratelimit import (
    ExponentialBackoff,
    MaxOf,
    RateLimiter,
    TokenBucket,
    default_rate_limiter,
)

# -- ExponentialBackoff ------------------------------------------------------------------


def test_backoff_doubles_from_5ms_and_caps_at_1000s() -> None:
    backoff = ExponentialBackoff()
    delays = [backoff.when("item") for _ in range(22)]
    assert delays[:5] == pytest.approx([0.005, 0.010, 0.020, 0.040, 0.080])
    assert delays[17] == pytest.approx(0.005 * 2**17)  # 655.36 s, the last one under the cap
    assert delays[18:] == [1000.0] * 4
    assert backoff.retries("item") == 22


def test_backoff_forget_starts_over() -> None:
    backoff = ExponentialBackoff(base=0.1, cap=10.0)
    for _ in range(5):
        backoff.when("item")
    assert backoff.retries("item") == 5
    backoff.forget("item")
    assert backoff.retries("item") == 0
    assert backoff.when("item") == pytest.approx(0.1)
    backoff.forget("never seen")  # forgetting an unknown item is harmless
    assert backoff.retries("never seen") == 0


def test_backoff_items_are_independent() -> None:
    backoff = ExponentialBackoff(base=1.0, cap=100.0)
    for _ in range(4):
        backoff.when("failing")
    assert backoff.when("other") == 1.0
    assert backoff.when("failing") == 16.0
    assert backoff.retries("other") == 1


def test_backoff_survives_huge_failure_counts() -> None:
    backoff = ExponentialBackoff()
    delays = [backoff.when("item") for _ in range(3000)]  # 2**3000 does not fit a float
    assert delays[-1] == 1000.0
    assert max(delays) == 1000.0
    assert backoff.retries("item") == 3000


@settings(max_examples=50, deadline=None)
@given(
    base=st.floats(min_value=1e-6, max_value=10.0),
    factor=st.floats(min_value=1.0, max_value=1e6),
    failures=st.integers(min_value=1, max_value=2000),
)
def test_backoff_never_decreases_and_stays_within_bounds(base: float, factor: float, failures: int) -> None:
    backoff = ExponentialBackoff(base=base, cap=base * factor)
    delays = [backoff.when("item") for _ in range(failures)]
    assert delays[0] == base
    assert all(base <= delay <= backoff.cap for delay in delays)
    assert delays == sorted(delays)


@pytest.mark.parametrize(("base", "cap"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_backoff_rejects_nonsense(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        ExponentialBackoff(base=base, cap=cap)


# -- TokenBucket -------------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_spaces_retries_at_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=3, clock=clock)
    assert [bucket.when(f"item-{n}") for n in range(3)] == [0.0, 0.0, 0.0]
    # Each further reservation borrows one more token from the future: 0.1 s apart.
    assert [bucket.when(f"item-{n}") for n in range(3, 6)] == pytest.approx([0.1, 0.2, 0.3])


def test_token_bucket_refills_with_time_up_to_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=3, clock=clock)
    for _ in range(5):
        bucket.when("item")  # tokens: 3 - 5 = -2
    clock.advance(0.2)  # back to 0
    assert bucket.when("item") == pytest.approx(0.1)
    clock.advance(3600.0)  # an hour refills only up to the burst
    assert [bucket.when("item") for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


def test_token_bucket_ignores_a_clock_stepping_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, burst=1, clock=clock)
    assert bucket.when("item") == 0.0
    clock.advance(-50.0)
    assert bucket.when("item") == pytest.approx(1.0)


def test_token_bucket_keeps_no_per_item_state() -> None:
    bucket = TokenBucket(clock=FakeClock())
    bucket.when("item")
    bucket.forget("item")
    assert bucket.retries("item") == 0


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_token_bucket_rejects_nonsense(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        TokenBucket(rate=rate, burst=burst)


# -- MaxOf and the default -----------------------------------------------------------------


def test_max_of_takes_the_longest_delay_and_asks_every_limiter() -> None:
    short, long = FixedDelay(1.0), FixedDelay(7.0)
    combined = MaxOf(short, long)
    assert combined.when("item") == 7.0
    assert short.calls == {"item": 1}  # asked although its answer lost
    assert long.calls == {"item": 1}


def test_max_of_forgets_everywhere_and_reports_the_highest_retries() -> None:
    backoff = ExponentialBackoff()
    counter = FixedDelay(0.0)
    combined = MaxOf(backoff, counter)
    counter.when("item")  # counter has seen one retry more than backoff
    for _ in range(3):
        combined.when("item")
    assert combined.retries("item") == 4
    combined.forget("item")
    assert combined.retries("item") == 0
    assert backoff.retries("item") == 0
    assert counter.retries("item") == 0


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOf()


def test_default_is_backoff_from_5ms_bounded_by_a_10_per_second_bucket() -> None:
    limiter = default_rate_limiter()
    kinds = sorted(type(part).__name__ for part in limiter.limiters)
    assert kinds == ["ExponentialBackoff", "TokenBucket"]
    bucket = next(part for part in limiter.limiters if isinstance(part, TokenBucket))
    assert (bucket.rate, bucket.burst) == (10.0, 100)
    assert limiter.when("item") == pytest.approx(0.005)
    assert limiter.when("item") == pytest.approx(0.010)
    assert limiter.retries("item") == 2


def test_every_limiter_satisfies_the_protocol() -> None:
    limiters: list[RateLimiter] = [ExponentialBackoff(), TokenBucket(), MaxOf(TokenBucket()), FixedDelay(0.0)]
    for limiter in limiters:
        assert limiter.when("item") >= 0.0
        limiter.forget("item")
        assert limiter.retries("item") == 0
