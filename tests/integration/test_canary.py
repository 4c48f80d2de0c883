"""A canary join token must never surface: not in logs, events, errors or either database."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.integration.conftest import apply_env, ca_hash, events, token, wait_state
from tests.integration.harness import Agent, Controller


def test_canary_join_token_never_appears(
    controller: Controller, agents: Callable[[str], Agent], tmp_path: Path
) -> None:
    token_file = tmp_path / "join-token"
    apply_env(
        controller,
        tmp_path,
        "canary",
        f"""\
    - name: careless
      inline: |
        echo "the token is $(cat {token_file})"
        cat {token_file}
""",
    )
    canary = token(controller, "canary")
    secret_part = canary.split(".")[1]
    token_file.write_text(canary + "\n")
    os.chmod(token_file, 0o600)
    agent = agents("n1")
    agent.start("", "", "--token-file", str(token_file), "--ca-hash", ca_hash(controller))
    wait_state(controller, ["n1"], "provisioned")
    # A refused reuse must not echo the token back either.
    out = agents("n2").run_once(canary, ca_hash(controller))
    assert out.returncode != 0
    evs = events(controller, "n1")
    lines = [line for e in evs for line in e["lines"]]  # type: ignore[attr-defined]
    assert "the token is [REDACTED]" in lines and "[REDACTED]" in lines
    agent.kill()
    controller.kill()
    surfaces = {
        "events": json.dumps(evs),
        "controller log": controller.log_path.read_text(),
        "agent log": agent.log_path.read_text(),
        "refusal": out.stdout + out.stderr,
        "controller db": controller.db_dump(),
        "agent db": agent.db_dump(),
    }
    # Raw bytes of every file either side keeps (SQLite WAL files included).
    for root in (controller.data_dir, agent.state_dir):
        for path in root.rglob("*"):
            if path.is_file():
                surfaces[str(path)] = path.read_bytes().decode("latin-1")
    for name, text in surfaces.items():
        assert secret_part not in text, f"the canary token leaked into the {name}"
        assert canary not in text, f"the canary token leaked into the {name}"
    # Its hash may be stored; its id is public.
    assert canary.split(".")[0] in surfaces["controller db"]
