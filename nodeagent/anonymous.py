"""The anonymous enrollment identity: a deliberately public TLS client identity.

The controller serves every RPC on one port that requires a client
certificate (gRPC cannot make client certificates optional). An agent that
has not enrolled yet has none, so it presents this well-known identity to
complete the handshake. It is not a secret and grants nothing but ``Enroll``
(which the join token guards) and the health/reflection services: the
controller maps it to the ``anonymous`` principal and refuses it everywhere
else. Its key is derived from a public seed rather than stored, and the
certificate has ``CA:FALSE``, so nothing can be issued under it.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

COMMON_NAME = "tether-anonymous-enrollment"
_SEED = b"tether anonymous enrollment identity v1"
_P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551

CERT_PEM = b"""-----BEGIN CERTIFICATE-----
MIIBlTCCATqgAwIBAgIBATAKBggqhkjOPQQDAjA3MQ8wDQYDVQQKDAZ0ZXRoZXIx
JDAiBgNVBAMMG3RldGhlci1hbm9ueW1vdXMtZW5yb2xsbWVudDAgFw0yNTAxMDEw
MDAwMDBaGA8yMTI1MDEwMTAwMDAwMFowNzEPMA0GA1UECgwGdGV0aGVyMSQwIgYD
VQQDDBt0ZXRoZXItYW5vbnltb3VzLWVucm9sbG1lbnQwWTATBgcqhkjOPQIBBggq
hkjOPQMBBwNCAATg+oSvM5zLYUAyVBeW6vR+4jEh0JTi6/5nq7YVSadZOGfjRZ+r
wwpISA/Dl2RUh40CErwNZC9d+qogpz7Q598nozUwMzAMBgNVHRMBAf8EAjAAMA4G
A1UdDwEB/wQEAwIHgDATBgNVHSUEDDAKBggrBgEFBQcDAjAKBggqhkjOPQQDAgNJ
ADBGAiEAuyV/4KuLqEy5wiLka/nPiseEdu61s3eSMxxh6Lp8bhYCIQDTQdvbCQDr
wuPNAMKdjm5PMJnazKubtLQMgqYcDyzNjw==
-----END CERTIFICATE-----
"""


@lru_cache(maxsize=1)
def key_pem() -> bytes:
    """The identity's private key, derived from the public seed."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    scalar = int.from_bytes(hashlib.sha256(_SEED).digest(), "big") % (_P256_ORDER - 1) + 1
    key = ec.derive_private_key(scalar, ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
