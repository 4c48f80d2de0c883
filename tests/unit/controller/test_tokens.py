"""Join tokens: format, hashing, and every refusal reason."""

from __future__ import annotations

import dataclasses

import pytest

from tether.controller import tokens
from tether.controller.errors import TokenRejected
from tether.nodeagent.secrets import Secret

NOW = 1_000_000


def record(secret_part: str, **overrides: object) -> tokens.TokenRecord:
    base = tokens.TokenRecord(
        id="abc123",
        secret_hash=tokens.hash_secret(secret_part),
        environment="prod",
        role="worker",
        node_name="",
        expires_ms=NOW + 60_000,
        max_uses=1,
        uses=0,
        revoked=False,
        created_ms=NOW - 1,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def test_generated_token_has_id_dot_secret_form_and_parses_back() -> None:
    token_id, token = tokens.generate()
    assert tokens.TOKEN_RE.match(token.reveal())
    assert tokens.parse(token) == (token_id, token.reveal().split(".")[1])


def test_token_secret_is_never_in_repr() -> None:
    _, token = tokens.generate()
    secret_part = token.reveal().split(".")[1]
    assert secret_part not in repr(token) and secret_part not in str(token) and secret_part not in f"{token}"


def test_only_the_hash_is_stored_and_it_does_not_contain_the_secret() -> None:
    _, token = tokens.generate()
    secret_part = token.reveal().split(".")[1]
    digest = tokens.hash_secret(secret_part)
    assert secret_part not in digest and len(digest) == 64


@pytest.mark.parametrize("bad", ["", "abc", "abc123.short", "ABC123." + "a" * 32, "abc123-" + "a" * 32])
def test_malformed_tokens_are_refused(bad: str) -> None:
    with pytest.raises(TokenRejected) as exc:
        tokens.parse(Secret(bad))
    assert exc.value.reason == "invalid"


def test_valid_token_passes() -> None:
    tokens.check(record("s" * 32), "s" * 32, now_ms=NOW, node_name="n1")


@pytest.mark.parametrize(
    ("overrides", "kwargs", "reason", "words"),
    [
        ({}, {"secret": "x" * 32}, "invalid", "invalid"),
        ({"revoked": True}, {}, "revoked", "revoked"),
        ({"expires_ms": NOW}, {}, "expired", "expired"),
        ({"uses": 1}, {}, "used", "already used"),
        ({"node_name": "other"}, {}, "scope", "scoped to node"),
        ({}, {"expect_environment": "dev"}, "scope", "scoped to environment"),
        ({}, {"expect_role": "control-plane"}, "scope", "scoped to role"),
    ],
)
def test_each_refusal_says_which(
    overrides: dict[str, object], kwargs: dict[str, str], reason: str, words: str
) -> None:
    secret = kwargs.pop("secret", "s" * 32)
    with pytest.raises(TokenRejected) as exc:
        tokens.check(record("s" * 32, **overrides), secret, now_ms=NOW, node_name="n1", **kwargs)
    assert exc.value.reason == reason
    assert words in str(exc.value)


def test_wrong_secret_reveals_nothing_about_the_token_state() -> None:
    # Revoked and expired, but the caller does not know the secret: only "invalid".
    rec = record("s" * 32, revoked=True, expires_ms=0)
    with pytest.raises(TokenRejected) as exc:
        tokens.check(rec, "t" * 32, now_ms=NOW, node_name="n1")
    assert exc.value.reason == "invalid"


def test_unknown_token_is_invalid() -> None:
    with pytest.raises(TokenRejected) as exc:
        tokens.check(None, "s" * 32, now_ms=NOW, node_name="n1")
    assert exc.value.reason == "invalid"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), ("30", 30)]
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert tokens.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "0", "1w", "-5m", "m"])
def test_parse_duration_refuses_nonsense(bad: str) -> None:
    with pytest.raises(ValueError):
        tokens.parse_duration(bad)
