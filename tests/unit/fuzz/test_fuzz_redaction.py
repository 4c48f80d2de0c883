"""The redactor's fast path is sound: text it calls clean is text the full matching leaves alone.

``Redactor.holds_nothing`` skips the shape matching for most output; if it ever said "clean" for
text that a shape (or a known value, or a secret split across two lines) would mask, a secret
would be stored. Text is drawn from the pieces the shapes are made of, so near-misses are common.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.fuzz.pbgen import EXAMPLES, FUZZ
from tether.nodeagent.secrets import LineRedactor, Redactor

KNOWN = "k7x2qa.0123456789abcdefghijklmnopqrstuv"
PIECES = st.sampled_from(
    [
        "abcdef.",
        "0123456789abcdef",
        "0123456789abcdef0123456789abcdef",
        "--token",
        "--certificate-key",
        "=",
        " ",
        "\t",
        "\n",
        ".",
        "-",
        "CERTIFICATE key: ",
        "Certificate_Key",
        "f00dcafe" * 8,
        "k7x2qa.",
        KNOWN[7:],
        "ok",
        "x",
    ]
)
TEXT = st.lists(PIECES, max_size=12).map("".join) | st.text(max_size=60)


@settings(FUZZ, max_examples=max(EXAMPLES, 3000))  # cheap: about 2 s
@given(TEXT)
def test_text_called_clean_is_left_alone_by_the_full_matching(text: str) -> None:
    r = Redactor([KNOWN])
    if not r.holds_nothing(text):
        return
    assert r._spans(text) == []
    lines = LineRedactor(r)
    assert [lines.redact(line)[0] for line in text.split("\n")] == text.split("\n")
