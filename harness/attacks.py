"""A pickled body, sent to a service every way that has got one past a guard: for the tests that
attack the services started as processes (tests/test_internal_hops.py) and as the release image's
containers (tests/test_image.py).

The pickle runs ``touch <marker>`` when loaded. It goes to every route with every spelling of its
media type (alone, duplicated in both orders beside an accepted type, with parameters, in other
cases, in a comma list) and every way of presenting a credential (none, a wrong one, the valid
one, both in either order, the valid one twice). The answers must all be 4xx, and the marker must
never exist.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import httpx

PICKLE = "application/vnd.bentoml+pickle"
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"

# Each a list of Content-Type headers, sent in this order; the last two are the accepted types,
# whose parsers must refuse a pickle too.
CONTENT_TYPES: tuple[tuple[str, ...], ...] = (
    (PICKLE,),
    (PICKLE, JSON),
    (JSON, PICKLE),
    (PICKLE, OCTET_STREAM),
    (OCTET_STREAM, PICKLE),
    (PICKLE, PICKLE),
    (PICKLE + "; charset=utf-8",),
    (PICKLE + ";buffer-lengths=1",),
    ("Application/VND.BentoML+Pickle",),
    ("APPLICATION/VND.BENTOML+PICKLE",),
    (f"{JSON}, {PICKLE}",),
    (f"{PICKLE}, {JSON}",),
    (JSON,),
    (OCTET_STREAM,),
)


class WritesAFile:
    """A pickle whose loading runs ``touch <path>``: proof that something unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


@dataclasses.dataclass(frozen=True)
class Target:
    """One service under attack: its URL, its routes, and a valid and a wrong credential as
    ``(header, value)`` (a service token for a runner, an API key for the gateway)."""

    name: str
    url: str
    routes: Sequence[str]
    valid: tuple[str, str]
    wrong: tuple[str, str]

    def credentials(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        valid, wrong = self.valid, self.wrong
        return ((), (wrong,), (valid,), (wrong, valid), (valid, wrong), (valid, valid))


@dataclasses.dataclass
class Outcome:
    sent: int = 0
    not_4xx: list[tuple[str, str, tuple[str, ...], int, str]] = dataclasses.field(default_factory=list)
    statuses: dict[int, int] = dataclasses.field(default_factory=dict)


def send_pickles(targets: Sequence[Target], marker: str) -> Outcome:
    """Every target's every route, with every content type and credential of this module; the
    pickle writes ``marker`` (a path on the machine that runs the services) if anything loads it."""
    import pickle

    body = pickle.dumps(WritesAFile(marker))
    outcome = Outcome()
    for target in targets:
        with httpx.Client(base_url=target.url, timeout=30) as client:
            for route in target.routes:
                for types in CONTENT_TYPES:
                    for credential in target.credentials():
                        headers = [*(("Content-Type", t) for t in types), *credential]
                        r = client.post(route, content=body, headers=headers)
                        outcome.sent += 1
                        outcome.statuses[r.status_code] = outcome.statuses.get(r.status_code, 0) + 1
                        if not 400 <= r.status_code < 500:
                            shown = tuple(name for name, _ in credential)
                            outcome.not_4xx.append((target.name, route, types + shown, r.status_code, r.text[:200]))
    return outcome


def service_routes(name: str) -> list[str]:
    """Every endpoint of one of the app's services, from the endpoint tables the services serve."""
    from common import feature_runner_api, model_runner_api
    from services import api

    tables = {
        "Gateway": api.ENDPOINTS,
        "FeatureRunner": feature_runner_api.ENDPOINTS,
        "GraphSAGERunner": model_runner_api.ENDPOINTS,
    }
    return sorted({ep.path for ep in tables[name]})


# Routes beside the APIs that a guard must hold too: documents, probes, scrapes, and none at all.
OTHER_ROUTES = ("/docs.json", "/schema.json", "/livez", "/readyz", "/healthz", "/metrics", "/no-such-route")


def app_targets(model_url: str, feature_url: str, gateway_url: str, token: str, api_key: str) -> list[Target]:
    """The app's three services with every route they serve; ``token``: the service token the
    runners accept, ``api_key``: a gateway key (the more scopes, the further a request gets)."""
    wrong = ("Authorization", "Bearer stranger-" + "s" * 24)
    targets = [
        Target(name, url, [*service_routes(name), *OTHER_ROUTES], ("Authorization", f"Bearer {token}"), wrong)
        for name, url in (("GraphSAGERunner", model_url), ("FeatureRunner", feature_url))
    ]
    gateway_routes = service_routes("Gateway")
    targets.append(
        Target("Gateway", gateway_url, [*gateway_routes, *OTHER_ROUTES], ("Authorization", f"Bearer {api_key}"), wrong)
    )
    targets.append(Target("Gateway", gateway_url, gateway_routes, ("X-API-Key", api_key), ("X-API-Key", "gsk_wrong")))
    return targets


def marker_exists(*paths: str | Path) -> list[str]:
    """The paths of ``paths`` that exist (a pickle ran where one does)."""
    return [str(p) for p in paths if Path(p).exists()]
