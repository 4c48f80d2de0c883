"""The controller replicas an agent may dial, and the order it tries them in.

Where the addresses come from:

- the operator: ``--controller A,B`` (a single address works as before), ``controller: A`` or
  ``controllers: [A, B]`` in agent.yaml (see ``tether.nodeagent.config``);
- the state directory (``node.json``): what enrolling used, replaced by every Welcome that lists
  the live replicas (``Welcome.controllers``, the welcoming replica first).

``Rotation`` is the agent's list while it runs: it starts at the first address, moves to the next
one after each failed attempt (the caller waits its usual backoff in between, so a fleet does not
stampede the survivors), and takes a Welcome's list as the new order, keeping the configured
addresses at the end as a last resort (a load balancer's name, say, that no replica advertises).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tether.nodeagent import logs
from tether.nodeagent.identity import split_address

log = logs.get_logger("tether.agent")

# More would be a controller's bug (or a hostile one): the rest are dropped.
MAX_CONTROLLERS = 32


def parse_addresses(value: object, key: str = "controller") -> tuple[tuple[str, ...], list[str]]:
    """Addresses from a flag or YAML value: "A", "A,B", or a list of strings.

    Returns the addresses (blanks dropped, duplicates dropped, order kept) and one problem line per
    bad address, naming ``key``; an empty value gives no address and no problem.
    """
    if value is None or value == "":
        return (), []
    if isinstance(value, str):
        items: list[object] = list(value.split(","))
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return (), [f"{key}: expected HOST:PORT, a comma-separated list or a YAML list of them"]
    addresses: list[str] = []
    problems: list[str] = []
    for item in items:
        if not isinstance(item, str):
            problems.append(f"{key}: {item!r} is not a HOST:PORT string")
            continue
        address = item.strip()
        if not address:
            continue
        try:
            split_address(address)
        except Exception as exc:
            problems.append(f"{key}: {exc}")
            continue
        if address not in addresses:
            addresses.append(address)
    if len(addresses) > MAX_CONTROLLERS:
        problems.append(f"{key}: {len(addresses)} addresses; at most {MAX_CONTROLLERS}")
    return tuple(addresses), problems


def split_addresses(value: str) -> tuple[str, ...]:
    """``"A"`` or ``"A,B"`` as addresses; ValueError naming every bad one (or saying none given)."""
    addresses, problems = parse_addresses(value, "controller")
    if problems:
        raise ValueError("; ".join(p.removeprefix("controller: ") for p in problems))
    if not addresses:
        raise ValueError("no address given: expected HOST:PORT or several: HOST:PORT,HOST:PORT")
    return addresses


def merged(*lists: Iterable[str]) -> tuple[str, ...]:
    """Every address of ``lists`` once, in order of first appearance."""
    out: list[str] = []
    for addresses in lists:
        out.extend(a for a in addresses if a not in out)
    return tuple(out)


def welcome_addresses(listed: Sequence[str]) -> tuple[str, ...]:
    """The valid addresses of a Welcome's list (bad ones are logged and skipped)."""
    valid, problems = parse_addresses(list(listed[: MAX_CONTROLLERS + 1]), "welcome")
    for problem in problems:
        log.warning("ignoring a controller address the welcome lists", problem=problem)
    return valid[:MAX_CONTROLLERS]


class Rotation:
    """The addresses to dial, in order, and the one in use."""

    def __init__(self, configured: Sequence[str], remembered: Sequence[str] = ()) -> None:
        self.configured = tuple(configured)
        self.addresses = merged(self.configured, remembered)
        if not self.addresses:
            raise ValueError("no controller address")
        self._index = 0

    @property
    def current(self) -> str:
        return self.addresses[self._index]

    def advance(self) -> str:
        """After a failed attempt on ``current``: the address to try next (wraps around)."""
        self._index = (self._index + 1) % len(self.addresses)
        return self.current

    def welcomed(self, listed: Sequence[str]) -> bool:
        """A Welcome's list (this replica first) becomes the order; False when it lists none."""
        if not listed:
            return False
        self.addresses = merged(listed, self.configured)
        self._index = 0
        return True

    def remembered(self) -> tuple[str, ...]:
        """What the state directory keeps: the current address first, then the others."""
        return merged((self.current,), self.addresses)
