"""Errors of the bootstrap.

Hierarchy::

    BootstrapError              root; carries ``step``, ``target`` and ``retryable``
    ├── ConnectError            the machine could not be reached (retryable)
    │   ├── HostKeyError        the host key is unknown or does not match: nothing was sent
    │   └── AuthenticationError the machine refused the credentials (or the key cannot be loaded)
    ├── CommandFailed           a remote command exited non-zero (exit code, stderr tail)
    ├── CommandTimeout          a remote command ran past its deadline (retryable)
    ├── UnsupportedHost         detection refused the machine; ``reasons`` lists every problem
    ├── InstallConflict         the machine or its name is already someone else's (never overridden)
    ├── BundleError             the agent bundle could not be built, delivered or verified
    ├── ControllerError         the controller's admin API refused or failed a call
    ├── InventoryError          the inventory file is invalid; ``problems`` lists every one
    └── VerifyError             installed, but the unit is not active or the node never enrolled

Every message is safe to show and to log: no error ever carries a credential or a join token
(the remote command text, which may hold secret material, is never part of one).
"""

from __future__ import annotations

from collections.abc import Sequence


class BootstrapError(Exception):
    """Root of everything the bootstrap raises on purpose."""

    retryable = False

    def __init__(self, message: str, *, step: str = "", target: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.target = target

    @property
    def message(self) -> str:
        return str(self)


class ConnectError(BootstrapError):
    """The transport could not reach or authenticate to the machine."""

    retryable = True


class HostKeyError(ConnectError):
    """The SSH host key is not trusted: unknown (and TOFU not asked for) or different from the pin."""

    retryable = False


class AuthenticationError(ConnectError):
    """Login refused, or the private key could not be loaded: trying again will not help."""

    retryable = False


class CommandFailed(BootstrapError):
    """A remote command exited non-zero."""

    def __init__(self, what: str, exit_code: int, stderr_tail: str, **kw: str) -> None:
        tail = stderr_tail.strip()
        super().__init__(f"{what} failed (exit {exit_code})" + (f": {tail}" if tail else ""), **kw)
        self.what = what
        self.exit_code = exit_code
        self.stderr_tail = tail


class CommandTimeout(BootstrapError):
    """A remote command did not finish in time."""

    retryable = True


class UnsupportedHost(BootstrapError):
    """Detection found reasons not to touch this machine."""

    def __init__(self, reasons: Sequence[str], **kw: str) -> None:
        super().__init__("unsupported host: " + "; ".join(reasons), **kw)
        self.reasons = list(reasons)


class InstallConflict(BootstrapError):
    """The machine is installed as another node, or the node name belongs to another machine."""


class BundleError(BootstrapError):
    """Building, delivering or verifying the agent bundle failed."""


class ControllerError(BootstrapError):
    """A call to the controller's admin API failed."""


class VerifyError(BootstrapError):
    """The agent was installed but did not come up (unit not active, or no enrollment)."""

    retryable = True


class InventoryError(BootstrapError):
    """The inventory cannot be used; every problem is listed."""

    def __init__(self, problems: Sequence[str], **kw: str) -> None:
        super().__init__("invalid inventory:\n  " + "\n  ".join(problems), **kw)
        self.problems = list(problems)
