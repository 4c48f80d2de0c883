"""``Client``: the admin API as typed Python methods, lists as paging iterators, errors as exceptions."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

import grpc

from tether.controller.adminconf import AdminConfig
from tether.controller.client import connection, pages, waiting, watch
from tether.controller.client.errors import from_rpc_error
from tether.v1 import admin_pb2, admin_pb2_grpc

Resp = TypeVar("Resp")
DEFAULT_TIMEOUT = 30.0  # seconds one call may take (None: no deadline)

Node = admin_pb2.Node
Environment = admin_pb2.Environment
Token = admin_pb2.Token


class Client:
    """A synchronous client of tether's AdminService over a blocking gRPC channel.

    Every method is one call (lists: one call per page, fetched as the iterator goes); a failed
    call raises the ``tether.controller.client.errors.ApiError`` of its status code (a validation
    failure carries its field violations), the ``grpc.RpcError`` kept as its ``__cause__``. Use it
    from several threads if need be (the channel is thread-safe; an iterator is not); ``stub`` is
    the generated stub for anything else. ``Client.from_admin_conf()`` connects as tetherctl does.
    """

    def __init__(
        self, channel: grpc.Channel, *, timeout: float | None = DEFAULT_TIMEOUT, address: str = ""
    ) -> None:
        self.channel = channel
        self.timeout = timeout
        self.address = address  # where it connects (for messages; "" if unknown)
        self.config: AdminConfig | None = None
        self._stub = admin_pb2_grpc.AdminServiceStub(channel)

    @classmethod
    def from_admin_conf(
        cls,
        path: str | os.PathLike[str] | None = None,
        context: str | None = None,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> Client:
        """A client of the controller an admin.conf names: ``path``, else ``$TETHER_CONFIG``, else
        ~/.config/tether/admin.conf; its ``context`` (else ``$TETHER_CONTEXT``, else the current
        one). Raises ``connection.ConfigError`` if the file cannot be used."""
        conf = connection.read_admin_conf(path, context)
        client = cls(connection.secure_channel(conf), timeout=timeout, address=conf.controller)
        client.config = conf
        return client

    @property
    def stub(self) -> admin_pb2_grpc.AdminServiceStub:
        return self._stub

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def call(self, method: Callable[..., Resp], request: Any) -> Resp:
        """``method(request)`` (a stub method) with this client's deadline, errors translated."""
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc

    # -- environments -------------------------------------------------------------------------

    def apply_environment(
        self, document: str, *, dry_run: bool = False, expected_generation: int = 0
    ) -> admin_pb2.ApplyEnvironmentResponse:
        """Store an environment document (YAML or JSON, local files already inlined); with
        ``expected_generation`` only if that is its current generation (else ``AbortedError``)."""
        request = admin_pb2.ApplyEnvironmentRequest(
            document=document, dry_run=dry_run, expected_generation=expected_generation
        )
        return self.call(self._stub.ApplyEnvironment, request)

    def get_environment(self, name: str) -> Environment:
        return self.call(self._stub.GetEnvironment, admin_pb2.GetEnvironmentRequest(name=name))

    def iter_environments(self, page_size: int = 0) -> Iterator[Environment]:
        """Every environment, by name (``page_size`` 0: the controller's default page)."""

        def fetch(token: str) -> admin_pb2.ListEnvironmentsResponse:
            request = admin_pb2.ListEnvironmentsRequest(page_size=page_size, page_token=token)
            return self.call(self._stub.ListEnvironments, request)

        return pages.items(fetch, lambda page: page.environments)

    def list_environments(self, page_size: int = 0) -> list[Environment]:
        return list(self.iter_environments(page_size))

    # -- tokens -------------------------------------------------------------------------------

    def create_token(
        self,
        environment: str,
        role: str = "worker",
        *,
        ttl_seconds: int = 0,
        uses: int = 0,
        node_name: str = "",
        description: str = "",
    ) -> admin_pb2.CreateTokenResponse:
        """A join token (its ``token`` is shown once: hand it to the agent, never log it)."""
        request = admin_pb2.CreateTokenRequest(
            environment=environment,
            role=role,
            ttl_seconds=ttl_seconds,
            uses=uses,
            node_name=node_name,
            description=description,
        )
        return self.call(self._stub.CreateToken, request)

    def revoke_token(self, token_id: str) -> None:
        self.call(self._stub.RevokeToken, admin_pb2.RevokeTokenRequest(id=token_id))

    def iter_tokens(self, environment: str = "", page_size: int = 0) -> Iterator[Token]:
        """Every join token (of ``environment``, or all), oldest first."""

        def fetch(token: str) -> admin_pb2.ListTokensResponse:
            request = admin_pb2.ListTokensRequest(
                environment=environment, page_size=page_size, page_token=token
            )
            return self.call(self._stub.ListTokens, request)

        return pages.items(fetch, lambda page: page.tokens)

    def list_tokens(self, environment: str = "", page_size: int = 0) -> list[Token]:
        return list(self.iter_tokens(environment, page_size))

    # -- nodes --------------------------------------------------------------------------------

    def get_node(self, name: str) -> Node:
        """One node with its steps and health (a list's nodes have neither)."""
        return self.call(self._stub.GetNode, admin_pb2.GetNodeRequest(name=name))

    def iter_nodes(self, environment: str = "", page_size: int = 0) -> Iterator[Node]:
        """Every node (of ``environment``, or all), by name, one page fetched at a time."""

        def fetch(token: str) -> admin_pb2.ListNodesResponse:
            request = admin_pb2.ListNodesRequest(
                environment=environment, page_size=page_size, page_token=token
            )
            return self.call(self._stub.ListNodes, request)

        return pages.items(fetch, lambda page: page.nodes)

    def list_nodes(self, environment: str = "", page_size: int = 0) -> list[Node]:
        return list(self.iter_nodes(environment, page_size))

    def watch_nodes(
        self, environment: str = "", revision: int = 0, *, resume: bool = True
    ) -> Iterator[admin_pb2.NodeEvent]:
        """The node events of ``environment`` ("" = every one the caller may see) from ``revision``
        (0: one ADDED per node, then SYNCED, then the changes), resumed across broken streams (see
        ``tether.controller.client.watch``). Closing the iterator ends the call."""
        return watch.watch_nodes(self._stub, environment, revision, resume=resume)

    # -- audit --------------------------------------------------------------------------------

    def iter_audit_records(
        self, environment: str = "", page_size: int = 0
    ) -> Iterator[admin_pb2.AuditRecord]:
        """Every audit record (of ``environment``, or all the caller may see), newest first."""

        def fetch(token: str) -> admin_pb2.ListAuditRecordsResponse:
            request = admin_pb2.ListAuditRecordsRequest(
                environment=environment, page_size=page_size, page_token=token
            )
            return self.call(self._stub.ListAuditRecords, request)

        return pages.items(fetch, lambda page: page.records)

    # -- controller replicas ------------------------------------------------------------------

    def list_controllers(self) -> list[admin_pb2.ControllerReplica]:
        """The controller replicas sharing the store, live ones first (``leader``: the one that
        runs the singleton work)."""
        reply = self.call(self._stub.ListControllers, admin_pb2.ListControllersRequest())
        return list(reply.controllers)

    # -- rollouts -----------------------------------------------------------------------------

    def get_rollout(self, environment: str) -> admin_pb2.Rollout | None:
        """The environment's current (or last) rollout; None while it has had none."""
        request = admin_pb2.GetRolloutRequest(environment=environment)
        return waiting.rollout_or_none(lambda: self.call(self._stub.GetRollout, request))

    def wait_for_nodes(
        self,
        environment: str,
        *,
        timeout: float = waiting.DEFAULT_WAIT_SECONDS,
        min_nodes: int = 1,
        poll_seconds: float = waiting.POLL_SECONDS,
        on_progress: Callable[[waiting.Progress], None] | None = None,
    ) -> waiting.Progress:
        """Poll until every node of ``environment`` (``min_nodes`` at least) is provisioned on its
        current generation, one failed, or ``timeout`` seconds passed; the last check is returned."""
        return waiting.wait_for_nodes(
            self,
            environment,
            timeout=timeout,
            min_nodes=min_nodes,
            poll_seconds=poll_seconds,
            on_progress=on_progress,
        )
