"""When the agent asks for a new certificate: once a third of its lifetime is left.

The lifetime is the certificate's own validity window, except that the controller's CA backdates
``not_before`` (clock skew): for a certificate this agent received, the window starts when it
arrived, so a short lifetime under a long backdate is not "due" the moment it arrives (which
would renew on every heartbeat). One request per certificate is in flight at a time; the
controller answers a refused one (rate, key) with nothing, so a request unanswered after a tenth
of the lifetime (at most an hour) is asked again rather than waited on until expiry.
"""

from __future__ import annotations

import datetime as dt

from tether.nodeagent.certinfo import CertInfo

RETRY_AFTER_MAX = dt.timedelta(hours=1)
RETRY_AFTER_MIN = dt.timedelta(seconds=5)  # an expired (or nearly) certificate: not every heartbeat


class RenewalRule:
    """Decides, on every heartbeat, whether to ask for a new certificate now."""

    def __init__(self) -> None:
        self._received: dict[int, dt.datetime] = {}  # serial -> when this agent got it
        self._asked: tuple[int, dt.datetime] | None = None  # (serial, when) of the open request

    def received(self, cert: CertInfo, now: dt.datetime) -> None:
        """A certificate arrived from the controller (a renewal answered)."""
        self._received[cert.serial_number] = now
        self._asked = None

    def lifetime(self, cert: CertInfo) -> dt.timedelta:
        """The window the rule counts: from issue (or arrival, if later) to expiry."""
        start = max(cert.not_valid_before, self._received.get(cert.serial_number, cert.not_valid_before))
        return max(cert.not_valid_after - start, dt.timedelta(0))

    def due(self, cert: CertInfo, now: dt.datetime) -> bool:
        """Whether to ask for ``cert``'s successor now."""
        lifetime = self.lifetime(cert)
        if cert.not_valid_after - now >= lifetime / 3:
            return False
        if self._asked is not None and self._asked[0] == cert.serial_number:
            retry_after = max(RETRY_AFTER_MIN, min(lifetime / 10, RETRY_AFTER_MAX))
            return now - self._asked[1] >= retry_after  # in flight until then
        return True

    def asked(self, cert: CertInfo, now: dt.datetime) -> None:
        """A request for ``cert``'s successor went out."""
        self._asked = (cert.serial_number, now)
