"""Rollout commands taken by a replica that does not lead go to the one that does.

Only the leader writes rollouts (``RolloutDriver`` runs there), so a start (an apply, an undo, an
agent upgrade) or a pause, resume or abort taken by another replica is published to the replicas
(``Store.publish``: ids, names and states, never a secret); the leader runs it and answers with
the digest of the rollout it stored, or the error. The asking replica returns once its own view
of the store shows that rollout. No answer within ``ANSWER_SECONDS`` (no replica leads: the lease
is moving) is an UNAVAILABLE error that says to try again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import Any

import grpc

from tether.controller import errors
from tether.controller.rollout import RolloutDriver
from tether.controller.rollout.driver import KEY_PREFIX, RolloutError
from tether.controller.rollout.state import Rollout, RolloutStatus
from tether.controller.spec.model import RolloutPolicy
from tether.controller.store import Store
from tether.controller.store.records import EnvironmentRecord, StoreChange
from tether.nodeagent import logs

log = logs.get_logger("tether.controller.replicas")

ASK = "rollout-command"
ANSWER = "rollout-answer"
ANSWER_SECONDS = 15.0
ASK_AGAIN_SECONDS = 2.0
ANSWERS_KEPT = 256
VIEW_SECONDS = 5.0  # how long a replica waits for its view to show what another one wrote
POLL_SECONDS = 0.05


class NoLeader(errors.ControllerError):
    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


_ERRORS: dict[str, type[errors.ControllerError]] = {
    "NOT_FOUND": errors.NotFound,
    "FAILED_PRECONDITION": RolloutError,
    "ABORTED": errors.Aborted,
    "INVALID_ARGUMENT": errors.InvalidArgument,
    "UNAVAILABLE": NoLeader,
}


def _digest(raw: bytes | None) -> str:
    return hashlib.sha256(raw or b"").hexdigest()


class RolloutRelay:
    """``RolloutDriver.relay`` on a replica; answers the others' commands while this one leads."""

    def __init__(self, store: Store, driver: RolloutDriver, leading: Callable[[], bool]) -> None:
        self._store = store
        self._driver = driver
        self._leading = leading
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._answered: dict[str, dict[str, Any]] = {}  # id -> answer (asked again: answered again)

    def on_store_change(self, change: StoreChange) -> None:
        """A store listener: the others' commands (run while leading) and answers to this one's."""
        if change.kind != "message" or change.key not in (ASK, ANSWER):
            return
        try:
            doc: dict[str, Any] = json.loads(change.payload)
        except ValueError:
            return
        if change.key == ASK and self._leading():
            self._spawn(self._answer(doc))
        elif change.key == ANSWER and doc.get("to") == self._store.replica_id:
            waiter = self._waiting.get(str(doc.get("id", "")))
            if waiter is not None and not waiter.done():
                waiter.set_result(doc)

    async def unlead(self) -> None:
        """The lease is gone: commands this replica was still running for others stop here (the
        asker asks again, and the next leader answers)."""
        for task in list(self._tasks):
            task.cancel()
        self._answered.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the asking replica ---------------------------------------------------------------------

    async def ask(self, action: str, environment: str, **fields: Any) -> Rollout:
        """Have the leader run ``action``; the rollout as stored then (errors as the leader's)."""
        ask_id = uuid.uuid4().hex
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ask_id] = waiter
        if isinstance(fields.get("policy"), RolloutPolicy):
            fields["policy"] = asdict(fields["policy"])
        doc = {"id": ask_id, "from": self._store.replica_id, "action": action, "environment": environment}
        try:
            answer = await self._asked(json.dumps({**doc, **fields}), waiter)
        finally:
            self._waiting.pop(ask_id, None)
        if answer.get("error"):
            raise _ERRORS.get(str(answer.get("code")), errors.FailedPrecondition)(str(answer["error"]))
        return await self._shown(environment, str(answer.get("digest", "")))

    async def _asked(self, payload: str, waiter: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        """Publish ``payload`` until the leader answers: again every ``ASK_AGAIN_SECONDS`` (a
        message published while the lead moves reaches no leader; the leader answers an id once)."""
        deadline = asyncio.get_running_loop().time() + ANSWER_SECONDS
        while True:
            await self._store.publish(ASK, payload)
            left = deadline - asyncio.get_running_loop().time()
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), min(ASK_AGAIN_SECONDS, max(left, 0.01)))
            except asyncio.TimeoutError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise NoLeader(
                        "no controller replica leads the rollouts now (the lead is moving): "
                        "try again in a few seconds"
                    ) from None

    async def _shown(self, environment: str, digest: str) -> Rollout:
        """The rollout the leader stored, once this replica's view has it."""
        key = KEY_PREFIX + environment
        deadline = asyncio.get_running_loop().time() + VIEW_SECONDS
        raw = self._store.kv_get(key)
        while _digest(raw) != digest and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(POLL_SECONDS)
            raw = self._store.kv_get(key)
        self._driver.reload(environment)
        if raw is None:
            return self._driver.existing(environment)
        return Rollout.loads(raw)

    # -- the leader -----------------------------------------------------------------------------

    async def _answer(self, doc: dict[str, Any]) -> None:
        ask_id = str(doc.get("id", ""))
        if ask_id in self._answered:
            if self._answered[ask_id]:  # {} while it runs
                await self._store.publish(ANSWER, json.dumps(self._answered[ask_id]))
            return
        self._answered[ask_id] = {}
        while len(self._answered) > ANSWERS_KEPT:
            del self._answered[next(iter(self._answered))]
        answer = await self._outcome(doc)
        self._answered[ask_id] = answer
        await self._store.publish(ANSWER, json.dumps(answer))

    async def _outcome(self, doc: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = {"id": doc.get("id", ""), "to": doc.get("from", "")}
        environment = str(doc.get("environment", ""))
        try:
            await self._driving()
            await self._run(doc, environment)
            answer["digest"] = _digest(self._store.kv_get(KEY_PREFIX + environment))
        except errors.ControllerError as exc:
            answer.update(error=str(exc), code=exc.code.name)
        except Exception as exc:  # answered all the same: the asking call must not hang
            log.exception("relayed rollout command failed", action=doc.get("action"), environment=environment)
            answer.update(error=f"the rollout command failed on the leading replica: {type(exc).__name__}")
        return answer

    async def _driving(self) -> None:
        """This replica just took the lead: its driver starts after the settle time."""
        deadline = asyncio.get_running_loop().time() + VIEW_SECONDS
        while not self._driver.running:
            if asyncio.get_running_loop().time() >= deadline or not self._leading():
                raise NoLeader("the lead moved while the command was on its way: try again")
            await asyncio.sleep(POLL_SECONDS)

    async def _run(self, doc: dict[str, Any], environment: str) -> None:
        action = doc.get("action")
        if action == "start":
            env = await self._revision(environment, int(doc["generation"]))
            current = self._driver.get(environment)
            if current is not None and (current.generation, current.from_generation) == (
                env.generation,
                int(doc["from_generation"]),
            ):
                return  # started already (asked again after a leader died before it answered)
            policy = RolloutPolicy(**doc["policy"]) if doc.get("policy") else None
            await self._driver.start(env, int(doc["from_generation"]), policy)
        elif action == "steer":
            allowed = tuple(RolloutStatus(a) for a in doc["allowed"])
            await self._driver.steer(environment, RolloutStatus(doc["to"]), str(doc["reason"]), allowed)
        else:
            raise errors.InvalidArgument(f"unknown rollout command {action!r}")

    async def _revision(self, environment: str, generation: int) -> EnvironmentRecord:
        """Generation ``generation`` of ``environment``, once this replica's view has it."""
        deadline = asyncio.get_running_loop().time() + VIEW_SECONDS
        while True:
            current = self._store.get_environment(environment)
            if current is not None and current.generation == generation:
                return current
            if current is not None and current.generation > generation:
                kept = self._store.get_revision(environment, generation)
                if kept is not None:
                    return kept
            if asyncio.get_running_loop().time() >= deadline:
                raise errors.NotFound(f"generation {generation} of environment {environment!r} not found")
            await asyncio.sleep(POLL_SECONDS)
