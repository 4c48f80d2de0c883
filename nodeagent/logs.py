"""structlog set-up shared by every tether binary.

One event per line on stderr: JSON when stderr is not a terminal (journald,
files, CI), a readable console line when it is. Context such as ``node`` and
``step`` travels in contextvars (``bind``). Every value passes through the
process redactor, so a secret that slipped into a log call is still masked.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from nodeagent.secrets import PROCESS_REDACTOR, Secret

bind = structlog.contextvars.bind_contextvars
unbind = structlog.contextvars.unbind_contextvars
bound = structlog.contextvars.bound_contextvars


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return PROCESS_REDACTOR.redact(value)
    if isinstance(value, Secret):
        return repr(value)
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    return value


def redact_processor(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in event_dict.items():
        event_dict[key] = _scrub(value)
    return event_dict


class _RedactingFilter(logging.Filter):
    """Scrubs third-party log records: the message and any traceback (formatted here, then masked)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = PROCESS_REDACTOR.redact(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = PROCESS_REDACTOR.redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = PROCESS_REDACTOR.redact(record.stack_info)
        return True


def configure(level: str = "info", *, stream: TextIO | None = None, json: bool | None = None) -> None:
    """Configure structlog (and stdlib logging, for grpc/asyncssh/boto) once per process."""
    out = stream or sys.stderr
    use_json = (not out.isatty()) if json is None else json
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    renderer: Any = (
        structlog.processors.JSONRenderer(sort_keys=False)
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    # Third-party libraries log through stdlib logging: keep them quiet and on the same stream.
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    handler.addFilter(_RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
