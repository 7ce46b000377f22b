"""A service's endpoints, each defined once: its route, the core method it calls and the codecs of
its body and answer. The serving side (``EndpointRouter``), the callers (``common.remote``), the
OpenAPI document (``openapi_paths``) and the guards' media-type rules all read the same
definition, so the route, the method and the encoding cannot drift apart.

A core method takes the decoded body as its one argument (none for ``NO_BODY``) and returns the
value the answer's codec encodes; it raises ``ApiError`` (``common.errors``) for anything that is
not a result. The router never lets the framework choose a deserialiser from a header: a body is
read by its endpoint's codec and nothing else (docs/reliability.md, "Threat model").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Generic, Protocol, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from common.errors import ApiError, ErrorBody, send_error
from common.request_headers import JSON, OCTET_STREAM

log = logging.getLogger("graphsage.endpoints")

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - the body's type
O = TypeVar("O")  # noqa: E741 - the answer's type
M = TypeVar("M", bound=BaseModel)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

UNEXPECTED = "An unexpected error has occurred, please check the server log."


class Codec(Protocol[T]):
    """How one kind of value travels as bytes."""

    media_type: str

    def encode(self, value: T) -> bytes: ...

    def decode(self, body: bytes) -> T:
        """Raises ``ApiError`` (400) that names what is wrong."""
        ...

    def schema(self) -> dict[str, Any]: ...


class JsonModel(Generic[M]):
    """A pydantic model as JSON; a body that does not validate is a 400 naming each field."""

    media_type = JSON

    def __init__(self, model: type[M]) -> None:
        self.model = model

    def encode(self, value: M) -> bytes:
        return value.__pydantic_serializer__.to_json(value)

    def decode(self, body: bytes) -> M:
        try:
            return self.model.model_validate_json(body or b"{}")
        except ValidationError as exc:
            raise ApiError.invalid(exc) from None

    def schema(self) -> dict[str, Any]:
        return self.model.model_json_schema(ref_template="#/components/schemas/{model}")


class JsonDocument:
    """A JSON object whose shape the endpoint does not fix (reports, status pages)."""

    media_type = JSON

    def __init__(self, description: str = "") -> None:
        self.description = description

    def encode(self, value: Mapping[str, Any]) -> bytes:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)

    def decode(self, body: bytes) -> dict[str, Any]:
        try:
            doc = orjson.loads(body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"invalid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "expected a JSON object")
        return doc

    def schema(self) -> dict[str, Any]:
        return {"type": "object", **({"description": self.description} if self.description else {})}


class NoBody:
    """An endpoint that takes nothing: an empty body or an empty JSON object, decoded as None."""

    media_type = JSON

    def encode(self, value: None) -> bytes:
        return b"{}"

    def decode(self, body: bytes) -> None:
        if body.strip() not in (b"", b"{}"):
            raise ApiError(400, "this endpoint takes no parameters: send {} or nothing")

    def schema(self) -> dict[str, Any]:
        return {"type": "object", "maxProperties": 0}


class Binary(Generic[T]):
    """A value in a binary format of its own (``common.wire``, ``common.feature_tensor``):
    ``encode`` and ``decode`` given; ``decode`` raises ``ApiError``."""

    media_type = OCTET_STREAM

    def __init__(self, encode: Callable[[T], bytes], decode: Callable[[bytes], T], description: str) -> None:
        self._encode, self._decode, self.description = encode, decode, description

    def encode(self, value: T) -> bytes:
        return self._encode(value)

    def decode(self, body: bytes) -> T:
        return self._decode(body)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "binary", "description": self.description}


NO_BODY = NoBody()


@dataclasses.dataclass(frozen=True)
class Endpoint(Generic[I, O]):
    """``method path`` calls the core's ``name`` with the body ``takes`` decodes; ``answers``
    encodes what it returns. ``idempotent``: a caller may send it again after a lost connection."""

    name: str
    path: str
    takes: Codec[I]
    answers: Codec[O]
    summary: str
    method: str = "POST"
    idempotent: bool = True

    async def call(self, core: Any, value: I) -> O:
        """The core's method for this endpoint, on the decoded body."""
        fn = getattr(core, self.name)
        result: O = await (fn() if isinstance(self.takes, NoBody) else fn(value))
        return result


def media_types(endpoints: Iterable[Endpoint[Any, Any]]) -> dict[str, tuple[str, str]]:
    """path -> (the body's media type, the answer's): what the guards hold each request to."""
    return {ep.path: (ep.takes.media_type, ep.answers.media_type) for ep in endpoints}


def as_api_error(exc: BaseException, where: str) -> ApiError:
    """What a failed handler answers: its ``ApiError`` as raised, a validation error as a 400
    that names the fields, anything else a 500 (logged here with its traceback)."""
    if isinstance(exc, ApiError):
        if exc.status >= 500:
            log.warning("%s answered %d (%s): %s", where, exc.status, exc.type, exc.message)
        return exc
    if isinstance(exc, ValidationError):
        return ApiError.invalid(exc)
    log.error("Exception on %s", where, exc_info=exc)
    return ApiError(500, UNEXPECTED)


class EndpointRouter:
    """ASGI middleware: answers every request for one of ``endpoints`` by calling the core
    ``target()`` returns; anything else passes to ``app``. ``server_name``: the ``Server`` header."""

    def __init__(
        self,
        app: App,
        endpoints: Iterable[Endpoint[Any, Any]],
        target: Callable[[], Any],
        server_name: str = "",
        documents: Mapping[str, Callable[[], dict[str, Any]]] | None = None,
    ) -> None:
        """``documents``: GET path -> a JSON document, built on its first request and kept."""
        self.app = app
        self._routes = {(ep.method, ep.path): ep for ep in endpoints}
        self._target = target
        self._server = [(b"server", f"BentoML Service/{server_name}".encode())] if server_name else []
        self._documents = dict(documents or {})
        self._rendered: dict[str, bytes] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method", ""), scope.get("path", "")
        endpoint = self._routes.get((method, path))
        if endpoint is None:
            if method == "GET" and path in self._documents:
                return await self._send(send, JSON, self._document(path))
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        if body is None:
            return  # the client went away
        try:
            answer = endpoint.answers.encode(await endpoint.call(self._target(), endpoint.takes.decode(body)))
        except Exception as exc:
            return await send_error(send, as_api_error(exc, f"{endpoint.path} [{endpoint.method}]"))
        await self._send(send, endpoint.answers.media_type, answer)

    def _document(self, path: str) -> bytes:
        if path not in self._rendered:
            self._rendered[path] = orjson.dumps(self._documents[path]())
        return self._rendered[path]

    async def _send(self, send: Send, media_type: str, answer: bytes) -> None:
        headers = [(b"content-type", media_type.encode()), (b"content-length", b"%d" % len(answer)), *self._server]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


# -- the OpenAPI document ------------------------------------------------------------------------


def openapi_paths(
    endpoints: Iterable[Endpoint[Any, Any]], tag: str, errors: Mapping[int, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, component schemas) of ``endpoints``: each operation's body and answer from its
    codecs, and every error status of ``errors`` (status -> when) answered with ``ErrorBody``."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {"ErrorBody": ErrorBody.model_json_schema()}
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}

    def content(codec: Codec[Any]) -> dict[str, Any]:
        schema = codec.schema()
        schemas.update(schema.pop("$defs", {}))
        if isinstance(codec, JsonModel):
            schemas[codec.model.__name__] = schema
            schema = {"$ref": f"#/components/schemas/{codec.model.__name__}"}
        return {codec.media_type: {"schema": schema}}

    for ep in endpoints:
        operation: dict[str, Any] = {
            "tags": [tag],
            "operationId": f"{tag}__{ep.name}",
            "summary": ep.summary,
            "responses": {
                "200": {"description": "Successful Response", "content": content(ep.answers)},
                **{
                    str(status): {"description": when, "content": {JSON: {"schema": error_ref}}}
                    for status, when in sorted(errors.items())
                },
            },
        }
        if ep.method != "GET" and ep.takes is not NO_BODY:
            operation["requestBody"] = {"required": True, "content": content(ep.takes)}
        paths.setdefault(ep.path, {})[ep.method.lower()] = operation
    return paths, schemas


def openapi_document(title: str, endpoints: Iterable[Endpoint[Any, Any]], errors: Mapping[int, str]) -> dict[str, Any]:
    """A whole OpenAPI 3.1 document of ``endpoints`` (a runner's: BentoML documents only the
    bento's main service)."""
    paths, schemas = openapi_paths(endpoints, title, errors)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
