"""Log lines for refused calls, rate limited: a flood of refusals costs a counter, not a log line each.

At most ``REFUSED_LOG_PER_SECOND`` lines a second (all callers together); the refusals past it are
counted and the next line that is let through says how many were not logged.
"""

from __future__ import annotations

from typing import Any

from tether.controller.limits import REFUSED_LOG_PER_SECOND, TokenBucket
from tether.nodeagent import logs

_log = logs.get_logger("tether.controller.refused")


class RefusalLog:
    """``refused(message, **fields)``: a warning line, unless over the rate; then counted."""

    def __init__(self, rate: float = REFUSED_LOG_PER_SECOND, logger: Any = None) -> None:
        self._bucket = TokenBucket(rate=rate, burst=max(1.0, rate))
        self._log = logger or _log
        self.suppressed = 0  # refusals not logged since the last line
        self.total = 0

    def refused(self, message: str, **fields: Any) -> bool:
        """Log (or count) one refusal; True when a line was written."""
        self.total += 1
        if not self._bucket.take():
            self.suppressed += 1
            return False
        if self.suppressed:
            fields["not_logged_since_last"] = self.suppressed
            self.suppressed = 0
        self._log.warning(message, **fields)
        return True


REFUSALS = RefusalLog()  # the process's one limiter: every refusal shares the same budget
