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

from tether.nodeagent.secrets import PROCESS_REDACTOR, Secret

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
    """Scrubs third-party log records: the message and any traceback (formatted here, then masked).

    The traceback becomes part of the message, so in JSON it stays inside the one line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.stack_info:
            message += "\n" + record.stack_info
            record.stack_info = None
        record.msg = PROCESS_REDACTOR.redact(message)
        record.args = None
        record.exc_text = None
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
    # Third-party libraries log through stdlib logging: quieter, on the same stream, same format.
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                redact_processor,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    handler.addFilter(_RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.WARNING))
