"""What an internal hop costs the caller and the runner (prints numbers, never asserts).

    python bench/bench_internal_hops.py [--calls 2000] [--rounds 4] [--concurrency 32]
        [--sizes 11264:11264,70656:256] [--server uvicorn|bentoml] [--loop uvloop|asyncio]
        [--guard-iters 50000]

1. Client cost. A separate process answers ``POST /infer`` with the first N bytes of the body (N in
   its first 4 bytes: an echo of 11 KB by default, and the FeatureRunner -> model runner hop of a
   single-node request, a ~69 KB float16 FeatureTensor answered with 256 B) and ``POST /load``
   with JSON, one free loopback port per side (``harness.ports.free_port``). ``--server uvicorn``
   (default): a minimal ASGI app on uvicorn (uvloop + httptools, as in a BentoML worker), the
   guarded sides' ports behind ``common.service_auth.ServiceGuard``. ``--server bentoml``: a
   BentoML service with the model runner's ``infer`` signature started with ``start-http-server``,
   with the runners' service options and middleware (``ServiceGuard`` on the guarded one,
   ``EndpointRouter`` for /infer), one bare and one guarded. In this process, one event loop (uvloop,
   as a worker's), each side makes the call sequentially (c=1) and from ``--concurrency``
   concurrent callers:

       HttpTransport        common.remote.HttpTransport.call(INFER-like endpoint, body): this project's client
       bentoml proxy        the ``bentoml.depends`` proxy as the code before 09dc346 called it:
                            ``RemoteProxy(url, service=...).to_async.infer(body)``, a raw-body
                            call, with the ``runner_connection`` limits that code raised
       raw aiohttp          ``ClientSession().post(url, data=body, headers={Content-Type})``
       HttpTransport +guard HttpTransport against a server behind ServiceGuard (the token sent)

   Per side: mean, P50, P99, P99.9 latency per call, the client's CPU per call
   (``time.process_time`` over the timed loop: the server's CPU is in another process) and calls
   per second. The sides take turns in rounds (A B C D, D C B A, ...) so they meet the same
   background load, after a warm-up. With the uvicorn server, then, per side: the request
   headers the server received, how many connections all the calls used, and TCP_NODELAY on
   the client's pooled sockets.

2. Guard cost. In-process: a minimal ASGI app called directly with a scope (the headers
   HttpTransport sends), receive and send, bare and behind ``ServiceGuard`` (and the parts of its
   work alone), ``--guard-iters`` calls each, microseconds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, ClassVar

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.bento.launch import START_HTTP_SERVER
from harness.ports import HOST, free_port

TOKEN = "x" * 24
OCTET = "application/octet-stream"
JSON = "application/json"
# 11 KB echo; 276 float16 rows of 128 (fanout 25,10 of one node) + index, answered with 256 B
SIZES = "11264:11264,70656:256"
# The servers' keep-alive. BentoML leaves uvicorn's 5 s, but in rounds A B C D, D C B A the end
# sides wait up to 6 runs between their turns and the middle ones 4: at 5 s the server closes the
# end sides' idle connections (more reconnects for them alone, 64 connections against 32).
KEEP_ALIVE_S = 60


# -- the server (its own process) ---------------------------------------------------------------


def server_app() -> Callable[..., Awaitable[None]]:
    """``/infer`` echoes the body, ``/load`` answers JSON, ``/stats`` says what was received."""
    import orjson

    from bench.suite.one_process import read_body

    seen_clients: set[tuple[str, int]] = set()
    last_headers: list[tuple[bytes, bytes]] = []
    requests = [0]
    load_answer = orjson.dumps({"tag": "graphsage:1", "input_layouts": ["full"], "backend": "onnx"})

    async def app(scope: Any, receive: Any, send: Any) -> None:
        path = scope["path"]
        if path == "/stats":
            answer = orjson.dumps(
                {
                    "connections": len(seen_clients),
                    "requests": requests[0],
                    "headers": [(k.decode(), v.decode()) for k, v in last_headers],
                }
            )
            media = JSON
        else:
            body = await read_body(receive)
            requests[0] += 1
            seen_clients.add(tuple(scope["client"]))
            last_headers[:] = scope["headers"]
            if path == "/infer":  # the body's first 4 bytes: how much of it to answer
                answer, media = body[: int.from_bytes(body[:4], "little")], OCTET
            elif path == "/load":
                answer, media = load_answer, JSON
            else:
                answer, media = b'{"error":"not found"}', JSON
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", media.encode()), (b"content-length", b"%d" % len(answer))],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


def serve(spec: str) -> None:
    """``spec``: ``PORT:GUARDED,...``; each port its own app (its own /stats), the guarded ones
    behind ``ServiceGuard``."""
    import uvicorn

    from common.service_auth import ServiceGuard, ServiceTokens

    apps: dict[int, tuple[Any, Any]] = {}
    for item in spec.split(","):
        port, guarded = (int(v) for v in item.split(":"))
        bare = server_app()
        apps[port] = (bare, ServiceGuard(bare, ServiceTokens([TOKEN])) if guarded else bare)

    async def app(scope: Any, receive: Any, send: Any) -> None:  # one process, one port per side
        if scope["type"] != "http":
            return
        bare, front = apps[scope["server"][1]]
        return await (bare if scope["path"] == "/stats" else front)(scope, receive, send)

    sockets = []
    for port in apps:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
        sockets.append(sock)
    # As a BentoML worker runs uvicorn: uvloop and httptools when installed, no server header.
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run(sockets=sockets)


class Server:
    """The server process, one loopback port per side."""

    def __init__(self, sides: list[Side]) -> None:
        self.ports = {side.name: free_port() for side in sides}
        spec = ",".join(f"{self.ports[side.name]}:{int(side.guarded)}" for side in sides)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", spec])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited ({self.proc.returncode})")
            try:
                for port in self.ports.values():
                    socket.create_connection((HOST, port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise SystemExit("the server did not start in 30 s")

    def url(self, side: Side) -> str:
        return f"http://{HOST}:{self.ports[side.name]}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class BentoServers:
    """``--server bentoml``: the echo as a real BentoML service (``start-http-server``, one process
    tree each), one bare and one behind ``ServiceGuard``; each side calls the one it needs."""

    START: ClassVar[list[str]] = [
        *START_HTTP_SERVER,
        "bench.bench_internal_hops:EchoRunner",
        "--service-name",
        "EchoRunner",
        "--host",
        HOST,
    ]

    def __init__(self, sides: list[Side]) -> None:
        import tempfile

        import httpx

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.home = tempfile.mkdtemp(prefix="gsage-ihops-home-")
        self.ports = {guarded: free_port() for guarded in sorted({side.guarded for side in sides})}
        self.procs = []
        for guarded, port in self.ports.items():
            env = {
                **os.environ,
                "BENTOML_HOME": self.home,
                "BENTOML_DO_NOT_TRACK": "true",
                "TMPDIR": self.home,
                "BENCH_IHOPS_GUARD": str(int(guarded)),
            }  # its temporary files go with it
            cmd = [*self.START, "--port", str(port), "--timeout-keep-alive", str(KEEP_ALIVE_S)]
            self.procs.append(
                subprocess.Popen(
                    cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
            )
        deadline = time.monotonic() + 90
        waiting = dict(self.ports)
        while waiting and time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                self.stop()
                raise SystemExit("a BentoML echo service exited at start")
            for guarded, port in list(waiting.items()):
                try:
                    if httpx.get(f"http://{HOST}:{port}/readyz", timeout=1.0).status_code == 200:
                        del waiting[guarded]
                except httpx.HTTPError:
                    pass
            time.sleep(0.3)
        if waiting:
            self.stop()
            raise SystemExit("the BentoML echo services were not ready in 90 s")

    def url(self, side: Side) -> str:
        return f"http://{HOST}:{self.ports[side.guarded]}"

    def stop(self) -> None:
        import shutil

        import psutil

        trees = []
        for p in self.procs:  # the arbiter and its workers (which run in sessions of their own)
            try:
                root = psutil.Process(p.pid)
                trees.append((root, root.children(recursive=True)))
            except psutil.NoSuchProcess:
                pass
        for root, _ in trees:  # the arbiter first: it stops its workers, which then clean up
            try:
                root.terminate()
            except psutil.NoSuchProcess:
                pass
        everyone = [proc for root, children in trees for proc in (root, *children)]
        _, alive = psutil.wait_procs(everyone, timeout=15)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        shutil.rmtree(self.home, ignore_errors=True)


# -- the clients --------------------------------------------------------------------------------

_services: dict[bool, Any] = {}


def echo_service(served: bool = False) -> Any:
    """A BentoML service with the model runner's ``infer`` (one positional-only raw body) and
    ``load`` signatures. As the proxy's spec (``served=False``): the ``runner_connection`` limits
    the code before 09dc346 set. Served (``--server bentoml``): the runners' service options,
    BentoML's traffic patches, ``ServiceGuard`` when ``BENCH_IHOPS_GUARD=1`` and ``EndpointRouter`` for
    ``/infer``, added as runners/graphsage/service.py adds them."""
    if served in _services:
        return _services[served]
    import bentoml
    from bentoml.validators import ContentType

    global BinaryBody  # the annotations below are strings, resolved in this module's globals
    BinaryBody = Annotated[bytes, ContentType(OCTET)]
    if served:
        from common.bento import traffic
        from common.bento.config import runner_service_config
        from common.settings import load_settings

        traffic.install()
        options = runner_service_config(load_settings().serving, 1)
    else:
        options = {"runner_connection": {"max_requests": 1_000_000_000, "max_age": 1e9}}

    @bentoml.service(name="EchoRunner", **options)
    class EchoRunner:
        @bentoml.api
        async def infer(self, request: BinaryBody, /) -> BinaryBody:  # served by the EndpointRouter below
            return request[: int.from_bytes(request[:4], "little")]

        @bentoml.api
        async def load(self, tag: str) -> dict:
            return {"tag": tag, "input_layouts": ["full"]}

    if served:
        from common.endpoints import EndpointRouter
        from common.service_auth import ServiceGuard, ServiceTokens

        class EchoCore:
            async def infer(self, body: bytes) -> bytes:
                return body[: int.from_bytes(body[:4], "little")]

        core = EchoCore()
        if os.environ.get("BENCH_IHOPS_GUARD") == "1":
            EchoRunner.add_asgi_middleware(ServiceGuard, tokens=ServiceTokens([TOKEN]))
        EchoRunner.add_asgi_middleware(
            EndpointRouter, endpoints=[echo_endpoint()], target=lambda: core, server_name="EchoRunner"
        )
    _services[served] = EchoRunner
    return EchoRunner


def echo_endpoint() -> Any:
    """``POST /infer``: raw bytes in and out (the model runner's hop, without its codecs' work)."""
    from common.endpoints import Binary, Endpoint

    raw = Binary(bytes, bytes, "raw bytes")
    return Endpoint("infer", "/infer", raw, raw, "echo the first N bytes")


def __getattr__(name: str) -> Any:
    """``start-http-server bench.bench_internal_hops:EchoRunner`` (``--server bentoml``)."""
    if name == "EchoRunner":
        return echo_service(served=True)
    raise AttributeError(name)


class Side:
    """One client under test: ``call()`` makes one /infer call and returns the answer's bytes."""

    name: str = ""
    guarded: bool = False

    async def open(self, url: str) -> None: ...

    async def call(self, body: bytes) -> bytes: ...

    def sockets(self) -> list[socket.socket]:
        return []

    async def close(self) -> None: ...


def _aiohttp_sockets(session: Any) -> list[socket.socket]:
    out = []
    for conns in getattr(session.connector, "_conns", {}).values():
        for proto, *_ in conns:
            if proto.transport is not None and (sock := proto.transport.get_extra_info("socket")) is not None:
                out.append(sock)
    return out


class TransportSide(Side):
    def __init__(self, guarded: bool = False) -> None:
        self.name = "HttpTransport" + (" +guard" if guarded else "")
        self.guarded = guarded

    async def open(self, url: str) -> None:
        from common.remote import HttpTransport
        from common.service_auth import ServiceTokens

        self.client = HttpTransport("X", url, ServiceTokens([TOKEN]), retry_pauses_s=(0.0,))
        self.endpoint = echo_endpoint()

    async def call(self, body: bytes) -> bytes:
        answer: bytes = await self.client.call(self.endpoint, body)
        return answer

    def sockets(self) -> list[socket.socket]:
        return _aiohttp_sockets(self.client._session) if self.client._session else []

    async def close(self) -> None:
        await self.client.close()


class ProxySide(Side):
    name = "bentoml proxy"

    async def open(self, url: str) -> None:
        from common.bento.dependencies import bentoml_proxy

        self.proxy = await bentoml_proxy(url, echo_service())
        self.infer = self.proxy.to_async.infer

    async def call(self, body: bytes) -> bytes:
        return await self.infer(body)

    def sockets(self) -> list[socket.socket]:
        session = self.proxy._async._session_manager._session
        return _aiohttp_sockets(session) if session else []

    async def close(self) -> None:
        await self.proxy.close()


class RawSide(Side):
    name = "raw aiohttp"

    async def open(self, url: str) -> None:
        import aiohttp

        self.url = url + "/infer"
        self.session = aiohttp.ClientSession()
        self.headers = {"Content-Type": OCTET}

    async def call(self, body: bytes) -> bytes:
        async with self.session.post(self.url, data=body, headers=self.headers) as resp:
            return await resp.read()

    def sockets(self) -> list[socket.socket]:
        return _aiohttp_sockets(self.session)

    async def close(self) -> None:
        await self.session.close()


# -- timing -------------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.cpu_s = 0.0
        self.wall_s = 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / len(self.latencies) * 1e6

    def line(self, name: str, base: Tally | None) -> str:
        us = np.asarray(self.latencies) * 1e6
        p50, p99, p999 = np.percentile(us, [50, 99, 99.9])
        text = (
            f"  {name:<24} mean {us.mean():7.1f}  p50 {p50:7.1f}  p99 {p99:7.1f}  p99.9 {p999:7.1f} us"
            f"  cpu {self.cpu_us:6.1f} us/call  {len(us) / self.wall_s:6.0f}/s"
        )
        if base is not None and base is not self:
            text += f"  vs proxy: mean {us.mean() - np.mean(base.latencies) * 1e6:+6.1f}, cpu {self.cpu_us - base.cpu_us:+5.1f} us"
        return text


def make_body(request_bytes: int, answer_bytes: int) -> bytes:
    """Random bytes; the first 4 tell the server how many of them to answer."""
    return answer_bytes.to_bytes(4, "little") + os.urandom(max(0, request_bytes - 4))


async def timed(side: Side, body: bytes, answer_bytes: int, calls: int, concurrency: int, tally: Tally) -> None:
    latencies: list[float] = []
    per_caller = max(1, calls // concurrency)

    async def caller() -> None:
        for _ in range(per_caller):
            t = time.perf_counter()
            answer = await side.call(body)
            latencies.append(time.perf_counter() - t)
            if len(answer) != answer_bytes:
                raise SystemExit(f"{side.name}: {len(answer)} bytes answered, {answer_bytes} expected")

    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    if concurrency == 1:
        await caller()
    else:
        await asyncio.gather(*(caller() for _ in range(concurrency)))
    tally.wall_s += time.perf_counter() - wall
    tally.cpu_s += time.process_time() - cpu
    tally.latencies += latencies


async def stats(url: str) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(url + "/stats") as resp:
        return await resp.json()


def parse_sizes(spec: str) -> list[tuple[int, int]]:
    out = []
    for item in filter(None, spec.split(",")):
        request, _, answer = item.partition(":")
        out.append((int(request), int(answer or request)))
    return out


async def client_cost(args: argparse.Namespace, server: Server | BentoServers, sides: list[Side]) -> None:
    for side in sides:
        await side.open(server.url(side))
    for request_bytes, answer_bytes in parse_sizes(args.sizes):
        body = make_body(request_bytes, answer_bytes)
        for side in sides:  # warm-up: connections opened, code paths hot
            await timed(side, body, answer_bytes, max(200, args.calls // 5), args.concurrency, Tally())
        for concurrency in (1, args.concurrency):
            tallies = {side.name: Tally() for side in sides}
            for r in range(args.rounds):
                for side in sides if r % 2 == 0 else reversed(sides):
                    await timed(side, body, answer_bytes, args.calls, concurrency, tallies[side.name])
            print(
                f"\nPOST /infer, {request_bytes} B request, {answer_bytes} B answer, c={concurrency}: "
                f"{args.rounds} rounds x {args.calls} calls per side, {args.loop} client loop"
            )
            base = tallies.get(ProxySide.name)
            for side in sides:
                print(tallies[side.name].line(side.name, base))

    if not isinstance(server, Server):
        for side in sides:
            await side.close()
        return
    print(
        "\nOn the wire: what the server received (the last request's headers), how many connections "
        "all the calls above used, TCP_NODELAY on the client's pooled sockets"
    )
    for side in sides:
        seen = await stats(server.url(side))
        nodelay = sorted({s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0 for s in side.sockets()})
        print(
            f"  {side.name}: {seen['requests']} requests over {seen['connections']} connections, "
            f"{len(side.sockets())} pooled now, TCP_NODELAY {nodelay}"
        )
        print("    " + "; ".join(f"{k}: {v if k != 'authorization' else v[:7] + '...'}" for k, v in seen["headers"]))
    for side in sides:
        await side.close()


# -- the guard, in-process ----------------------------------------------------------------------


def guard_cost(iters: int) -> None:
    from common.request_headers import RequestHeaders
    from common.service_auth import ServiceGuard, ServiceTokens, bearer

    answer = [
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/octet-stream")]},
        {"type": "http.response.body", "body": b"x"},
    ]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(answer[0])
        await send(answer[1])

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    # What HttpTransport sends, as uvicorn hands it over.
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/infer",
        "headers": [
            (b"host", b"127.0.0.1:3001"),
            (b"content-type", b"application/octet-stream"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"accept", b"*/*"),
            (b"accept-encoding", b"gzip, deflate"),
            (b"content-length", b"11264"),
        ],
    }
    tokens = ServiceTokens([TOKEN])
    current = ServiceGuard(app, tokens)

    async def read_headers(scope: Any, receive: Any, send: Any) -> None:
        RequestHeaders(scope["headers"])

    headers = RequestHeaders(scope["headers"])

    async def checks(scope: Any, receive: Any, send: Any) -> None:
        headers.body_type(("application/octet-stream",))
        tokens.accepts(bearer(headers.get("authorization")))

    sides = {
        "bare app": app,
        "ServiceGuard(app)": current,
        "  of it: reading the headers": read_headers,
        "  of it: media type + token": checks,
    }

    async def loop(fn: Any) -> float:
        for _ in range(1000):
            await fn(scope, receive, send)
        t = time.perf_counter()
        for _ in range(iters):
            await fn(scope, receive, send)
        return (time.perf_counter() - t) / iters * 1e6

    async def measure() -> dict[str, list[float]]:
        out: dict[str, list[float]] = {name: [] for name in sides}
        for r in range(5):
            for name, fn in sides.items() if r % 2 == 0 else reversed(sides.items()):
                out[name].append(await loop(fn))
        return out

    results = asyncio.run(measure())
    print(f"\nServiceGuard in-process: {iters} calls x 5 rounds (median of the rounds), the scope HttpTransport sends")
    bare = statistics.median(results["bare app"])
    for name, values in results.items():
        med = statistics.median(values)
        extra = f"   over the bare app: {med - bare:+.2f} us" if name == "ServiceGuard(app)" else ""
        print(f"  {name:<28} {med:6.2f} us/call{extra}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000, help="calls per side per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument(
        "--sizes",
        default=SIZES,
        help="REQUEST_BYTES:ANSWER_BYTES,... (default: an 11 KB echo; the FeatureRunner -> model "
        "runner hop of a single-node request: ~69 KB FeatureTensor, a 256 B answer)",
    )
    p.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the client's event loop (a BentoML worker runs uvloop)",
    )
    p.add_argument(
        "--server",
        choices=("uvicorn", "bentoml"),
        default="uvicorn",
        help="what answers: a minimal ASGI app on uvicorn (default), or a BentoML service with the "
        "runners' middleware (ServiceGuard, EndpointRouter), started with start-http-server",
    )
    p.add_argument("--guard-iters", type=int, default=50_000)
    p.add_argument("--serve", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        return serve(args.serve)

    sides: list[Side] = [TransportSide(), ProxySide(), RawSide(), TransportSide(guarded=True)]
    server = Server(sides) if args.server == "uvicorn" else BentoServers(sides)
    print(
        f"server: {'a minimal ASGI app on uvicorn' if args.server == 'uvicorn' else 'EchoRunner on BentoML (start-http-server)'}"
        f", its own process{'es' if args.server == 'bentoml' else ''}"
    )
    try:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(client_cost(args, server, sides))
        else:
            asyncio.run(client_cost(args, server, sides))
    finally:
        server.stop()
    guard_cost(args.guard_iters)


if __name__ == "__main__":
    main()
