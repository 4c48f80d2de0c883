"""The agent's process without the standard library's OpenSSL (its entry point imports this first).

Two standard modules load OpenSSL's ``libcrypto`` (and ``ssl`` also ``libssl``) when they are
imported, for nothing the agent uses:

- ``asyncio`` imports ``ssl`` (``base_events``, ``selector_events``, ``sslproto``: ``try: import
  ssl except ImportError: ssl = None``) only to offer TLS on its own transports
  (``loop.create_connection(ssl=...)``, ``start_tls``). The agent never uses them: gRPC carries its
  own TLS (BoringSSL, inside ``grpc._cython``), and enrollment fetches the controller's CA with a
  plain ``ssl`` socket (``identity.fetch_controller_ca``, which imports ``ssl`` itself).
- ``hashlib`` takes its hashes from ``_hashlib`` (OpenSSL) when it can, else from Python's own
  ``_sha256`` and friends. The agent only computes SHA-256 (step digests, the CA pin, a bundle's
  checksum); the built-in one gives the same digests (slower: about 220 MB/s against OpenSSL's
  1.2 GB/s here, which only a bundle's download notices). Only where this Python has all of its
  built-in hashes: some distributions build it with OpenSSL's alone (for FIPS), and there
  ``hashlib`` keeps OpenSSL.

Together about 4.5 MiB of an idle agent's RSS (OpenSSL's start-up touches 3.3 MiB of libcrypto
alone; docs/performance.md). So, in a process that has imported none of them yet, ``asyncio`` and
``hashlib`` are imported here with ``ssl`` and ``_hashlib`` blocked (``sys.modules[name] = None``
makes ``import name`` raise ImportError, which both handle: asyncio keeps ``ssl = None``, hashlib
its built-in constructors), and the blocks are removed at once: from here on ``import ssl`` works
as ever. What stays, for this process: asyncio without TLS of its own
(``loop.create_connection(ssl=...)`` raises ``RuntimeError: stdlib ssl module not available``),
and ``hashlib`` without OpenSSL-only extras (``scrypt``, OpenSSL's other algorithms). Nothing in
the agent asks for them; ``tests/unit/nodeagent/test_footprint.py`` checks what an agent loads.

In a process that imported asyncio, ssl or hashlib before (tests, the controller, tetherctl),
the module concerned is left as it is.
"""

from __future__ import annotations

import sys

# The modules hashlib falls back on without ``_hashlib`` (its ``__get_builtin_constructor``).
BUILTIN_HASHES = (
    ("_md5", "_sha1", "_sha2", "_blake2", "_sha3")
    if sys.version_info >= (3, 12)
    else ("_md5", "_sha1", "_sha256", "_sha512", "_blake2", "_sha3")
)


def import_without(module: str, blocked: str) -> bool:
    """Import ``module`` while ``blocked`` cannot be imported, unless either is imported already;
    True if it did. ``blocked`` can be imported again afterwards."""
    if module in sys.modules or blocked in sys.modules:
        return False
    sys.modules[blocked] = None  # type: ignore[assignment]  # now ``import blocked`` raises ImportError
    try:
        __import__(module)
    finally:
        del sys.modules[blocked]
    return True


def has_builtin_hashes() -> bool:
    """Whether every built-in hash module is there (else hashlib without OpenSSL would lack some,
    and say so on stderr when imported)."""
    for name in BUILTIN_HASHES:
        try:
            __import__(name)
        except ImportError:
            return False
    return True


WITHOUT_SSL = import_without("asyncio", "ssl")
WITHOUT_HASHLIB_OPENSSL = has_builtin_hashes() and import_without("hashlib", "_hashlib")
