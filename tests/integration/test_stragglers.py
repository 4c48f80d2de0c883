"""Issue 15: six nodes, one step takes 1 s on five of them and 40 s on the sixth: that one is
flagged a straggler, with an ETA, and no other (real controller on loopback, real agents, bash).

The slow node is told apart by its working directory (its agent's state directory); it runs on
until the test lets it go, so no 40 s sleep outlives the test.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import apply_env, ca_hash, events, nodes, token, wait_state
from tests.integration.harness import Agent, Controller, wait_for

STEP = "custom-slow"
SLOW = "node-6"


def epoch_ms(rfc3339: str) -> int:
    return round(dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def test_one_slow_node_is_flagged_straggler_with_an_eta(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    apply_env(
        controller,
        tmp_path,
        "fleet",
        f"""\
    - name: slow
      inline: |
        case "$PWD" in
          */agent-{SLOW}/*) for i in $(seq 400); do [ -e ../release ] && break; sleep 0.1; done ;;
          *) sleep 1 ;;
        esac
    - name: after
      inline: 'true'
""",
    )
    tok = token(controller, "fleet", "--uses", "6")
    fleet = [agents(f"node-{i}") for i in range(1, 7)]
    for a in fleet:
        a.start(tok, ca_hash(controller))
    fast = [a.name for a in fleet if a.name != SLOW]
    wait_state(controller, fast, "provisioned", timeout=40)

    listed = wait_for(
        lambda: (n := nodes(controller))[SLOW]["straggler"] and n, 30, what=f"{SLOW} flagged a straggler"
    )
    slow = listed[SLOW]
    assert slow["state"] == "provisioning"
    # Its ETA: what is left of the slow step (it is past its median: a floor) and the "after"
    # step's median, from now; an RFC 3339 time, not in the past.
    assert isinstance(slow["eta"], str) and epoch_ms(slow["eta"]) >= time.time() * 1000 - 5_000
    for name in fast:
        assert listed[name]["straggler"] is False and listed[name]["eta"] is None, listed[name]

    def notices(node: str) -> list[str]:
        return [
            str(e["message"])
            for e in events(controller, node)
            if e["kind"] == "info" and str(e["message"]).startswith("straggler:")
        ]

    said = wait_for(lambda: notices(SLOW), 15, what="the straggler event")
    assert len(said) == 1 and said[0].startswith(f"straggler: step {STEP} has run "), said
    assert "the median of 1." in said[0] and "on 5 other nodes" in said[0], said
    assert all(not notices(name) for name in fast)

    table = controller.ctl("node", "list").stdout.splitlines()
    assert table[0].split()[-2:] == ["ETA", "STRAGGLER"]
    rows = {line.split()[0]: line for line in table[1:]}
    assert re.search(r"\bin \d+[smhd]\S*\s+yes$", rows[SLOW]), rows[SLOW]  # "in 2s  yes"
    assert all(rows[name].split()[-2:] == ["-", "-"] for name in fast)
    described = controller.ctl("node", "describe", SLOW).stdout
    assert re.search(r"^ETA:\s+\d{4}-\d\d-\d\dT.*Z \(in \d", described, re.M), described
    assert re.search(rf"^Straggler:\s+yes: {STEP} has run", described, re.M), described

    (tmp_path / f"agent-{SLOW}" / "release").touch()  # let it finish: no ETA, no flag once done
    wait_state(controller, [SLOW], "provisioned", timeout=30)
    done = nodes(controller)[SLOW]
    assert done["straggler"] is False and done["eta"] is None
