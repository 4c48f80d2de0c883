"""tether.controller.client: a typed, synchronous Python client of the admin API.

    from tether.controller.client import Client

    with Client.from_admin_conf() as client:          # $TETHER_CONFIG or ~/.config/tether/admin.conf
        for node in client.iter_nodes("gpu-lab"):     # every node, one page at a time
            print(node.name, node.state)

Errors are ``tether.controller.client.errors.ApiError`` subclasses (one per gRPC code, validation
failures with their field violations). tetherctl is built on it. See docs/admin-api.md.
"""

from tether.controller.client.api import DEFAULT_TIMEOUT, Client, Environment, Node, Token
from tether.controller.client.connection import ConfigError

__all__ = ["DEFAULT_TIMEOUT", "Client", "ConfigError", "Environment", "Node", "Token"]
