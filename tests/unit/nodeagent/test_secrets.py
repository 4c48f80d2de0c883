"""Secret masking and output redaction."""

from __future__ import annotations

import pickle

import pytest

from nodeagent.runner import redact_line
from nodeagent.secrets import MASK, Redactor, Secret


def test_secret_never_prints_its_value() -> None:
    s = Secret("hunter2-canary")
    for text in (repr(s), str(s), f"{s}", f"{s!r}", "%s" % s, "{}".format(s)):  # noqa: UP031, UP032
        assert "hunter2" not in text
    assert s.reveal() == "hunter2-canary"


def test_secret_refuses_pickling() -> None:
    with pytest.raises(TypeError):
        pickle.dumps(Secret("abc"))


def test_redactor_masks_every_occurrence_and_token_halves() -> None:
    r = Redactor(["abcdef.0123456789abcdefghijklmnopqrstuv"])
    line = "join with abcdef.0123456789abcdefghijklmnopqrstuv or just 0123456789abcdefghijklmnopqrstuv"
    out = r.redact(line)
    assert "0123456789abcdefghijklmnopqrstuv" not in out
    assert out.count(MASK) == 2


def test_redactor_ignores_values_too_short_to_be_secrets() -> None:
    r = Redactor(["ab"])
    assert r.redact("about") == "about"


def test_redactor_prefers_longest_match() -> None:
    r = Redactor(["secretvalue", "secretvalue-extended"])
    assert r.redact("x secretvalue-extended y") == f"x {MASK} y"


def test_known_secret_shapes_are_masked_even_unknown() -> None:
    r = Redactor()
    line = (
        "kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:"
        + "a" * 64
        + " --control-plane --certificate-key "
        + "b" * 64
    )
    out = redact_line(line, r)
    assert "abcdef.0123456789abcdef" not in out
    assert "b" * 64 not in out
    assert "sha256:" + "a" * 64 in out  # the CA hash is public


def test_discard_forgets_a_value_added_for_one_call_only() -> None:
    r = Redactor()
    r.add("password-of-call-one")
    r.add("shared-secret-value")
    r.add("shared-secret-value")  # a second holder
    r.discard("password-of-call-one", "shared-secret-value")
    assert r.redact("password-of-call-one") == "password-of-call-one"
    assert r.redact("shared-secret-value") == MASK  # still held once
    r.discard("shared-secret-value")
    assert r.redact("shared-secret-value") == "shared-secret-value"
    r.discard("never-added-value")
    assert len(r) == 0


def test_third_party_tracebacks_are_masked_too() -> None:
    import io
    import logging

    from nodeagent import logs
    from nodeagent.secrets import PROCESS_REDACTOR

    stream = io.StringIO()
    logs.configure("info", stream=stream, json=True)
    PROCESS_REDACTOR.add("traceback-canary-7731")
    try:
        raise RuntimeError("failed with traceback-canary-7731")
    except RuntimeError:
        logging.getLogger("grpc.some.lib").exception("library error")
    PROCESS_REDACTOR.discard("traceback-canary-7731")
    out = stream.getvalue()
    assert "RuntimeError" in out and "traceback-canary-7731" not in out
