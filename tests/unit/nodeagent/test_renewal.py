"""Issue 10 item 12 (agent side): when the agent asks for a new certificate."""

from __future__ import annotations

import datetime as dt

from tether.nodeagent.certinfo import CertInfo
from tether.nodeagent.renewal import RETRY_AFTER_MAX, RenewalRule

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
BACKDATE = dt.timedelta(minutes=5)


def issued(
    serial: int, at: dt.datetime, lifetime: dt.timedelta, backdate: dt.timedelta = BACKDATE
) -> CertInfo:
    return CertInfo(serial, at - backdate, at + lifetime)


def test_a_day_long_certificate_is_renewed_once_a_third_is_left() -> None:
    rule = RenewalRule()
    cert = issued(1, T0, dt.timedelta(hours=24))
    assert not rule.due(cert, T0)
    assert not rule.due(cert, T0 + dt.timedelta(hours=15, minutes=55))
    assert rule.due(cert, T0 + dt.timedelta(hours=16))


def test_a_short_lifetime_under_a_longer_backdate_is_not_renewed_on_every_heartbeat() -> None:
    """60 s certificates, backdated 5 minutes: counted from issue, every one is due on arrival."""
    rule = RenewalRule()
    cert = issued(1, T0, dt.timedelta(seconds=60))
    renewals = 0
    for second in range(1, 301):  # five minutes of one-second heartbeats
        now = T0 + dt.timedelta(seconds=second)
        if rule.due(cert, now):
            rule.asked(cert, now)
            renewals += 1
            cert = issued(cert.serial_number + 1, now, dt.timedelta(seconds=60))  # the controller answers
            rule.received(cert, now)
        assert cert.not_valid_after > now  # and never runs out
    assert 1 < renewals <= 300 // 40 + 1  # about every 40 s (two thirds of 60 s), not 300 times


def test_a_request_in_flight_is_not_repeated_but_a_lost_one_is_asked_again() -> None:
    rule = RenewalRule()
    cert = issued(7, T0, dt.timedelta(days=30))
    late = T0 + dt.timedelta(days=21)
    assert rule.due(cert, late)
    rule.asked(cert, late)
    for minutes in (1, 30, 59):  # reconnects and heartbeats meanwhile ask nothing
        assert not rule.due(cert, late + dt.timedelta(minutes=minutes))
    # No answer (a refused renewal gets none): asked again, at most an hour later.
    assert rule.due(cert, late + RETRY_AFTER_MAX)


def test_a_renewed_certificate_is_counted_from_its_arrival() -> None:
    rule = RenewalRule()
    old = issued(1, T0, dt.timedelta(days=1))
    rule.asked(old, T0 + dt.timedelta(hours=17))
    arrived = T0 + dt.timedelta(hours=17, seconds=2)
    new = issued(2, arrived, dt.timedelta(minutes=3), backdate=dt.timedelta(minutes=5))
    rule.received(new, arrived)
    assert rule.lifetime(new) == dt.timedelta(minutes=3)  # not 8: the backdate is not counted
    assert not rule.due(new, arrived + dt.timedelta(minutes=1))
    assert rule.due(new, arrived + dt.timedelta(minutes=2, seconds=1))
