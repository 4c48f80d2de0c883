"""What an enrolled, idle agent holds in memory (docs/performance.md, the agent footprint).

Every module an agent imports stays resident for its life: what it needs only to enroll, reset,
upgrade or read a config file is imported where it does so, and the standard library's OpenSSL
stays out (``tether.nodeagent.noopenssl``). Each check runs in a fresh interpreter, as the
``tether-agent`` entry point starts.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tether.nodeagent import noopenssl

# Loaded by none of an enrolled agent's imports (its run path: main, session and what they import).
NOT_LOADED = (
    "ssl",  # asyncio's, and enrollment's (identity.fetch_controller_ca)
    "_ssl",
    "_hashlib",  # hashlib's OpenSSL (noopenssl)
    "cryptography",  # enrolling and renewing
    "yaml",  # a config file (this agent runs with flags)
    "tarfile",  # staging an upgrade
    "compileall",
    "tether.nodeagent.enroll",
    "tether.nodeagent.anonymous",
    "tether.nodeagent.deprovision",
    "tether.nodeagent.bundlefetch",
    "tether.nodeagent.textfile",  # only with --metrics-textfile
)


def run_python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_an_enrolled_agent_does_not_load_what_it_does_not_use() -> None:
    out = run_python(
        f"""
        import sys
        import tether.nodeagent.main, tether.nodeagent.session
        from tether.nodeagent.certinfo import read_certinfo  # every heartbeat
        print(sorted(m for m in {NOT_LOADED!r} if m in sys.modules))
        print("_strptime" in sys.modules)
        """
    )
    assert out.split("\n")[:2] == ["[]", "False"]


def test_asyncio_without_ssl_and_hashlib_without_openssl_in_the_agent() -> None:
    out = run_python(
        """
        import sys
        import tether.nodeagent.main
        from tether.nodeagent import noopenssl
        import asyncio.base_events, asyncio.selector_events, asyncio.sslproto, hashlib
        print(noopenssl.WITHOUT_SSL, noopenssl.WITHOUT_HASHLIB_OPENSSL)
        print(asyncio.base_events.ssl, asyncio.selector_events.ssl, asyncio.sslproto.ssl)
        print(hashlib.sha256(b"abc").hexdigest())
        print("ssl" in sys.modules, "_hashlib" in sys.modules)
        import ssl  # the block is gone: enrollment imports it
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        print("ssl ok")
        """
    )
    lines = out.split("\n")
    assert lines[0] == f"True {noopenssl.has_builtin_hashes()}"
    assert lines[1] == "None None None"
    assert lines[2] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert lines[3] == "False False"
    assert lines[4] == "ssl ok"


def test_import_without_leaves_a_module_already_imported() -> None:
    # This process (pytest) imported asyncio and ssl long ago: nothing changes.
    import asyncio.base_events
    import ssl

    assert noopenssl.import_without("asyncio", "ssl") is False
    assert sys.modules["ssl"] is ssl and asyncio.base_events.ssl is ssl


def test_import_without_blocks_only_while_importing(tmp_path: Path) -> None:
    (tmp_path / "host.py").write_text("try:\n    import opt\nexcept ImportError:\n    opt = None\n")
    (tmp_path / "opt.py").write_text("")
    out = run_python(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from tether.nodeagent.noopenssl import import_without
        print(import_without("host", "opt"), sys.modules["host"].opt, "opt" in sys.modules)
        import opt  # importable again
        print(import_without("host", "opt"))  # host imported already: nothing to do
        """
    )
    assert out.split("\n")[:2] == ["True None False", "False"]
