"""Error answers that BentoML (or Starlette under it) writes itself, in the project's error shape.

Every error this project raises is answered by ``common.errors.send_error`` and marked as such
(``ANSWER_MARK`` on the ASGI message); a guard passes those on untouched. What else reaches it is
BentoML's own: its router's 404 and 405 (``Not Found``, ``Method Not Allowed`` as plain text), a
mounted Starlette app's, an unhandled exception's 500, a JSON ``{"error": ...}`` of its
dispatch. ``ErrorsInOneShape`` rewrites those into an ``ApiError`` of the same status (the text
kept as the message, ``Retry-After`` kept, and a 503 without one given one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from common.errors import ANSWER_MARK, MAX_MESSAGE_CHARS, ApiError, send_error

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


def foreign_message(body: bytes, status: int) -> str:
    """The text of a body BentoML wrote: its ``{"error": ...}``, or the plain text."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
    else:
        while isinstance(doc, list) and len(doc) == 1:
            doc = doc[0]
        text = (
            doc["error"] if isinstance(doc, dict) and isinstance(doc.get("error"), str) else orjson.dumps(doc).decode()
        )
    return text[:MAX_MESSAGE_CHARS] or f"HTTP {status}"


def in_one_shape(send: Send) -> Send:
    """``send`` for an ASGI app whose error answers may be BentoML's: those go out as ApiErrors."""
    start: Message | None = None
    body = b""

    async def translating_send(message: Message) -> None:
        nonlocal start, body
        if message["type"] == "http.response.start":
            if message.get("status", 200) >= 400 and not message.get(ANSWER_MARK):
                start = message
                return
        elif start is not None and message["type"] == "http.response.body":
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            status = int(start["status"])
            headers = {
                k.decode("latin-1").title(): v.decode("latin-1")
                for k, v in start.get("headers", ())
                if k.lower() in (b"retry-after", b"allow")
            }
            if status == 503:
                headers.setdefault("Retry-After", "1")
            return await send_error(send, ApiError(status, foreign_message(body, status), headers))
        await send(message)

    return translating_send
