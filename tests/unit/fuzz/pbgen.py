"""Hypothesis strategies for protobuf: any message of a type, as bytes, walked from its descriptor.

``messages(cls)`` builds a message with every field possibly set to any value of its type
(unknown enum numbers, extreme integers, any Unicode, nested messages, maps, repeated fields),
``wire_bytes(cls)`` is such a message serialized, sometimes cut short or with bytes changed, and
sometimes just random bytes: what a hostile peer can put on the wire.
"""

from __future__ import annotations

import os
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Brief in CI; TETHER_FUZZ_EXAMPLES=20000 for a longer run by hand.
EXAMPLES = int(os.environ.get("TETHER_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

T = FieldDescriptor
_INTS = {
    T.TYPE_INT32: (-(2**31), 2**31 - 1),
    T.TYPE_SINT32: (-(2**31), 2**31 - 1),
    T.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    T.TYPE_INT64: (-(2**63), 2**63 - 1),
    T.TYPE_SINT64: (-(2**63), 2**63 - 1),
    T.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    T.TYPE_UINT32: (0, 2**32 - 1),
    T.TYPE_FIXED32: (0, 2**32 - 1),
    T.TYPE_UINT64: (0, 2**64 - 1),
    T.TYPE_FIXED64: (0, 2**64 - 1),
    T.TYPE_ENUM: (-(2**31), 2**31 - 1),
}
_TEXT = st.text(max_size=40) | st.sampled_from(["", "-", "..", "x\n", "a/b", "\u202e", "0", "UNKNOWN"])


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    if f.type in _INTS:
        low, high = _INTS[f.type]
        edges = st.sampled_from([low, high, 0, 1, -1]).filter(lambda v: low <= v <= high)
        return st.integers(low, high) | edges
    if f.type in (T.TYPE_DOUBLE, T.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=64 if f.type == T.TYPE_DOUBLE else 32)
    if f.type == T.TYPE_BOOL:
        return st.booleans()
    if f.type == T.TYPE_STRING:
        return _TEXT
    if f.type == T.TYPE_BYTES:
        return st.binary(max_size=64)
    raise AssertionError(f"no strategy for {f.full_name}")


def _fill(msg: Message, desc: Descriptor, draw: Any, depth: int) -> None:
    for f in desc.fields:
        if not draw(st.booleans()):
            continue
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            for _ in range(draw(st.integers(0, 3))):
                key = draw(_scalar(key_f))
                if value_f.message_type is not None:
                    _fill(getattr(msg, f.name)[key], value_f.message_type, draw, depth + 1)
                else:
                    getattr(msg, f.name)[key] = draw(_scalar(value_f))
        elif f.message_type is not None:
            if depth > 4:
                continue
            count = draw(st.integers(0, 3)) if f.is_repeated else 1
            for _ in range(count):
                sub = getattr(msg, f.name).add() if f.is_repeated else getattr(msg, f.name)
                _fill(sub, f.message_type, draw, depth + 1)
                if not f.is_repeated:
                    sub.SetInParent()
        elif f.is_repeated:
            getattr(msg, f.name).extend(draw(st.lists(_scalar(f), max_size=4)))
        else:
            setattr(msg, f.name, draw(_scalar(f)))


def messages(cls: type[Message]) -> st.SearchStrategy[Message]:
    @st.composite
    def build(draw: Any) -> Message:
        msg = cls()
        _fill(msg, cls.DESCRIPTOR, draw, 0)
        return msg

    return build()


@st.composite
def _mangled(draw: Any, cls: type[Message]) -> bytes:
    data = bytearray(draw(messages(cls)).SerializeToString())
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) if draw(st.booleans()) else bytes(data)


def wire_bytes(cls: type[Message]) -> st.SearchStrategy[bytes]:
    """Bytes a peer could send where a ``cls`` is expected."""
    return messages(cls).map(lambda m: m.SerializeToString()) | _mangled(cls) | st.binary(max_size=256)
