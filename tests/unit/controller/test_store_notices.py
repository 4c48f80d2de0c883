"""The notices between replicas (``tether.controller.store.pgsync``) are signed with a key derived
from --store-key-file's: any database role may NOTIFY on the channel, and what it sends unsigned,
signed with another key, or sent again, is dropped (logged at most once a minute, without its
text). tests/integration/test_store_postgres.py sends them through a real PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from structlog.testing import capture_logs

from tether.controller.replicas import intents
from tether.controller.replicas.delivery import TOPIC
from tether.controller.store import pgsync
from tether.controller.store.pgsync import Sender, Sync, decode, encode, mac_key
from tether.controller.store.pgview import View
from tether.controller.store.records import StoreChange
from tether.nodeagent.model import now_ms

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


def sync(key: bytes = KEY) -> Sync:
    changes: list[StoreChange] = []
    pool: Any = None  # (never used by _accept)
    return Sync("postgresql://unused", Sender("me" * 16, mac_key(key)), pool, View(), changes.append)


def test_a_signed_notice_decodes_and_any_other_does_not() -> None:
    sender = Sender(uuid.uuid4().hex, mac_key(KEY))
    text = encode(sender, "message", "topic", 7, "payload ünï\ncode")
    notice = decode(text, mac_key(KEY))
    assert notice is not None
    assert (notice.replica, notice.kind, notice.key, notice.seq) == (sender.replica, "message", "topic", 7)
    assert notice.payload == "payload ünï\ncode" and abs(notice.sent_ms - now_ms()) < 5000
    assert decode(text, mac_key(OTHER)) is None  # another store's key
    assert decode(text.replace("payload", "PAYLOAD"), mac_key(KEY)) is None  # changed on the way
    assert decode(f"{sender.replica} message 7 5\ntopicpayload", mac_key(KEY)) is None  # unsigned
    assert decode("", mac_key(KEY)) is None and decode("é" * 40, mac_key(KEY)) is None
    assert mac_key(KEY) != KEY and len(mac_key(KEY)) == 32  # the store key itself never signs


def test_a_whole_notice_of_packed_intents_stays_within_4000_bytes() -> None:
    many = [intents.refresh(f"node-{i:05d}-" + "x" * 40, "environment-" + "e" * 40, True) for i in range(400)]
    sender = Sender(uuid.uuid4().hex, mac_key(KEY))
    for payload in intents.pack(many):
        text = encode(sender, "message", TOPIC, 10**12, payload)
        assert len(text.encode()) <= 4000
        assert decode(text, mac_key(KEY)) is not None


def test_the_listener_drops_unsigned_foreign_and_replayed_notices_and_says_so_once_a_minute() -> None:
    s = sync()
    other = Sender("other" * 6 + "aa", mac_key(KEY))
    good = encode(other, "message", TOPIC, 1, "[]")
    with capture_logs() as logs:
        assert s._accept(f"{other.replica} message 1 8\ndelivery[]", 11) is None  # unsigned
        assert s._accept(encode(Sender(other.replica, mac_key(OTHER)), "kv", "k"), 12) is None
        assert s._accept(good, 13) is not None
        assert s._accept(good, 14) is None  # the same message sent again (captured by a listener)
        assert s._accept(encode(other, "kv", "k"), 15) is not None  # data notices: a re-read at most
        assert s._accept(encode(Sender(s._replica, mac_key(KEY)), "kv", "k"), 16) is None  # own
    assert s.refused == 3
    assert len(logs) == 1 and logs[0]["log_level"] == "warning" and logs[0]["sender_pid"] == 11
    assert "delivery[]" not in repr(logs) and good not in repr(logs)


def test_a_message_notice_over_a_minute_old_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    s = sync()
    other = Sender("b" * 32, mac_key(KEY))
    monkeypatch.setattr(pgsync, "now_ms", lambda: now_ms() - pgsync.MESSAGE_WINDOW_MS - 1000)
    old = encode(other, "message", TOPIC, 1, "[]")
    monkeypatch.undo()
    assert s._accept(old, 1) is None and s.refused == 1
    assert s._accept(encode(other, "message", TOPIC, 2, "[]"), 1) is not None
