"""The audit log: one record per mutating admin call, kept in the store.

``@audited(...)`` on an ``AdminService`` method (under ``@unary`` or ``@stream``) records the call
when it ends: who (the admin certificate's name and fingerprint), what (the method, and the
environment and node the call's scope checks named through ``note``), the environment's
generation before and after (``generations=True``), when, and the outcome: ``ok``, or the status
code's name of a refusal (``PERMISSION_DENIED``, ``ABORTED``, ``INVALID_ARGUMENT`` ...).

The detail is short and never holds a secret: what ``describe`` says of a success (ids, counts,
states; never a token's secret or a document), or the first line of a refusal's message, masked
by the process redactor and the request's own credentials, and cut to ``MAX_DETAIL_CHARS``. A
refused document is summed up by the fields of its problems, never quoted.

Calls by anything but an admin certificate (the anonymous identity, a node, a revoked or
mismatched certificate) are refused before any admin is known and are not recorded. The store
bounds refusals apart from successes (``store.sqlite.KEEP_AUDIT_REFUSALS``, ``KEEP_AUDIT_RECORDS``):
a read-only or scoped admin's refused calls never push a change out of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from tether.controller import paging, wire
from tether.controller.auth import Kind, Principal
from tether.controller.errors import ControllerError, InvalidArgument, StoreError
from tether.controller.store.records import AuditRecord
from tether.nodeagent import logs
from tether.nodeagent.model import now_ms
from tether.nodeagent.secrets import Redactor

log = logs.get_logger("tether.controller.audit")
F = TypeVar("F", bound=Callable[..., Any])
Describe = Callable[[Any, Any], str]  # (request, reply or the last streamed message) -> detail

MAX_DETAIL_CHARS = 300  # an audit record's detail is cut here
SECRET_FIELDS = frozenset({"private_key", "passphrase", "password"})  # masked if a message quotes them
MIN_SECRET_LINE_CHARS = 16  # each line of a multi-line credential this long is masked on its own


@dataclass
class _Call:
    """What one audited call acts on, filled in while it runs (``note``)."""

    principal: Principal
    store: Any
    generations: bool
    environment: str = ""
    node: str = ""
    generation_before: int = 0
    generation_after: int | None = None  # what the method noted; None: read when the call ends


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("tether_audit", default=None)


def note(
    *,
    environment: str = "",
    node: str = "",
    generation_before: int | None = None,
    generation_after: int | None = None,
) -> None:
    """Name what the running audited call acts on (the first name given stays); else nothing.

    A method that writes an environment notes the generations its own write replaced and made
    (a read when the call ends could see a concurrent caller's write); what it does not note is
    read: before, when the environment is first named, and after, when the call ends."""
    call = _current.get()
    if call is None:
        return
    if node and not call.node:
        call.node = node
    if environment and not call.environment:
        call.environment = environment
        if call.generations:
            call.generation_before = _generation(call.store, environment)
    if generation_before is not None:
        call.generation_before = generation_before
    if generation_after is not None:
        call.generation_after = generation_after


def audited(
    *,
    generations: bool = False,
    describe: Describe | None = None,
    unless: Callable[[Any], bool] | None = None,
) -> Callable[[F], F]:
    """Record every call of the method; ``unless(request)`` true: this call changes nothing."""

    def wrap(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            return cast(F, _stream(fn, generations, describe))
        return cast(F, _unary(fn, generations, describe, unless))

    return wrap


def _unary(fn: Any, generations: bool, describe: Describe | None, unless: Any) -> Any:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> Any:
        call = None if unless is not None and unless(request) else _begin(self.app, context, generations)
        if call is None:
            return await fn(self, request, context)
        token = _current.set(call)
        outcome, detail, store_down = "INTERNAL", "internal error", False
        try:
            reply = await fn(self, request, context)
            outcome, detail = "ok", _described(describe, request, reply)
            return reply
        except ControllerError as exc:
            outcome, detail, store_down = exc.code.name, _refusal(exc, request), isinstance(exc, StoreError)
            raise
        except asyncio.CancelledError:
            outcome, detail = "CANCELLED", "the client went away"
            raise
        finally:
            _current.reset(token)
            await _finish(self.app, call, fn.__name__, request, outcome, detail, wait=not store_down)

    return wrapper


def _stream(fn: Any, generations: bool, describe: Describe | None) -> Any:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        call = _begin(self.app, context, generations)
        if call is None:
            async for item in fn(self, request, context):
                yield item
            return
        token = _current.set(call)
        outcome, detail, last, store_down = "INTERNAL", "internal error", None, False
        try:
            async for item in fn(self, request, context):
                last = item
                yield item
            outcome, detail = "ok", _described(describe, request, last)
        except ControllerError as exc:
            outcome, detail, store_down = exc.code.name, _refusal(exc, request), isinstance(exc, StoreError)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome, detail = "CANCELLED", "the client went away"
            raise
        finally:
            with contextlib.suppress(ValueError):  # closed from another context: nothing to reset
                _current.reset(token)
            await _finish(self.app, call, fn.__name__, request, outcome, detail, wait=not store_down)

    return wrapper


def _begin(app: Any, context: Any, generations: bool) -> _Call | None:
    """The call to record, or None when no admin is calling (the method refuses it itself)."""
    try:
        principal: Principal = app.auth.principal(context)
    except ControllerError:
        return None
    if principal.kind is not Kind.ADMIN:
        return None
    return _Call(principal, app.store, generations)


async def _finish(
    app: Any, call: _Call, method: str, request: Any, outcome: str, detail: str, wait: bool = True
) -> None:
    """Store the record; a failure to store it is logged and never changes the call's outcome.
    ``wait`` false (the call failed because the store is unavailable): the record is written in
    the background, so the caller hears of the failure now, not after a second wait for the store."""
    after = call.generation_after
    if after is None:
        after = _generation(call.store, call.environment) if call.generations and call.environment else 0
    masked = _mask(app.redactor, request, detail)
    p = call.principal
    record = AuditRecord(
        id=0,
        time_ms=now_ms(),
        admin=p.name,
        fingerprint=p.fingerprint,
        method=method,
        environment=call.environment,
        node=call.node,
        generation_before=call.generation_before,
        generation_after=after,
        outcome=outcome,
        detail=masked,
    )
    write = asyncio.ensure_future(_append(call.store, record))
    if not wait:
        _background.add(write)
        write.add_done_callback(_background.discard)
        return
    await asyncio.shield(write)  # a cancelled call still leaves its record


_background: set[asyncio.Future[None]] = set()  # records written after their call answered


async def _append(store: Any, record: AuditRecord) -> None:
    try:
        await store.append_audit(record)
    except StoreError as exc:  # the database away: one line, no traceback
        log.warning("audit record not stored", method=record.method, admin=record.admin, error=str(exc))
    except Exception:
        log.exception("audit record not stored", method=record.method, admin=record.admin)


def _generation(store: Any, environment: str) -> int:
    env = store.get_environment(environment)
    return int(env.generation) if env is not None else 0


def _described(describe: Describe | None, request: Any, reply: Any) -> str:
    if describe is None:
        return ""
    try:
        return describe(request, reply)
    except Exception:  # a detail is a courtesy: never a reason to fail a call that succeeded
        log.exception("audit detail failed")
        return ""


def _refusal(exc: ControllerError, request: Any) -> str:
    """A refusal in one line; a refused document by the fields of its problems, never quoted."""
    if isinstance(exc, InvalidArgument) and "document" in request.DESCRIPTOR.fields_by_name:
        fields = sorted({v.field for v in exc.violations if v.field})
        where = f": {', '.join(fields)}" if fields else ""
        return f"document refused, {len(exc.violations)} problem(s){where}"
    lines = str(exc).splitlines()
    return lines[0] if lines else ""


def _mask(redactor: Redactor, request: Any, text: str) -> str:
    """``text`` without any known secret nor any credential of the request, on one line, cut to
    the limit. Masked before its whitespace is collapsed: a secret holding a tab, a newline or two
    spaces would no longer match once collapsed, and again after (a shape the collapse joined)."""
    own = _request_secrets(request)
    if own:
        text = Redactor(own).redact(text)
    text = " ".join(redactor.redact(text).split())
    return redactor.redact_cut(text, MAX_DETAIL_CHARS)[0]


def _request_secrets(message: Any, depth: int = 0) -> list[str]:
    """The values of the request's credential fields (``SECRET_FIELDS``), nested messages too."""
    out: list[str] = []
    for field, value in message.ListFields():
        if field.message_type is not None and not field.is_repeated and depth < 3:
            out += _request_secrets(value, depth + 1)
        elif field.name in SECRET_FIELDS and isinstance(value, (str, bytes)):
            out += _secret_forms(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)
    return out


def _secret_forms(value: str) -> list[str]:
    """A credential as given and as a message's ``!r`` quotes it (tabs, newlines escaped), and each
    line of it long enough to be its own (a private key's PEM lines: a refusal's first line may
    hold one of them only)."""
    lines = [line.strip() for line in value.splitlines() if len(line.strip()) >= MIN_SECRET_LINE_CHARS]
    return list(dict.fromkeys([value, repr(value)[1:-1], *lines]))


# -- ListAuditRecords ----------------------------------------------------------------------------


async def list_records(app: Any, who: Principal, request: Any) -> Any:
    """One page of records, newest first: of ``request.environment``, else of every environment
    the caller may see (a scoped admin: only its environments' records)."""
    if request.environment:
        who.require_environment(request.environment)
    page = paging.PageRequest.parse(
        "ListAuditRecords", request.page_size, request.page_token, environment=request.environment
    )
    before = _before_id(page.after)
    scope = sorted(who.environments)
    records = await app.store.list_audit(request.environment, before, page.size + 1, scope)
    result = paging.take(records, page, lambda r: str(r.id), record_to_pb)
    return wire.admin.ListAuditRecordsResponse(records=result.items, next_page_token=result.next_page_token)


def _before_id(after: str) -> int:
    """A page token's key is the id of the last record it showed ("" for the first page)."""
    if not after:
        return 0
    if not after.isdigit():
        raise InvalidArgument("page_token is not valid for this request: list again without it")
    return int(after)


def record_to_pb(r: AuditRecord) -> Any:
    return wire.admin.AuditRecord(
        id=r.id,
        time_ms=r.time_ms,
        admin=r.admin,
        fingerprint=r.fingerprint,
        method=r.method,
        environment=r.environment,
        node=r.node,
        generation_before=r.generation_before,
        generation_after=r.generation_after,
        outcome=r.outcome,
        detail=r.detail,
    )


__all__ = ["MAX_DETAIL_CHARS", "audited", "list_records", "note", "record_to_pb"]
