"""common.request_headers: one reading of the headers that decide what a body is and who sends it."""

from __future__ import annotations

import pytest

from common.errors import ApiError
from common.request_headers import JSON, OCTET_STREAM, SINGLE_VALUED, RequestHeaders, with_body_type

PICKLE = "application/vnd.bentoml+pickle"


def raw(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode(), v.encode()) for k, v in pairs]


@pytest.mark.parametrize("name", SINGLE_VALUED)
def test_any_single_valued_header_sent_twice_is_refused_naming_it(name):
    for values in (("a", "b"), ("same", "same")):
        with pytest.raises(ApiError) as info:
            RequestHeaders(raw((name.upper(), values[0]), ("x-other", "1"), (name, values[1])))
        assert info.value.status == 400
        assert "sent 2 times; send it once" in info.value.message
        assert info.value.message.split()[1].lower() == name


def test_other_headers_may_repeat_and_single_ones_are_read_once():
    headers = RequestHeaders(raw(("Cookie", "a"), ("cookie", "b"), ("Content-Type", "Application/JSON; charset=utf-8")))
    assert headers.media_type == JSON and headers.get("cookie") is None and "content-type" in headers


@pytest.mark.parametrize(
    "value",
    [
        PICKLE,
        "Application/VND.BentoML+Pickle",
        f"{JSON}, {PICKLE}",
        f"{PICKLE};a=b",
        "",
        "multipart/form-data; boundary=x",
    ],
)
def test_a_body_of_another_media_type_is_refused_with_415(value):
    headers = RequestHeaders(raw(("content-type", value)) if value else [])
    with pytest.raises(ApiError) as info:
        headers.body_type((JSON, OCTET_STREAM))
    assert info.value.status == 415 and "send application/json or application/octet-stream" in info.value.message


@pytest.mark.parametrize("encoding, ok", [("gzip", False), ("br", False), ("identity", True), ("", True)])
def test_an_encoded_body_is_refused(encoding, ok):
    headers = RequestHeaders(raw(("content-type", OCTET_STREAM), ("content-encoding", encoding)))
    if ok:
        assert headers.body_type((OCTET_STREAM,)) == OCTET_STREAM
    else:
        with pytest.raises(ApiError, match="content encoding") as info:
            headers.body_type((OCTET_STREAM,))
        assert info.value.status == 415


@pytest.mark.parametrize(
    "accept, answer, ok",
    [
        (None, JSON, True),
        ("*/*", OCTET_STREAM, True),
        ("application/*", JSON, True),
        (JSON, JSON, True),
        ("text/html, application/json;q=0.5", JSON, True),
        (JSON, OCTET_STREAM, False),
        (PICKLE, JSON, False),
        ("application/json;q=0", JSON, False),
        ("*/*;q=0.0", JSON, False),
        ("application/json;q=x", JSON, False),
    ],
)
def test_an_accept_that_excludes_the_answer_is_refused_with_406(accept, answer, ok):
    headers = RequestHeaders(raw(("accept", accept)) if accept else [])
    if ok:
        headers.check_accept(answer)
    else:
        with pytest.raises(ApiError) as info:
            headers.check_accept(answer)
        assert info.value.status == 406 and answer in info.value.message


def test_what_passes_the_guard_carries_one_canonical_content_type():
    scope = {
        "type": "http",
        "headers": raw(
            ("Content-Type", "Application/JSON; charset=utf-8"),
            ("content-encoding", "identity"),
            ("x-request-id", "r1"),
        ),
    }
    out = with_body_type(scope, JSON)
    assert out["headers"] == raw(("x-request-id", "r1"), ("content-type", JSON))
    assert scope["headers"][0] == (b"Content-Type", b"Application/JSON; charset=utf-8")  # the original is kept
