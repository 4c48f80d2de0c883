"""Enrollment: trade the join token and a CSR for a node certificate, once.

After the first success the identity lives in the state directory and the
token is never needed (or sent) again. One attempt dials one address (``Rotation.current``); the
caller moves to the next one when it is unreachable (``ControllerUnavailable``).
"""

from __future__ import annotations

import asyncio

import grpc

from tether.nodeagent import anonymous, logs, wire
from tether.nodeagent.channel import secure_channel
from tether.nodeagent.config import AgentConfig
from tether.nodeagent.controllers import Rotation
from tether.nodeagent.errors import ControllerUnavailable, EnrollError
from tether.nodeagent.identity import Identity, IdentityStore, fetch_controller_ca, make_csr
from tether.nodeagent.model import HostFacts

log = logs.get_logger("tether.agent.enroll")

_PERMANENT = {
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAUTHENTICATED,
}


async def enroll(
    config: AgentConfig, store: IdentityStore, facts: HostFacts, controllers: Rotation
) -> tuple[Identity, int]:
    """Enroll this node at ``controllers.current``; returns the identity and the first event
    sequence number to use. The state directory remembers every address, that one first."""
    if not config.token:
        raise EnrollError("this node is not enrolled yet and no join token was given (--token or token_file)")
    if not config.ca_hash:
        raise EnrollError("this node is not enrolled yet: --ca-hash is required to trust the controller")
    node_name = config.node_name or facts.hostname
    key_pem = store.load_or_create_key()
    csr = make_csr(key_pem, node_name)
    address = controllers.current
    ca_pem = await asyncio.to_thread(fetch_controller_ca, address, config.ca_hash)
    log.info("controller CA verified against the pin", ca_hash=config.ca_hash, controller=address)
    request = wire.pb.EnrollRequest(
        token=config.token.reveal(),
        csr_pem=csr,
        node_name=node_name,
        facts=wire.facts_to_pb(facts),
        expect_environment=config.environment,
        expect_role=config.role,
    )
    async with secure_channel(address, ca_pem, anonymous.key_pem(), anonymous.CERT_PEM) as channel:
        stub = wire.AgentServiceStub(channel)
        try:
            reply = await stub.Enroll(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _PERMANENT:
                raise EnrollError(f"enrollment refused: {exc.details()}") from None
            raise ControllerUnavailable(f"enrollment failed: {exc.code().name}: {exc.details()}") from None
    identity = store.save(
        reply.node_name,
        reply.environment,
        reply.role,
        reply.certificate_pem,
        reply.ca_pem,
        controllers=controllers.remembered(),
    )
    log.info("enrolled", node=identity.node_name, environment=identity.environment, role=identity.role)
    return identity, reply.next_seq or 1
