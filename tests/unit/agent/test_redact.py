"""Redaction of a job's tokens from its log, in every form the job might print them, split
at every byte boundary across two writes, and across two lines."""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from gpufleet.agent.redact import REPLACEMENT, Redactor

TOKEN = "gfm_7QkZ0aYvX3bT9pLmN2cR5sW8dF1gH4jK6e_Ab12Cd"
OTHER = "gfv_Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8Nn7Mm6"


def run(redactor: Redactor, *writes: bytes) -> bytes:
    return b"".join(redactor.feed(w) for w in writes) + redactor.flush()


def encoded_forms(token: str) -> dict[str, bytes]:
    raw = token.encode()
    forms = {
        "raw": raw,
        "percent-all": "".join(f"%{b:02X}" for b in raw).encode(),
        "percent-lower": "".join(f"%{b:02x}" for b in raw).encode(),
        "percent-quote": urllib.parse.quote(token, safe="").encode(),
        "json-escaped": json.dumps(token).encode(),
        "json-unicode": ("".join(f"\\u{b:04x}" for b in raw)).encode(),
        "json-unicode-upper": ("".join(f"\\u{b:04X}" for b in raw)).encode(),
        "hex": raw.hex().encode(),
        "hex-upper": raw.hex().upper().encode(),
    }
    for k in range(3):
        for name, enc in (("std", base64.b64encode), ("url", base64.urlsafe_b64encode)):
            blob = enc(b"xyz"[:k] + raw + b"tail")
            forms[f"b64-{name}-offset{k}"] = blob
            forms[f"b64-{name}-offset{k}-unpadded"] = blob.rstrip(b"=")
    forms["b64-alone"] = base64.b64encode(raw)
    return forms


FORMS = encoded_forms(TOKEN)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_is_redacted(form: str) -> None:
    line = b"calling the model with " + FORMS[form] + b" now\n"
    out = run(Redactor([TOKEN, OTHER]), line)
    assert REPLACEMENT in out, out
    assert out.startswith(b"calling the model with ") and out.endswith(b" now\n")
    for leak in FORMS.values():
        core = leak[8:-8] if len(leak) > 24 else leak
        assert core not in out


@pytest.mark.parametrize("form", ["raw", "hex", "b64-std-offset1", "percent-all", "json-unicode"])
def test_a_token_split_at_every_byte_boundary_across_two_writes(form: str) -> None:
    text = b"before " + FORMS[form] + b" after\n"
    start = len(b"before ")
    for cut in range(start, start + len(FORMS[form]) + 1):
        out = run(Redactor([TOKEN]), text[:cut], text[cut:])
        assert out == b"before " + REPLACEMENT + b" after\n" or (
            form.startswith("b64") and REPLACEMENT in out and TOKEN.encode() not in out
        ), (cut, out)


def test_a_token_split_across_two_lines_is_redacted() -> None:
    raw = TOKEN.encode()
    for cut in range(1, len(raw)):
        out = run(Redactor([TOKEN]), raw[:cut] + b"\n" + raw[cut:] + b"\n")
        assert out == REPLACEMENT + b"\n", cut
    wrapped = base64.encodebytes(b"payload:" + raw * 2)  # MIME base64: lines of 76
    assert REPLACEMENT in run(Redactor([TOKEN]), wrapped)


def test_one_byte_writes_and_both_tokens() -> None:
    text = f"model={TOKEN} voice={OTHER}\n".encode()
    redactor = Redactor([TOKEN, OTHER])
    out = b"".join(redactor.feed(text[i : i + 1]) for i in range(len(text))) + redactor.flush()
    assert out == b"model=" + REPLACEMENT + b" voice=" + REPLACEMENT + b"\n"


def test_ordinary_output_passes_untouched_and_without_tokens_nothing_is_held() -> None:
    text = b"rendering: 10%\nrendering: 20%\n" * 100
    assert run(Redactor([TOKEN]), text) == text
    plain = Redactor([])
    assert plain.feed(b"abc") == b"abc" and plain.flush() == b""


def test_a_prefix_of_the_token_is_not_redacted() -> None:
    text = TOKEN[:20].encode() + b"\n"
    assert run(Redactor([TOKEN]), text) == text
