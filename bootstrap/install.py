"""Adopting one machine: connect -> detect -> prereqs -> agent -> verify -> done.

``adopt`` reads like the install script it replaces. Nothing changes on the machine before
``detect`` has shown what it is and ``marker.decide`` has said what this run may do; the intent
(``bootstrap.json`` with state ``installing``) is written before the first real change, and
``installed`` only once the unit is active and the controller shows the node enrolled with the
certificate this machine holds. A run never raises: it returns a ``Result`` and reports every
step through the ``EventSink``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from tether import nodeagent
from tether.bootstrap import nodescripts, prereqs
from tether.bootstrap.bundle import AgentBundle, BundleSpec
from tether.bootstrap.delivery import Delivery
from tether.bootstrap.detect import DetectedHost, Python, detect, refusals
from tether.bootstrap.errors import (
    BootstrapError,
    BundleError,
    HostKeyError,
    InstallConflict,
    UnsupportedHost,
    VerifyError,
)
from tether.bootstrap.events import EventSink, Outcome, Reporter, Step
from tether.bootstrap.layout import DEFAULT_LAYOUT, UNIT_NAME, Layout, agent_config, launcher, marker
from tether.bootstrap.marker import INSTALLED, INSTALLING, Action, Decision, decide
from tether.bootstrap.registry import JoinToken, NodeView, Registry
from tether.bootstrap.sealing import write_secret
from tether.bootstrap.transport import Transport
from tether.bootstrap.unit import unit_text
from tether.nodeagent import logs
from tether.nodeagent.model import EventKind, Role, now_ms
from tether.nodeagent.secrets import PROCESS_REDACTOR, Redactor

log = logs.get_logger("tether.bootstrap")
NODE_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def valid_node_name(name: str) -> bool:
    """A DNS-style node name, the whole of it (no trailing newline slips through)."""
    return NODE_NAME_RE.fullmatch(name) is not None


ACTIVE_STATES = ("active", "activating", "reloading")
Opener = Callable[[], Awaitable[Transport]]


class BundleSource(Protocol):
    async def get(self, spec: BundleSpec) -> AgentBundle: ...


@dataclass(frozen=True)
class Request:
    """What to install; the same for every machine of one run except ``node_name``."""

    environment: str
    role: str
    controller: str  # HOST:PORT the node dials
    node_name: str = ""  # default: the machine's hostname
    force: bool = False
    token_ttl_seconds: int = 1800
    verify_timeout: float = 180.0
    poll_seconds: float = 1.0
    layout: Layout = field(default_factory=lambda: DEFAULT_LAYOUT)


@dataclass(frozen=True)
class Result:
    target: str
    node: str
    outcome: Outcome
    message: str
    seconds: float
    detected: DetectedHost | None = None
    error: BootstrapError | None = None


@dataclass
class _Run:
    """The state of one adoption as it moves through the steps."""

    target: str
    request: Request
    registry: Registry
    reporter: Reporter
    redactor: Redactor
    transport: Transport | None = None
    detected: DetectedHost | None = None
    node_name: str = ""
    python: Python | None = None
    decision: Decision | None = None
    marker_fields: dict[str, object] = field(default_factory=dict)  # what this run wrote

    @property
    def layout(self) -> Layout:
        return self.request.layout

    @property
    def t(self) -> Transport:
        assert self.transport is not None
        return self.transport


async def adopt(
    opener: Opener,
    target: str,
    request: Request,
    *,
    registry: Registry,
    bundles: BundleSource,
    delivery: Delivery,
    sink: EventSink,
    redactor: Redactor | None = None,
) -> Result:
    """Adopt the machine ``opener`` connects to; never raises (see ``Result.outcome``)."""
    started = time.monotonic()
    redactor = redactor if redactor is not None else Redactor()
    run = _Run(target, request, registry, Reporter(target, sink, redactor), redactor)
    if request.node_name:  # known up front: name the machine in every event and in the result
        run.node_name = run.reporter.node = request.node_name.strip().lower()
    try:
        try:
            Role.parse(request.role)
        except ValueError as exc:
            raise BootstrapError(str(exc), target=target) from None
        async with run.reporter.step(Step.CONNECT, f"connecting to {target}") as h:
            run.transport = await opener()
            learned = getattr(run.transport, "learned_host_key", "")
            h.done(
                f"connected to {run.t.target} over {run.t.kind}"
                + (f"; new host key trusted and recorded: {learned}" if learned else "")
            )
        await _detect(run)
        assert run.decision is not None
        action = run.decision.action
        if action in (Action.ALREADY, Action.WAIT):
            for step in (Step.PREREQS, Step.AGENT):
                run.reporter.emit(step, EventKind.SKIPPED, "already installed: nothing to change")
        else:
            await _prereqs(run)
            await _agent(run, bundles, delivery)
        message = await _verify(run)
        outcome = {
            Action.ALREADY: Outcome.ALREADY_INSTALLED,
            Action.WAIT: Outcome.ALREADY_INSTALLED,
            Action.INSTALL: Outcome.INSTALLED,
            Action.REINSTALL: Outcome.REINSTALLED,
        }[action]
        run.reporter.emit(Step.DONE, EventKind.SUCCEEDED, f"{outcome.value}: {message}", outcome=outcome)
        return Result(target, run.node_name, outcome, message, time.monotonic() - started, run.detected)
    except BootstrapError as exc:
        refused = isinstance(exc, (UnsupportedHost, HostKeyError, InstallConflict))
        outcome = Outcome.REFUSED if refused else Outcome.FAILED
        text = run.redactor.redact(str(exc))
        run.reporter.emit(
            Step.DONE, EventKind.FAILED, f"{outcome.value}: {text}", outcome=outcome, retryable=exc.retryable
        )
        return Result(target, run.node_name, outcome, text, time.monotonic() - started, run.detected, exc)
    except Exception as exc:  # a bug must not take the other machines of a run down
        log.exception("bootstrap crashed", target=target)
        text = run.redactor.redact(f"internal error: {type(exc).__name__}: {exc}")
        run.reporter.emit(Step.DONE, EventKind.FAILED, f"failed: {text}", outcome=Outcome.FAILED)
        err = BootstrapError(text, target=target)
        return Result(
            target, run.node_name, Outcome.FAILED, text, time.monotonic() - started, run.detected, err
        )
    finally:
        if run.transport is not None:
            await run.transport.close()


async def _detect(run: _Run) -> None:
    request = run.request
    async with run.reporter.step(Step.DETECT, "detecting the host (read-only)") as h:
        host = await detect(run.t, run.layout)
        run.detected = host
        python_plan = prereqs.plan(host)
        # Shown before anything is decided or changed, also when the host is refused below.
        run.reporter.emit(Step.DETECT, EventKind.INFO, host.summary(), detected=host.facts)
        reasons = refusals(host, python_installable=python_plan.possible, python_reason=python_plan.reason)
        if reasons:
            raise UnsupportedHost(reasons, target=run.target)
        name = (request.node_name or host.facts.hostname).strip().lower()
        if not valid_node_name(name):
            raise UnsupportedHost(
                [f"{name!r} is not a valid node name (lowercase letters, digits, '-', '.'): use --node-name"],
                target=run.target,
            )
        run.node_name = name
        run.reporter.node = name
        await run.registry.require_environment(request.environment)
        node = await run.registry.get_node(name)
        run.decision = decide(
            host.install,
            node,
            node_name=name,
            environment=request.environment,
            role=Role.parse(request.role).value,
            force=request.force,
        )
        h.done(f"node {name}: {python_plan.describe()}; {run.decision.reason}")


async def _prereqs(run: _Run) -> None:
    assert run.detected is not None
    async with run.reporter.step(Step.PREREQS, "checking prerequisites") as h:
        python, installed = await prereqs.ensure(run.t, run.detected, run.layout)
        run.python = python
        if installed:
            h.done(f"installed {python}")
        else:
            h.skip(f"nothing to install: {python}")


async def _agent(run: _Run, bundles: BundleSource, delivery: Delivery) -> None:
    assert run.python is not None
    assert run.detected is not None
    assert run.decision is not None
    request, python = run.request, run.python
    reinstall = run.decision.action is Action.REINSTALL
    async with run.reporter.step(Step.AGENT, "installing the agent") as h:
        glibc = run.detected.glibc or (2, 17)
        bundle = await bundles.get(BundleSpec(python.short, run.detected.facts.arch, glibc))
        run.reporter.info(
            Step.AGENT,
            f"agent bundle {bundle.bundle_id} for Python {python.short} {bundle.spec.arch}: "
            f"{bundle.size / 1e6:.1f} MB, sha256 {bundle.sha256}",
        )
        token: JoinToken | None = None
        if not reinstall:
            if run.decision.stale_token_id:
                await run.registry.revoke_token(run.decision.stale_token_id)
            token = await run.registry.create_token(
                environment=request.environment,
                role=request.role,
                node_name=run.node_name,
                ttl_seconds=request.token_ttl_seconds,
                description=f"bootstrap of {run.target}",
            )
            run.redactor.add(token.token)
            PROCESS_REDACTOR.add(token.token)
            run.reporter.info(
                Step.AGENT, f"single-use join token {token.token_id} created for node {run.node_name}"
            )
        ca_hash = token.ca_hash if token else run.registry.ca_hash
        try:
            await _install(run, bundle, delivery, token, ca_hash, reinstall)
        except BaseException:
            if token is not None:  # the agent never started: the token must not outlive the attempt
                with contextlib.suppress(Exception):
                    await run.registry.revoke_token(token.token_id)
            raise
        finally:
            if token is not None:  # it has been handed over (or revoked): nothing prints it from here
                PROCESS_REDACTOR.discard(token.token)
        h.done(f"{UNIT_NAME} enabled and {'restarted' if reinstall else 'started'}")


async def _install(
    run: _Run, bundle: AgentBundle, delivery: Delivery, token: JoinToken | None, ca_hash: str, reinstall: bool
) -> None:
    """Everything of the agent step that changes the machine, up to starting the unit."""
    assert run.python is not None
    t, layout, request, python = run.t, run.layout, run.request, run.python
    # Intent first: a later run knows an install was under way (and which token to revoke).
    await t.write_file(layout.marker, _marker(run, INSTALLING, bundle, token, ca_hash), mode=0o600)

    bundle_dir = layout.bundle_dir(bundle.bundle_id)
    # --force delivers and unpacks the bundle again even when the same one is there.
    present = (
        not request.force
        and (await t.run(f"test -f {shlex.quote(bundle_dir + '/BUNDLE.json')}", timeout=30)).ok
    )
    url = ""
    if not present:
        url = await delivery.url(bundle)
        if not url:
            if not t.confidential_input:
                raise BundleError(
                    f"{t.target} cannot receive the agent bundle through {t.kind}: it has to download it "
                    "(--bundle-s3 s3://BUCKET/PREFIX, --serve-bundle HOST:PORT, or --via-controller)"
                )
            await t.write_file(
                layout.archive(bundle.sha256), await asyncio.to_thread(bundle.path.read_bytes), mode=0o600
            )
            run.reporter.info(Step.AGENT, f"bundle uploaded ({bundle.size / 1e6:.1f} MB)")
        else:
            run.reporter.info(Step.AGENT, f"the node downloads the bundle ({delivery.description})")
    await t.check(
        "unpacking the agent bundle",
        nodescripts.command(
            python.path,
            nodescripts.UNPACK,
            layout.archive(bundle.sha256),
            bundle.sha256,
            layout.agents_dir,
            bundle.bundle_id,
            url,
            "0" if present else "1",
        ),
        timeout=900,
    )
    await t.write_file(layout.launcher, launcher(layout, python.path), mode=0o755)
    version = await t.check("running the agent", f"{shlex.quote(layout.launcher)} version", timeout=120)
    run.reporter.info(
        Step.AGENT,
        f"bundle {bundle.bundle_id} verified and unpacked; agent {version.stdout.strip()} runs",
    )

    config = agent_config(
        layout,
        controller=request.controller,
        ca_hash=ca_hash,
        node_name=run.node_name,
        environment=request.environment,
        role=Role.parse(request.role).value,
    )
    await t.write_file(layout.config, config, mode=0o600)
    if token is not None:
        await write_secret(t, layout.token, token.token, python=python.path, lib_dir=f"{layout.current}/lib")
        run.reporter.info(Step.AGENT, f"wrote {layout.config} and {layout.token} (0600, root)")
    else:
        run.reporter.info(
            Step.AGENT, f"wrote {layout.config} (0600, root); identity kept, no join token needed"
        )
    await t.write_file(layout.unit, unit_text(layout).encode(), mode=0o644)
    unit = shlex.quote(UNIT_NAME)
    await t.check(
        f"enabling {UNIT_NAME}",
        f"systemctl daemon-reload && systemctl reset-failed {unit} 2>/dev/null; "
        f"systemctl enable --quiet {unit} && systemctl restart --no-block {unit}",
        timeout=120,
    )


async def _verify(run: _Run) -> str:
    assert run.decision is not None
    action = run.decision.action
    doing = (
        "checking the unit and the node's record"
        if action is Action.ALREADY
        else "waiting for the unit to be active and the node to enroll"
    )
    async with run.reporter.step(Step.VERIFY, doing) as h:
        if action is Action.ALREADY:
            unit = await _unit_state(run)
            node = await run.registry.get_node(run.node_name)
            state = f"node {run.node_name} enrolled ({node.state if node else '?'}"
            state += ", connected)" if node and node.connected else ")"
            message = f"{state}; {UNIT_NAME} is {unit}"
            if unit != "active":
                run.reporter.info(
                    Step.VERIFY, f"{UNIT_NAME} is {unit}: see journalctl -u {UNIT_NAME} on the machine"
                )
            h.done(message)
            return message
        node = await _wait_enrolled(run)
        await run.t.check("removing the spent join token", f"rm -f {shlex.quote(run.layout.token)}")
        previous = run.detected.install.marker if run.detected else None
        doc = dict(run.marker_fields or previous or {})
        doc.update(state=INSTALLED, installed_ms=now_ms(), cert_fingerprint=node.cert_fingerprint)
        await run.t.write_file(run.layout.marker, marker(**doc), mode=0o600)
        message = f"{UNIT_NAME} active; node {run.node_name} enrolled in {node.environment} as {node.role}"
        h.done(message)
        return message


async def _wait_enrolled(run: _Run) -> NodeView:
    deadline = time.monotonic() + run.request.verify_timeout
    delay = run.request.poll_seconds
    unit, node = "", None
    while True:
        unit = await _unit_state(run)
        node = await run.registry.get_node(run.node_name)
        if unit == "active" and node is not None and not node.revoked:
            held = await run.t.check(
                "reading the node certificate",
                nodescripts.command(
                    run.python.path if run.python else "python3",
                    nodescripts.CERT_FINGERPRINT,
                    run.layout.cert,
                ),
                timeout=60,
            )
            fingerprint = held.stdout.strip()
            if node.cert_fingerprint and fingerprint != node.cert_fingerprint:
                node = await run.registry.get_node(run.node_name)  # a renewal may just have happened
                if node is None or node.cert_fingerprint != fingerprint:
                    raise VerifyError(
                        f"node {run.node_name} is enrolled, but not with the certificate this machine holds",
                        target=run.target,
                    )
            return node
        if unit == "failed" or time.monotonic() > deadline:
            journal = await run.t.run(
                f"journalctl -u {UNIT_NAME} -n 8 --no-pager -o cat 2>/dev/null", timeout=30
            )
            tail = run.redactor.redact(" | ".join(journal.stdout.strip().splitlines()[-8:]))
            enrolled = "enrolled" if node is not None else "not enrolled"
            why = (
                "failed"
                if unit == "failed"
                else f"is {unit or 'unknown'} after {run.request.verify_timeout:.0f}s"
            )
            raise VerifyError(
                f"{UNIT_NAME} {why}; node {enrolled}" + (f"; journal: {tail}" if tail else ""),
                target=run.target,
            )
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 5.0)


async def _unit_state(run: _Run) -> str:
    result = await run.t.run(f"systemctl is-active {UNIT_NAME}", timeout=30)
    return result.stdout.strip() or "unknown"


def _marker(run: _Run, state: str, bundle: AgentBundle, token: JoinToken | None, ca_hash: str) -> bytes:
    assert run.python is not None
    previous = run.detected.install.marker if run.detected and run.detected.install.marker else {}
    fields: dict[str, object] = {
        "state": state,
        "node_name": run.node_name,
        "environment": run.request.environment,
        "role": Role.parse(run.request.role).value,
        "controller": run.request.controller,
        "ca_hash": ca_hash,
        "bundle_sha256": bundle.sha256,
        "python": run.python.path,
        "tether_version": nodeagent.__version__,
        "token_id": token.token_id if token else previous.get("token_id", ""),
        "first_installed_ms": previous.get("first_installed_ms", now_ms()),
        "updated_ms": now_ms(),
    }
    run.marker_fields = fields
    return marker(**fields)
