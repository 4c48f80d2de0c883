"""Serial number and validity of a PEM certificate, read without a crypto library.

The agent checks its certificate's lifetime on every heartbeat; reading these three
DER fields here keeps ``cryptography`` (about 10 MB resident) out of an agent that
only needs it to enroll and to renew.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from dataclasses import dataclass

from tether.nodeagent.errors import IdentityError

# YYYYMMDDHHMMSSZ, read field by field (``strptime`` would load ``_strptime`` and its locale tables
# into every agent for one fixed format).
_DER_TIME = re.compile(r"([0-9]{4})([0-9]{2})([0-9]{2})([0-9]{2})([0-9]{2})([0-9]{2})Z")


@dataclass(frozen=True)
class CertInfo:
    serial_number: int
    not_valid_before: dt.datetime
    not_valid_after: dt.datetime


def read_certinfo(pem: bytes) -> CertInfo:
    """The serial and validity window (UTC) of the first certificate in ``pem``."""
    try:
        der = _first_der(pem)
        cert, _ = _tlv(der, 0, 0x30)
        tbs, _ = _tlv(der, cert, 0x30)
        pos = tbs
        if der[pos] == 0xA0:  # [0] EXPLICIT version
            pos = _skip(der, pos)
        serial_start, pos = _tlv(der, pos, 0x02)
        serial = int.from_bytes(der[serial_start:pos], "big", signed=True)
        pos = _skip(der, pos)  # signature algorithm
        pos = _skip(der, pos)  # issuer
        validity, _ = _tlv(der, pos, 0x30)
        before, after_pos = _time(der, validity)
        after, _ = _time(der, after_pos)
    except (IndexError, ValueError) as exc:
        raise IdentityError(f"cannot read the certificate: {exc}") from exc
    return CertInfo(serial, before, after)


def _first_der(pem: bytes) -> bytes:
    text = pem.decode("ascii", errors="replace")
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.index(begin) + len(begin)
    return base64.b64decode("".join(text[start : text.index(end, start)].split()), validate=True)


def _header(der: bytes, pos: int) -> tuple[int, int]:
    """(start of the value, its length) of the TLV at ``pos``."""
    first = der[pos + 1]
    if first < 0x80:
        return pos + 2, first
    n = first & 0x7F
    if not 0 < n <= 4:
        raise ValueError("bad DER length")
    return pos + 2 + n, int.from_bytes(der[pos + 2 : pos + 2 + n], "big")


def _tlv(der: bytes, pos: int, tag: int) -> tuple[int, int]:
    """(start of the value, end of the TLV) of the ``tag`` element at ``pos``."""
    if der[pos] != tag:
        raise ValueError(f"expected DER tag {tag:#x} at {pos}, found {der[pos]:#x}")
    start, length = _header(der, pos)
    return start, start + length


def _skip(der: bytes, pos: int) -> int:
    start, length = _header(der, pos)
    return start + length


def _time(der: bytes, pos: int) -> tuple[dt.datetime, int]:
    tag = der[pos]
    start, end = _tlv(der, pos, tag)
    text = der[start:end].decode("ascii")
    if tag == 0x17:  # UTCTime YYMMDDHHMMSSZ: 1950-2049
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != 0x18:  # GeneralizedTime YYYYMMDDHHMMSSZ
        raise ValueError(f"expected a DER time at {pos}, found tag {tag:#x}")
    fields = _DER_TIME.fullmatch(text)
    if fields is None:
        raise ValueError(f"expected a DER time at {pos}, found {text!r}")
    year, month, day, hour, minute, second = (int(f) for f in fields.groups())
    when = dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.timezone.utc)
    return when, end
