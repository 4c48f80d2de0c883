"""The one seam between the bootstrap and a machine: run a command, write a file, close.

A transport runs every command **as root** (SSH wraps a non-root login in ``sudo -n``; SSM
runs as root already) through ``/bin/sh``. Command text is never secret: it may show up in
``ps`` on the node or in a provider's command history. Secret material travels only as
``stdin`` or file content, and only over transports whose ``confidential_input`` is true
(see ``tether.bootstrap.sealing`` for the others).
"""

from __future__ import annotations

import abc
import shlex
from dataclasses import dataclass
from types import TracebackType

from tether.bootstrap.errors import CommandFailed

DEFAULT_TIMEOUT = 300.0


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Transport(abc.ABC):
    """A connection to one machine, used for the length of one bootstrap."""

    kind = ""  # "ssh" | "ssm"
    # True: stdin and file contents reach the machine over an encrypted session and are kept
    # nowhere else (SSH). False: they are recorded by a provider (SSM command parameters).
    confidential_input = True

    def __init__(self, target: str) -> None:
        self.target = target

    @abc.abstractmethod
    async def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> CommandResult:
        """Run ``command`` with ``/bin/sh`` as root; never raises for a non-zero exit."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Write ``data`` to ``path`` atomically (temporary file + rename), root-owned, ``mode``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connection; safe to call twice."""

    async def check(
        self, what: str, command: str, *, stdin: bytes | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> CommandResult:
        """``run``, raising ``CommandFailed`` (named ``what``, never the command text) on non-zero."""
        result = await self.run(command, stdin=stdin, timeout=timeout)
        if not result.ok:
            raise CommandFailed(
                what, result.exit_code, _tail(result.stderr or result.stdout), target=self.target
            )
        return result

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def write_stdin_script(path: str, mode: int) -> str:
    """Shell that stores its stdin at ``path`` atomically with ``mode`` (parents created)."""
    directory_umask = "077" if mode & 0o077 == 0 else "022"
    q = shlex.quote(path)
    return (
        "set -e; "
        f'd=$(dirname {q}); (umask {directory_umask}; mkdir -p "$d"); '
        't=$(mktemp "$d/.tether-XXXXXX"); trap \'rm -f "$t"\' EXIT; '
        f'cat > "$t"; chmod {mode:o} "$t"; chown 0:0 "$t"; mv -f "$t" {q}; trap - EXIT'
    )


def _tail(text: str, lines: int = 5, chars: int = 600) -> str:
    kept = "\n".join(text.strip().splitlines()[-lines:])
    return kept[-chars:]
