"""Issue 10, item 14: a validated value is checked whole (no trailing newline, no odd digits)."""

from __future__ import annotations

import pytest

from tether.bootstrap.install import valid_node_name
from tether.nodeagent.errors import IdentityError
from tether.nodeagent.identity import split_address


def test_a_node_name_with_a_trailing_newline_is_refused() -> None:
    assert valid_node_name("node-1")
    assert not valid_node_name("node-1\n")
    assert not valid_node_name("node-1\nx")


@pytest.mark.parametrize("address", ["h:7443\n", "h:\u0663", "h:99999", "h:", "h"])
def test_a_controller_address_must_end_in_an_ascii_port(address: str) -> None:
    with pytest.raises(IdentityError):
        split_address(address)


def test_a_plain_address_still_splits() -> None:
    assert split_address("[::1]:7443") == ("::1", 7443)
    assert split_address("10.0.0.1:7443") == ("10.0.0.1", 7443)
