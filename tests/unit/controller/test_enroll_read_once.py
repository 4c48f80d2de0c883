"""Issue 16, enrollment: the CSR read once, the leaf template, the facts without deep copies.

The same certificates, the same key hash, the same refusals and the same facts as before.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from tether.controller import ca as ca_module
from tether.controller import enrollment, wire
from tether.controller.ca import CertificateAuthority, fingerprint
from tether.controller.errors import InvalidArgument
from tether.nodeagent.identity import generate_key, make_csr
from tether.nodeagent.model import Gpu, HostFacts, PciGpu


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority.load_or_create(tmp_path / "pki")


def test_a_parsed_csr_signs_the_same_certificate_as_its_pem(
    ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(ca_module, "_now", lambda: fixed)
    monkeypatch.setattr(x509, "random_serial_number", lambda: 4242)
    pem = make_csr(generate_key(), "n1")
    read = enrollment.read_csr(pem)
    from_pem = ca.sign_node_csr(pem, "node-1", days=3)
    parsed = ca.sign_node_csr(read.csr, "node-1", days=3, public_key=read.public_key)
    without_key = ca.sign_node_csr(read.csr, "node-1", days=3)
    # ECDSA signatures differ each time: everything the CA signed is the same
    issued = (from_pem, parsed, without_key)
    assert len({x509.load_pem_x509_certificate(i.cert_pem).tbs_certificate_bytes for i in issued}) == 1
    cert = x509.load_pem_x509_certificate(parsed.cert_pem)
    assert parsed.cert_pem == cert.public_bytes(serialization.Encoding.PEM)
    assert parsed.fingerprint == fingerprint(cert) == cert.fingerprint(hashes.SHA256()).hex()
    assert parsed.serial == 4242
    assert ca.verify_issued(cert)
    assert [e.oid for e in cert.extensions] == [
        x509.BasicConstraints.oid,
        x509.KeyUsage.oid,
        x509.AuthorityKeyIdentifier.oid,
        x509.SubjectAlternativeName.oid,
        x509.ExtendedKeyUsage.oid,
    ]


def test_the_key_hash_is_the_spki_hash_either_way() -> None:
    pem = make_csr(generate_key(), "n1")
    assert enrollment.read_csr(pem).key_hash == enrollment.csr_key_hash(pem)


def test_a_parsed_csr_with_a_bad_signature_is_still_refused(ca: CertificateAuthority) -> None:
    pem = make_csr(generate_key(), "n1")
    der = bytearray(x509.load_pem_x509_csr(pem).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 1  # the last byte of the signature
    tampered = x509.load_der_x509_csr(bytes(der))
    read = enrollment.read_csr(tampered.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(InvalidArgument, match="bad signature"):
        ca.sign_node_csr(read.csr, "node-1", days=1, public_key=read.public_key)


def test_an_unreadable_csr_is_refused_when_read() -> None:
    with pytest.raises(InvalidArgument, match="invalid CSR"):
        enrollment.read_csr(b"-----BEGIN CERTIFICATE REQUEST-----\nnope\n-----END CERTIFICATE REQUEST-----\n")


def test_facts_are_what_asdict_gives() -> None:
    facts = HostFacts(
        hostname="h",
        systemd=True,
        gpus=(Gpu(index=0, name="A100", uuid="u", memory_total_mib=81920),),
        addresses=("10.0.0.1", "fe80::1"),
        cpu_count=64,
        memory_total_bytes=1 << 40,
        pci_gpus=(PciGpu(address="0000:01:00.0", device_id="20b0"),),
    )
    facts = wire.facts_from_pb(wire.facts_to_pb(facts))
    mine, theirs = enrollment.as_dict(facts), dataclasses.asdict(facts)
    assert mine == theirs
    assert all(type(mine[k]) is type(theirs[k]) for k in theirs)  # tuples stay tuples
    assert type(mine["gpus"][0]) is dict


def test_the_guard_wraps_a_handler_once_and_again_when_it_changes() -> None:
    import asyncio
    from typing import Any

    import grpc

    from tether.controller import guard

    async def behaviour(request: Any, context: Any) -> Any:
        return request

    first: Any = grpc.unary_unary_rpc_method_handler(behaviour)
    second: Any = grpc.unary_unary_rpc_method_handler(behaviour)

    class Details:
        method = guard.ENROLL
        invocation_metadata = ()

    async def run() -> list[Any]:
        g = guard.Guard()
        out = []
        for handler in (first, first, second):

            async def continuation(details: Any, handler: Any = handler) -> Any:
                return handler

            out.append(await g.intercept_service(continuation, Details()))  # type: ignore[arg-type]
        return out

    a, b, c = asyncio.run(run())
    assert a is b and a is not c
    assert a is not first and c is not second  # wrapped, not passed through
