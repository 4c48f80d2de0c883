"""When and how this agent moves to the version its plan names (the executor asks between steps).

``wanted`` decides (pure, apart from one event per refusal); ``apply`` downloads, stages, switches
and asks the agent to exit so systemd restarts it into the new bundle; ``commit`` ends the
probation of a new version that has reached the controller. ``tether.nodeagent.upgrade`` holds the
state on disk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from tether.nodeagent import __version__, logs, upgrade
from tether.nodeagent.errors import AgentError
from tether.nodeagent.limits import UPGRADE_DEADLINE_SECONDS, size_text
from tether.nodeagent.model import AgentTarget, Event, EventKind
from tether.nodeagent.upgrade import Install, Startup, UpgradeError

log = logs.get_logger("tether.agent.upgrade")

Fetch = Callable[[AgentTarget, Path], Awaitable[None]]
RETRY_SECONDS = (10.0, 30.0, 60.0, 120.0, 300.0)  # after a failed download, then 300 s on


class ProbationExpired(AgentError):
    """The new version did not reach the controller in time: exit, the launcher rolls back."""


class Upgrader:
    def __init__(
        self,
        install: Install | None,
        *,
        emit: Callable[[Event], object],
        fetch: Fetch,
        restart: Callable[[str], None],
        wake: Callable[[], None] = lambda: None,
        quiet: Callable[[], Awaitable[None]] | None = None,
        version: str = __version__,
        deadline_seconds: float = UPGRADE_DEADLINE_SECONDS,
    ) -> None:
        self.install = install
        self.version = version
        self.deadline_seconds = deadline_seconds
        self._emit = emit
        self._fetch = fetch
        self._restart = restart
        self.wake = wake
        self._quiet = quiet
        self.startup: Startup = upgrade.on_start(install)
        self.committed = asyncio.Event()
        if not self.on_probation:
            self.committed.set()
        self._refused: set[tuple[str, str]] = set()  # targets refused for good (said once each)
        self._failures: dict[tuple[str, str], tuple[int, float]] = {}  # target -> (count, retry at)
        self.restarting = False

    # -- start-up -------------------------------------------------------------------------------

    @property
    def on_probation(self) -> bool:
        return self.startup.deadline > 0

    @property
    def upgraded_from(self) -> str:
        return self.startup.upgraded_from

    @property
    def rolled_back_from(self) -> str:
        rb = self.startup.rolled_back
        return rb.version if rb else ""

    def announce(self) -> None:
        """The events of this start: a rollback found (once), or the probation begun."""
        rb = self.startup.rolled_back
        if rb is not None and not rb.reported and self.install is not None:
            self._info(f"agent upgrade to {rb.version} rolled back: {rb.reason}; {self.version} runs again")
            upgrade.mark_reported(self.install, rb)
        if self.on_probation:
            left = max(0, self.startup.deadline - int(time.time()))
            self._info(
                f"agent {self.version} started (upgraded from {self.upgraded_from}); it goes back to "
                f"{self.upgraded_from} unless it reaches the controller and reports health within {left}s"
            )

    async def guard_probation(self) -> None:
        """Until committed; past the deadline, raise ProbationExpired (the agent exits)."""
        if self.committed.is_set():
            return
        left = self.startup.deadline - time.time() + 1.0  # the launcher must see it as passed
        try:
            await asyncio.wait_for(self.committed.wait(), max(left, 0.0))
        except asyncio.TimeoutError:
            raise ProbationExpired(
                f"agent {self.version} did not reach the controller and report health by the deadline; "
                f"exiting so that the launcher goes back to {self.upgraded_from}"
            ) from None

    def healthy(self) -> None:
        """Welcomed and a health report sent: the new version stays."""
        if self.committed.is_set() or self.install is None:
            return
        upgrade.commit(self.install)
        self.committed.set()
        log.info("agent upgrade committed", version=self.version, upgraded_from=self.upgraded_from)
        self._info(f"agent {self.version} is healthy: the upgrade from {self.upgraded_from} is complete")

    # -- the plan's target ----------------------------------------------------------------------

    def wanted(self, target: AgentTarget | None) -> bool:
        """Whether to move to ``target`` now (False: say why, once, and go on with the steps)."""
        if target is None or target.version == self.version or self.restarting:
            return False
        key = (target.version, target.sha256)
        if key in self._refused:
            return False
        rb = self.startup.rolled_back
        if rb is not None and (rb.version, rb.sha256) == key:
            return self._refuse(key, f"not upgrading to {target.version} again: it rolled back ({rb.reason})")
        if self.install is None:
            return self._refuse(
                key,
                f"agent upgrade to {target.version} refused: this agent ({self.version}) does not run from "
                "an installed bundle (/opt/tether/agent), so it cannot restart itself into another version",
            )
        count, retry_at = self._failures.get(key, (0, 0.0))
        return not count or time.monotonic() >= retry_at

    def _refuse(self, key: tuple[str, str], message: str) -> bool:
        self._refused.add(key)
        log.warning("agent upgrade refused", reason=message)
        self._info(message)
        return False

    async def apply(self, target: AgentTarget) -> bool:
        """Download, stage and switch to ``target``; True once the agent is restarting into it."""
        install = self.install
        assert install is not None
        key = (target.version, target.sha256)
        size = size_text(target.size)
        self._info(f"agent upgrade {self.version} -> {target.version}: fetching its bundle ({size})")
        archive = install.download(target)
        try:
            await self._fetch(target, archive)
            bid = await asyncio.to_thread(upgrade.stage, install, target, archive)
            if self._quiet is not None:
                await self._quiet()
            pending = upgrade.new_pending(install, target, bid, self.deadline_seconds)
            await asyncio.to_thread(upgrade.switch, install, pending)
        except (UpgradeError, OSError) as exc:
            self._failed(key, target, exc)
            return False
        self._failures.pop(key, None)
        self.restarting = True
        self._info(
            f"agent {target.version} staged (bundle {bid}); restarting into it: it goes back to "
            f"{self.version} by itself unless it reaches the controller and reports health within "
            f"{self.deadline_seconds:.0f}s"
        )
        self._restart(target.version)
        return True

    def _failed(self, key: tuple[str, str], target: AgentTarget, exc: Exception) -> None:
        if isinstance(exc, UpgradeError) and not exc.retryable:
            self._refuse(key, f"agent upgrade to {target.version} refused: {exc}")
            return
        count = self._failures.get(key, (0, 0.0))[0] + 1
        delay = RETRY_SECONDS[min(count, len(RETRY_SECONDS)) - 1]
        self._failures[key] = (count, time.monotonic() + delay)
        log.warning("agent upgrade failed", version=target.version, error=str(exc), retry_in=delay)
        self._info(f"agent upgrade to {target.version} failed: {exc}; trying again in {delay:.0f}s")
        asyncio.get_running_loop().call_later(delay, self.wake)

    def _info(self, message: str) -> None:
        self._emit(Event(kind=EventKind.INFO, message=message))
