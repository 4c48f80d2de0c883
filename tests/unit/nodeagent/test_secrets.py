"""Secret masking and output redaction."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import pytest

from tether.nodeagent.secrets import MASK, Redactor, Secret


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
    out = r.redact(line)
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

    from tether.nodeagent import logs
    from tether.nodeagent.secrets import PROCESS_REDACTOR

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


# -- issue 10, item 10: redaction gaps ----------------------------------------------------------

TOKEN_ID, TOKEN_SECRET = "k7q2zp", "c4n4ryc4n4ryc4n4ryc4n4ryc4n4ry01"  # a tether join token canary
TOKEN = f"{TOKEN_ID}.{TOKEN_SECRET}"


def leaked(text: str, secret: str = TOKEN_SECRET, piece: int = 5) -> list[str]:
    """Every ``piece``-long slice of ``secret`` found in ``text``."""
    return [secret[i : i + piece] for i in range(len(secret) - piece + 1) if secret[i : i + piece] in text]


@pytest.mark.parametrize("shift", range(-40, 2))
def test_a_secret_at_the_cut_is_masked_whole_never_by_halves(shift: int) -> None:
    from tether.nodeagent.limits import MAX_LINE_BYTES as MAX_LINE

    line = "x" * (MAX_LINE + shift) + " " + TOKEN + " tail"
    for r in (Redactor([TOKEN]), Redactor()):  # known, and only its shape
        out, cut = r.redact_cut(line, MAX_LINE)
        assert cut and len(out) <= MAX_LINE + len(MASK)
        assert not leaked(out) and f"{TOKEN_ID}." not in out, out[-60:]


async def _output_of(tmp_path: Path, pad_char: str) -> list[str]:
    """The runner's output for a line of padding whose cut falls 9 characters into the secret."""
    from tether.nodeagent.limits import MAX_LINE_BYTES
    from tether.nodeagent.model import Step
    from tether.nodeagent.runner import Runner

    lines: list[str] = []

    async def sink(batch: list[str]) -> None:
        lines.extend(batch)

    pad = MAX_LINE_BYTES - len(TOKEN_ID) - 10
    script = f"printf '{pad_char}%.0s' $(seq 1 {pad}); echo {TOKEN}; echo after\n"
    runner = Runner(tmp_path / "scripts", Redactor([TOKEN]), batch_interval=0.05)
    assert (await runner.run(Step(name="s", script=script).sealed(), sink)).ok
    return lines


async def test_the_runner_redacts_a_long_line_before_cutting_it(tmp_path: Path) -> None:
    lines = await _output_of(tmp_path, "x")
    assert len(lines) == 2 and lines[1] == "after"
    assert MASK in lines[0] and not leaked(lines[0])


async def test_a_long_line_is_masked_then_cut_once_in_bytes(tmp_path: Path) -> None:
    from tether.nodeagent.limits import MAX_LINE_BYTES

    lines = await _output_of(tmp_path, "é")
    assert len(lines[0].encode()) <= MAX_LINE_BYTES and not leaked(lines[0])
    assert lines[0].count("[tether: line cut") == 1 and "truncated" not in lines[0]


def test_flags_carrying_secrets_are_masked_with_equals_as_with_a_space() -> None:
    key = "f00dcafe" * 8
    r = Redactor()
    for line in (
        f"kubeadm join --certificate-key={key} --control-plane",
        f"kubeadm join --certificate-key {key}",
        f"kubeadm join --token={TOKEN}",
        f"kubeadm join --token='{TOKEN}'",
        f"kubeadm join --discovery-token={TOKEN} --tls-bootstrap-token {TOKEN}",
        f"[upload-certs] Using certificate key: {key}",
    ):
        out = r.redact(line)
        assert key not in out and not leaked(out) and not leaked(out, key), out
    assert r.redact("--token-file /etc/tether/join-token") == "--token-file /etc/tether/join-token"


def test_token_id_prefixed_forms_are_masked_even_unknown() -> None:
    r = Redactor()
    for line in (
        f"token {TOKEN}XYZ",  # glued to more text
        f"token={TOKEN}_suffix",
        f"bootstrap token {TOKEN_ID}.0123456789abcdef!",
    ):
        out = r.redact(line)
        assert not leaked(out) and not leaked(out, "0123456789abcdef"), out


def test_a_secret_split_across_two_lines_is_masked_on_both() -> None:
    from tether.nodeagent.secrets import LineRedactor

    key = "0badc0de" * 8
    lr = LineRedactor(Redactor())
    out = [
        lr.redact(line)[0]
        for line in (
            f"kubeadm join 10.0.0.1:6443 --token {TOKEN_ID}.",
            "0123456789abcdef --discovery-token-ca-cert-hash sha256:" + "a" * 64,
            "[upload-certs] Using certificate key:",
            key,
            "--token",
            TOKEN,
            "Setting up system.",
            "done and dusted",
        )
    ]
    text = "\n".join(out)
    assert "0123456789abcdef" not in text and key not in text and not leaked(text)
    assert "sha256:" + "a" * 64 in text  # the CA hash is public
    assert out[-1] == "done and dusted"  # a sentence that ends in a word and a dot masks nothing


async def test_the_runner_masks_a_token_split_across_lines(tmp_path: Path) -> None:
    from tether.nodeagent.model import Step
    from tether.nodeagent.runner import Runner

    lines: list[str] = []

    async def sink(batch: list[str]) -> None:
        lines.extend(batch)

    script = f"echo 'join --token {TOKEN_ID}.'; echo '0123456789abcdef'\n"
    runner = Runner(tmp_path / "scripts", Redactor(), batch_interval=0.05)
    await runner.run(Step(name="s", script=script).sealed(), sink)
    assert lines == [f"join --token {MASK}", MASK]


@pytest.mark.parametrize("before", ["", "a", "ab", "abc", 'kubeconfig: {"token": "'])
def test_base64_of_a_held_secret_is_masked_alone_and_inside_a_longer_encoding(before: str) -> None:
    secret = "hunter2-canary-base64-value"
    r = Redactor([secret])
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(f"{before}{secret}\n".encode()).decode()
        out = r.redact(f"data: {encoded}")
        alone = base64.b64encode(secret.encode()).decode()
        assert MASK in out, out
        for offset in range(3):  # no run of the secret's own encoding is left
            core = base64.b64encode(bytes(offset) + secret.encode()).decode()[4:-4]
            assert core not in out, (offset, out)
        assert alone[:-4] not in out


def test_host_names_and_api_groups_are_not_taken_for_tokens() -> None:
    r = Redactor()
    for line in (
        "GET https://static.cloudflareinsights.com/beacon.min.js",
        "apiVersion: policy.admissionregistration.k8s.io/v1",
        "pulling images.githubusercontent.com/org/image",
    ):
        assert r.redact(line) == line
    assert MASK in r.redact("kubeadm join --discovery-token abcdef.0123456789abcdef")
    assert MASK in r.redact("bootstrap token abcdef.0123456789abcdef used")
