"""GPU drift as health: node conditions from the GPU view of each health report.

After a node provisioned, every health report carries what nvidia-smi lists (count, product,
memory, driver version, uncorrected ECC and Xid counts) and the NVIDIA GPUs on the PCI bus. Held
against ``spec.hardware.gpus`` they give the node's conditions (``evaluate``, pure):

- ``GPUsMissing``: fewer GPUs than expected: nvidia-smi lists fewer (reason ``FellOffTheBus`` when
  the PCI bus still shows the ones it lost, ``DriverNotLoaded`` when it lists none at all), or
  fewer are on the bus at all (``NotDetected``).
- ``GPUErrors``: a GPU with uncorrected ECC errors (``UncorrectedECC``) or Xid errors
  (``XidErrors``).
- ``DriverMismatch``: a GPU whose driver version does not start with ``driverVersion``
  (``UnexpectedVersion``).

``DriftWatch`` applies them to each report: only for a provisioned node whose plan's generation
expects GPUs (a node with no expectation holds none). The expectation is that of the generation
the node's plan comes from, not the environment's latest: a new ``spec.hardware`` applies to a
node when its rollout reaches it (a generation the store no longer keeps: the current one). The
per-report cost is a few dictionary looks (the expectation is cached per (environment,
generation); the node's plan generation is read from the store only while it is not the current
one) and a comparison of the report's GPU view with the last one; only a change is evaluated.

A condition is raised only once it has held in ``CONFIRM_REPORTS`` (2) evaluated reports in a row
(counted in memory), so one odd reading (an nvidia-smi that timed out and listed nothing) neither
raises nor cordons anything; one that no longer holds clears at once. A condition held on is
"changed" only when its reason, or what it is about, changes: for ``GPUErrors`` which GPUs have
which kind of error (``Condition.affected``), not how many errors (its stored message keeps the
counts as of when it was raised or last changed). Only a different set of conditions is written
(``NodeRecord.hardware["conditions"]``: type -> {reason, message, since_ms[, affected]}),
announced as a Notice (an INFO event of the node) and logged. With ``hardware.onDrift: cordon`` a
raised condition has a control plane run ``kubectl cordon`` on the node (``Cordoner``, the cluster
orchestrator); it is never uncordoned automatically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from tether.controller import wire
from tether.controller.hardware.names import CONDITION_TYPES as CONDITION_TYPES
from tether.controller.hardware.names import DRIVER_MISMATCH as DRIVER_MISMATCH
from tether.controller.hardware.names import GPU_ERRORS as GPU_ERRORS
from tether.controller.hardware.names import GPUS_MISSING as GPUS_MISSING
from tether.controller.hub import Hub, Session
from tether.controller.nodestate import NodeState, node_state
from tether.controller.spec import LoadedSpec
from tether.controller.spec.model import GpuExpectation
from tether.controller.store import EnvironmentRecord, Store
from tether.nodeagent import logs
from tether.nodeagent.model import Gpu, Health, PciGpu, facts_from_dict, health_from_dict, now_ms

log = logs.get_logger("tether.controller.hardware.drift")

CORDON = "cordon"
SPEC_RECHECK_SECONDS = 5.0  # how stale an environment's expectation may be (a new apply is seen by then)
MAX_NAMED = 8  # GPUs named in one message; the rest are counted
MAX_MESSAGE_CHARS = 500
# The quarantine problem an operator's release accepted -> the condition it stands for.
ACCEPTED_CONDITIONS = {"gpus.count": GPUS_MISSING, "gpus.driverVersion": DRIVER_MISMATCH}
CONFIRM_REPORTS = 2  # consecutive reports a condition must hold in before it is raised (and cordons)
MAX_CACHED_EXPECTATIONS = 4096  # (environment, generation) expectations kept


@dataclass(frozen=True)
class Condition:
    reason: str
    message: str
    # What the condition is about, when its message also carries counts that move on their own
    # (the error counts of ``GPUErrors``): a condition held on is "changed" only when its reason or
    # this differs. None: the message itself says what it is about.
    affected: tuple[str, ...] | None = None


# -- the rules (pure) ---------------------------------------------------------------------------


def bus_id(address: str) -> str:
    """A PCI address as sysfs writes it (``0000:3b:00.0``), from nvidia-smi's ``00000000:3B:00.0`` too."""
    parts = address.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMED])
    return shown + (f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else "")


def _gpu_name(g: Gpu) -> str:
    return f"GPU {g.index} ({bus_id(g.pci_bus_id)})" if g.pci_bus_id else f"GPU {g.index}"


def evaluate(
    expect: GpuExpectation,
    health: Health,
    *,
    driver: bool = True,
    seen: Collection[str] = (),
) -> dict[str, Condition]:
    """The conditions that hold for ``health``'s GPU view against ``expect``, by type.

    ``driver``: nvidia-smi is expected to list the GPUs (the spec installs a driver or names its
    version, or nvidia-smi listed GPUs on this node before); without it only the PCI bus counts.
    ``seen``: PCI addresses (``bus_id``) of GPUs this node had before, to name those now gone.
    """
    out: dict[str, Condition] = {}
    missing = _gpus_missing(expect, health, driver=driver, seen=seen)
    if missing is not None:
        out[GPUS_MISSING] = missing
    smi = health.gpus
    ecc = [g for g in smi if g.ecc_uncorrected > 0]
    xid = [g for g in smi if g.xid_errors > 0]
    if ecc or xid:
        parts = []
        if ecc:
            parts.append(
                "uncorrected ECC errors on " + _named([f"{_gpu_name(g)}: {g.ecc_uncorrected}" for g in ecc])
            )
        if xid:
            parts.append("Xid errors on " + _named([f"{_gpu_name(g)}: {g.xid_errors}" for g in xid]))
        # Which GPUs have which errors, not how many: a count going up is the same condition.
        affected = tuple(sorted([f"ecc {_gpu_id(g)}" for g in ecc] + [f"xid {_gpu_id(g)}" for g in xid]))
        out[GPU_ERRORS] = Condition("UncorrectedECC" if ecc else "XidErrors", "; ".join(parts), affected)
    prefix = expect.driver_version
    if prefix:
        wrong: dict[str, list[str]] = {}
        for g in smi:
            if not g.driver_version.startswith(prefix):
                wrong.setdefault(g.driver_version or "no version", []).append(str(g.index))
        if wrong:
            found = "; ".join(
                f"{version} on GPU {_named(indices)}" for version, indices in sorted(wrong.items())
            )
            out[DRIVER_MISMATCH] = Condition("UnexpectedVersion", f"expected driver {prefix}*, found {found}")
    return {k: replace(c, message=c.message[:MAX_MESSAGE_CHARS]) for k, c in out.items()}


def _gpu_id(g: Gpu) -> str:
    """A GPU by its PCI address (its index when nvidia-smi gives none)."""
    return bus_id(g.pci_bus_id) if g.pci_bus_id else f"GPU {g.index}"


def _gpus_missing(
    expect: GpuExpectation, health: Health, *, driver: bool, seen: Collection[str]
) -> Condition | None:
    """``GPUsMissing`` when fewer GPUs than expected are listed (or on the bus), else None."""
    smi = health.gpus
    smi_bus = {bus_id(g.pci_bus_id) for g in smi if g.pci_bus_id}
    pci_bus = {bus_id(p.address) for p in health.pci_gpus}
    # A GPU nvidia-smi lists is on the bus, whatever the PCI scan saw (it may not see /sys).
    on_bus = len(smi_bus | pci_bus) if len(smi_bus) == len(smi) else max(len(smi), len(pci_bus))
    driver_view = driver or bool(smi)
    if not (on_bus < expect.count or (driver_view and len(smi) < expect.count)):
        return None
    fallen = sorted(pci_bus - smi_bus) if driver_view else []
    gone = sorted(set(seen) - pci_bus - smi_bus)
    missing = fallen + gone
    if driver_view and not smi and pci_bus:
        reason = "DriverNotLoaded"
    elif fallen:
        reason = "FellOffTheBus"
    else:
        reason = "NotDetected"
    want = f"expected {_plural(expect.count, 'GPU')}"
    if driver_view:
        text = f"{want}, nvidia-smi lists {len(smi) or 'none'}"
        if pci_bus and len(pci_bus) != len(smi):
            text += f", {len(pci_bus)} on the PCI bus"
    else:
        text = f"{want}, {on_bus} on the PCI bus"
    if missing:
        text += f" (missing {_named(missing)})"
    return Condition(reason, text)


@dataclass(frozen=True)
class Transition:
    """What changed between the conditions held and those that hold now."""

    conditions: dict[str, dict[str, Any]]  # what to store: type -> {reason, message, since_ms[, affected]}
    raised: tuple[str, ...] = ()
    cleared: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # held before and now, with another reason or message


def _same(before: Mapping[str, Any], c: Condition) -> bool:
    """Whether a condition held (as stored) says what ``c`` says: the same reason, about the same
    GPUs (``affected``: not how many errors they have); without ``affected``, the same message."""
    if before.get("reason") != c.reason:
        return False
    if c.affected is not None and "affected" in before:
        return [str(a) for a in before["affected"]] == list(c.affected)
    return before.get("message") == c.message


def compare(
    held: Mapping[str, Mapping[str, Any]], now: Mapping[str, Condition], time_ms: int
) -> Transition | None:
    """None when ``now`` says what ``held`` says (``_same``); a condition held on keeps its
    ``since_ms``, and its stored message when it is the same (the counts as of when it was raised
    or last changed)."""
    conditions: dict[str, dict[str, Any]] = {}
    raised, changed = [], []
    for kind in sorted(now):
        c, before = now[kind], held.get(kind)
        if before is None:
            raised.append(kind)
            since = time_ms
        else:
            since = int(before.get("since_ms", 0)) or time_ms
            if _same(before, c):
                conditions[kind] = {**before, "since_ms": since}
                continue
            changed.append(kind)
        conditions[kind] = {"reason": c.reason, "message": c.message, "since_ms": since}
        if c.affected is not None:
            conditions[kind]["affected"] = list(c.affected)
    cleared = tuple(sorted(k for k in held if k not in now))
    if not raised and not changed and not cleared:
        return None
    return Transition(conditions, tuple(raised), cleared, tuple(changed))


def notices(t: Transition) -> list[str]:
    """One line per condition raised, changed or cleared (the node's INFO events)."""
    lines = []
    for kind in t.raised:
        c = t.conditions[kind]
        lines.append(f"GPU drift: {kind} ({c['reason']}): {c['message']}")
    for kind in t.changed:
        c = t.conditions[kind]
        lines.append(f"GPU drift: {kind} still holds ({c['reason']}): {c['message']}")
    for kind in t.cleared:
        lines.append(f"GPU drift: {kind} cleared")
    return lines


# -- the watch ----------------------------------------------------------------------------------


class Cordoner(Protocol):
    """Runs ``kubectl cordon`` on a node of a kubeadm cluster (``Orchestrator.cordon``); says what
    it did, for the node's event."""

    async def cordon(self, node: str, environment: str, why: str) -> str: ...


@dataclass(frozen=True)
class _Expectation:
    generation: int
    gpus: GpuExpectation | None
    driver: bool  # the spec installs a driver or names its version
    cordon: bool  # hardware.onDrift: cordon on a kubeadm cluster


@dataclass
class _Node:
    session: Session | None
    held: dict[str, dict[str, Any]]
    seen: set[str] = field(default_factory=set)  # bus ids of GPUs it had
    smi: bool = False  # nvidia-smi listed GPUs on it
    generation: int = 0  # the generation of its plan, as last read
    pending: dict[str, int] = field(default_factory=dict)  # not held yet: type -> reports in a row
    key: tuple[int, str] = (-1, "")  # (generation, node state) of the last report looked at
    view: Any = None  # that report (the wire message): its GPU view


@dataclass(frozen=True)
class _Cached:
    at: float  # when it was looked up (time.monotonic)
    expect: _Expectation
    exact: bool  # of the generation asked for (False: the current one, that generation was gone)


def _confirmed(known: _Node, now: Mapping[str, Condition]) -> dict[str, Condition]:
    """What of ``now`` the node holds: a condition it held already, or one that has held in
    ``CONFIRM_REPORTS`` evaluated reports in a row; one seen fewer times waits (``known.pending``),
    so one odd reading (an nvidia-smi that timed out and listed nothing) raises nothing. A
    condition gone from ``now`` clears at once."""
    confirmed: dict[str, Condition] = {}
    pending: dict[str, int] = {}
    for kind, c in now.items():
        times = known.pending.get(kind, 0) + 1
        if kind in known.held or times >= CONFIRM_REPORTS:
            confirmed[kind] = c
        else:
            pending[kind] = times
    known.pending = pending
    return confirmed


def _same_view(a: Any, b: Any) -> bool:
    """Two reports (wire messages) show the same GPUs (compared without decoding them)."""
    return b is not None and a.gpus == b.gpus and a.pci_gpus == b.pci_gpus


class DriftWatch:
    """Keeps each connected node's GPU conditions current from its health reports."""

    def __init__(
        self,
        store: Store,
        hub: Hub,
        specs: Callable[[EnvironmentRecord], LoadedSpec],
        *,
        state: Callable[[str], str] | None = None,
        cordoner: Cordoner | None = None,
        recheck_seconds: float = SPEC_RECHECK_SECONDS,
    ) -> None:
        self._store = store
        self._hub = hub
        self._specs = specs
        self._state = state or self._state_from_store
        self._cordoner = cordoner
        self._recheck = recheck_seconds
        self._envs: dict[str, tuple[float, EnvironmentRecord | None]] = {}
        self._expects: dict[tuple[str, int], _Cached] = {}
        self._nodes: dict[str, _Node] = {}

    async def on_health(self, name: str, environment: str, session: Session | None, report: Any) -> None:
        """A health report (the wire message) of ``name``: its conditions, changed or not. Never
        raises: a node's stream never ends because of it."""
        try:
            await self._on_health(name, environment, session, report)
        except Exception:
            self.forget(name)  # looked at afresh with the next report
            log.exception("GPU drift: cannot evaluate a health report", node=name)

    async def _on_health(self, name: str, environment: str, session: Session | None, report: Any) -> None:
        known = self._nodes.get(name)
        if known is None or known.session is not session:
            known = self._load(name, session)  # once per stream
        expect = self._expectation(environment, self._generation(name, environment, known))
        if expect is None or expect.gpus is None:
            known.pending.clear()
            if known.held:
                await self._apply(name, environment, known, {}, expect)
            return
        state = self._state(name)
        key = (expect.generation, state)
        if key == known.key and _same_view(report, known.view) and not known.pending:
            return
        known.key, known.view = key, report
        if state != NodeState.PROVISIONED.value:
            known.pending.clear()
            return  # evaluated once provisioned; until then what was held stays
        health = wire.health_from_pb(report)  # only when its GPU view changed (or one waits)
        known.smi = known.smi or bool(health.gpus)
        now = evaluate(expect.gpus, health, driver=expect.driver or known.smi, seen=known.seen)
        known.seen.update(bus_id(g.pci_bus_id) for g in health.gpus if g.pci_bus_id)
        known.seen.update(bus_id(p.address) for p in health.pci_gpus)
        await self._apply(name, environment, known, _confirmed(known, now), expect)

    def forget(self, name: str) -> None:
        self._nodes.pop(name, None)

    # -- internals ----------------------------------------------------------------------------

    async def _apply(
        self,
        name: str,
        environment: str,
        known: _Node,
        now: Mapping[str, Condition],
        expect: _Expectation | None,
    ) -> None:
        t = compare(known.held, now, now_ms())
        if t is None:
            return
        if not await self._write(name, t.conditions):
            return
        known.held = t.conditions
        for line in notices(t):
            self._notice(name, line)
        log_fn = log.warning if t.raised or t.changed else log.info
        log_fn(
            "GPU conditions changed",
            node=name,
            environment=environment,
            raised=list(t.raised) or None,
            changed=list(t.changed) or None,
            cleared=list(t.cleared) or None,
            conditions={k: v["reason"] for k, v in t.conditions.items()} or None,
        )
        cordon_for = [c for c in t.raised if c not in self._accepted(name)]
        if cordon_for and expect is not None and expect.cordon and self._cordoner is not None:
            why = ", ".join(cordon_for)
            try:
                said = await self._cordoner.cordon(name, environment, why)
            except Exception as exc:  # a cordon that cannot be sent never takes the stream down
                log.exception("hardware.onDrift cordon failed", node=name)
                said = f"could not be sent: {exc}"
            self._notice(name, f"hardware.onDrift cordon ({why}): {said}")

    def _accepted(self, name: str) -> frozenset[str]:
        """Conditions an operator's release let through (``node release`` of a quarantine whose
        problem this is): raised and shown, but no cordon for them."""
        rec = self._store.get_node(name)
        keys = (rec.hardware.get("accepted") or {}).get("keys", ()) if rec is not None else ()
        return frozenset(ACCEPTED_CONDITIONS[k] for k in keys if k in ACCEPTED_CONDITIONS)

    async def _write(self, name: str, conditions: dict[str, dict[str, Any]]) -> bool:
        """The node's ``hardware["conditions"]``, the other keys kept (a gone node: False)."""
        current = self._store.get_node(name)
        if current is None or current.revoked:
            self.forget(name)
            return False
        await self._store.patch_node_hardware(name, {"conditions": conditions or None})
        return True

    def _notice(self, name: str, message: str) -> None:
        notice = wire.agent.Notice(step="", digest="", message=message)
        self._hub.send(name, wire.agent.ControllerMessage(notice=notice))

    def _environment(self, environment: str) -> EnvironmentRecord | None:
        """The environment's current record, looked up again every few seconds."""
        at = time.monotonic()
        cached = self._envs.get(environment)
        if cached is not None and at - cached[0] < self._recheck:
            return cached[1]
        env = self._store.get_environment(environment)
        if len(self._envs) > MAX_CACHED_EXPECTATIONS:
            self._envs.clear()
        self._envs[environment] = (at, env)
        return env

    def _generation(self, name: str, environment: str, known: _Node) -> int:
        """The generation of the node's plan: read from the store only while it is not the
        environment's current one (a rollout has not reached the node yet, or just did)."""
        env = self._environment(environment)
        if env is not None and known.generation != env.generation:
            rec = self._store.get_node(name)
            if rec is not None:
                known.generation = rec.plan_generation
        return known.generation

    def _expectation(self, environment: str, generation: int) -> _Expectation | None:
        """``spec.hardware`` of ``environment`` as of ``generation`` (the generation of a node's
        plan; 0: the current one), or of the current generation when the store no longer keeps
        that one. Cached per (environment, generation): a generation's document never changes
        (generations never repeat), so only a fallback to the current one is looked up again."""
        env = self._environment(environment)
        if env is None:
            return None
        generation = generation or env.generation
        at = time.monotonic()
        key = (environment, generation)
        cached = self._expects.get(key)
        if cached is not None and (cached.exact or at - cached.at < self._recheck):
            return cached.expect
        record: EnvironmentRecord | None = env
        if generation != env.generation:
            record = self._store.get_revision(environment, generation)
        exact = record is not None
        record = record or env  # that generation is gone: the current one
        if cached is not None and cached.expect.generation == record.generation:
            expect = cached.expect
        else:
            expect = self._parse(record)
        if len(self._expects) > MAX_CACHED_EXPECTATIONS:
            self._expects.clear()
        self._expects[key] = _Cached(at, expect, exact)
        return expect

    def _parse(self, env: EnvironmentRecord) -> _Expectation:
        try:
            spec = self._specs(env).spec
        except Exception:  # an environment that does not load: the planner reports it
            spec = None
        hw = spec.hardware if spec is not None else None
        if spec is None or hw is None:
            return _Expectation(env.generation, None, False, False)
        gpus = hw.gpus
        driver = spec.driver.install or bool(gpus is not None and gpus.driver_version)
        cordon = hw.on_drift == CORDON and spec.cluster is not None
        return _Expectation(env.generation, gpus, driver, cordon)

    def _load(self, name: str, session: Session | None) -> _Node:
        """What the store holds of the node, read once per stream."""
        rec = self._store.get_node(name)
        held: dict[str, dict[str, Any]] = {}
        known = _Node(session, held)
        if rec is not None:
            known.generation = rec.plan_generation
            held.update({str(k): dict(v) for k, v in rec.hardware.get("conditions", {}).items()})
            views: list[tuple[tuple[Gpu, ...], tuple[PciGpu, ...]]] = []
            try:
                if rec.facts:
                    f = facts_from_dict(rec.facts)
                    views.append((f.gpus, f.pci_gpus))
                if rec.health:
                    h = health_from_dict(rec.health)
                    views.append((h.gpus, h.pci_gpus))
            except Exception:  # an old record's shape: no names of GPUs it had, nothing else lost
                views = []
            for gpus, pci in views:
                known.smi = known.smi or bool(gpus)
                known.seen.update(bus_id(g.pci_bus_id) for g in gpus if g.pci_bus_id)
                known.seen.update(bus_id(p.address) for p in pci)
        if len(self._nodes) > 2 * len(self._hub) + 64:
            self._nodes = {n: k for n, k in self._nodes.items() if self._hub.connected(n)}
        self._nodes[name] = known
        return known

    def _state_from_store(self, name: str) -> str:
        rec = self._store.get_node(name)
        if rec is None:
            return ""
        connected = self._hub.connected(name)
        return node_state(rec, self._store.node_steps(name), connected).value
