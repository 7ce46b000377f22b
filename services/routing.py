"""Model/version routing: canary releases and A/B tests by weight, sticky by a routing key.

The routing table maps a model name to weighted routes over its model-store versions, plus a
history of earlier route sets for rollback. File format (``Settings.routing_file``)::

    {
      "default_model": "graphsage",
      "models": {
        "graphsage": {
          "routes": [{"version": "graphsage:v1", "weight": 0.9},
                     {"version": "graphsage:v2", "weight": 0.1}],
          "history": [[{"version": "graphsage:v1", "weight": 1.0}]],
          "shadow": {"version": "graphsage:v3", "share": 0.5}
        }
      }
    }

Weights are normalised to sum to 1 when loaded or set (a hand-written file may use 90/10);
``history`` is newest last and optional (at most ``HISTORY_MAX`` entries are kept).
``shadow`` is optional (tables written before it load unchanged): the version that also scores
``share`` (0..1) of the model's answered requests, off the response path, on the same ids, fanout
and seed (``services.shadow``). It changes no answer and gets no routed traffic; ``promote`` of
the shadow version itself ends the shadow (it would compare the version with itself);
``rollback`` restores routes and leaves the shadow as it is.
Without a routing file the table is in memory: one model, one route to the default version
(``Settings.model_tags[0]``); admin changes then affect this process only.

``choose(model, version, routing_key)``, in this order:

1. An explicit version pin wins. It may be ``v2`` or ``graphsage:v2`` and must be a
   syntactically valid BentoML tag of that model (else ``InvalidVersion``, HTTP 400), but it
   need not be listed in the routes: a client may test a version that the model runner has
   loaded before it gets traffic (or one the table just drained); an unknown version is the
   model runner's 404. This keeps the routing table the policy for *unpinned* traffic only.
2. A routing key (a user id, a session) is hashed with the model name (blake2b, 53 bits) to a
   point in [0, 1) and looked up on the cumulative weights, routes in their stored order. The
   same key gets the same version for as long as the weights do not change, and a change moves
   only the keys in the intervals whose bounds moved: for the usual two-version canary
   (10% -> 20%) exactly the keys in the band between the old and the new bound move, all to the
   canary, i.e. the minimum (10% of keys). Existing routes keep their position when weights are
   set; new versions are appended, so with more versions a change moves the keys between the
   shifted bounds (the minimum whenever only adjacent routes trade weight).
3. No key: a random pick by weight.

An unknown model name raises ``UnknownModel`` (HTTP 404).

Persistence: admin operations (``set_weights``, ``promote``, ``rollback``) take a file lock,
re-read the file (so concurrent admins never lose each other's change), apply the change and
write the file atomically (temp file + fsync + ``os.replace``). Every gateway worker calls
``reload_if_changed()`` (cheap: one ``stat`` at most every ``poll_interval_s``) and picks up a
change, detected by (mtime, size, inode), within about a second. A file that is missing or
invalid at reload keeps the table loaded before (and is logged), so a bad hand edit never takes
routing down.

The command line that reads and changes the table: ``services.routing_cli``.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.errors import KindOfError
from common.files import atomic_write_json, file_lock, file_signature
from common.settings import RoutingSection

log = logging.getLogger(__name__)

HISTORY_MAX = 20
DEFAULT_VERSION = "graphsage:latest"
_TAG_PART_RE = re.compile(r"^[a-z0-9]([-._a-z0-9]*[a-z0-9])?$")  # BentoML's tag format
_TAG_PART_MAX = 63


class RoutingError(KindOfError):
    status_code = 400


class UnknownModel(RoutingError):
    status_code = 404


class InvalidVersion(RoutingError):
    status_code = 400


class InvalidWeights(RoutingError):
    status_code = 400


class NoHistory(RoutingError):
    status_code = 409


class InvalidShadow(RoutingError):
    status_code = 400


def _valid_part(part: str) -> bool:
    return len(part) <= _TAG_PART_MAX and _TAG_PART_RE.match(part) is not None


def normalise_version(model: str, version: str) -> str:
    """``v2`` or ``graphsage:v2`` -> ``graphsage:v2`` (lower case), validated as a BentoML tag."""
    if not isinstance(version, str) or not version.strip():
        raise InvalidVersion("version must be a non-empty string such as 'v2' or 'graphsage:v2'")
    name, sep, ver = version.strip().lower().rpartition(":")
    if sep and name != model:
        raise InvalidVersion(f"version {version!r} is not a version of model {model!r}")
    if not _valid_part(ver):
        raise InvalidVersion(
            f"invalid version {version!r}: a version is 1-63 lower-case letters, digits, "
            "'.', '_' or '-', starting and ending with a letter or digit"
        )
    return f"{model}:{ver}"


def model_name(model: str) -> str:
    name = model.strip().lower()
    if not _valid_part(name):
        raise UnknownModel(f"invalid model name {model!r}")
    return name


def hash_point(model: str, routing_key: str) -> float:
    """A stable point in [0, 1) for (model, key): the top 53 bits of blake2b."""
    digest = hashlib.blake2b(
        model.encode() + b"\x00" + routing_key.encode("utf-8", "surrogatepass"), digest_size=8
    ).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


@dataclasses.dataclass(frozen=True)
class Route:
    version: str
    weight: float

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "weight": self.weight}


def _normalise_weights(model: str, pairs: Sequence[tuple[str, Any]]) -> tuple[Route, ...]:
    """Validate and normalise; keeps the given order. Raises ``InvalidWeights``."""
    if not pairs:
        raise InvalidWeights(f"model {model!r}: at least one version with a weight is needed")
    seen: dict[str, float] = {}
    for version, weight in pairs:
        tag = normalise_version(model, version)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise InvalidWeights(f"{tag}: weight must be a number, got {weight!r}")
        if not math.isfinite(weight) or weight < 0:
            raise InvalidWeights(f"{tag}: weight must be a finite number >= 0, got {weight!r}")
        if tag in seen:
            raise InvalidWeights(f"{tag} is listed twice")
        seen[tag] = float(weight)
    top = max(seen.values())
    if not top > 0:
        raise InvalidWeights(f"model {model!r}: the weights sum to 0; at least one must be > 0")
    try:
        total = math.fsum(seen.values())
    except OverflowError:  # weights near the float maximum (a 500 found by the OpenAPI fuzzer)
        seen = {tag: w / top for tag, w in seen.items()}
        total = math.fsum(seen.values())
    return tuple(Route(tag, w / total) for tag, w in seen.items())


@dataclasses.dataclass(frozen=True)
class Shadow:
    """A model's shadow version and the share of its answered requests it also scores."""

    version: str
    share: float

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "share": self.share}


def make_shadow(model: str, version: Any, share: Any) -> Shadow:
    """Validated; raises ``InvalidVersion`` or ``InvalidShadow``."""
    tag = normalise_version(model, version)
    if (
        isinstance(share, bool)
        or not isinstance(share, (int, float))
        or not math.isfinite(share)
        or not 0 <= share <= 1
    ):
        raise InvalidShadow(f"{tag}: the shadow share must be a number in [0, 1], got {share!r}")
    return Shadow(tag, float(share))


@dataclasses.dataclass(frozen=True)
class ModelRoutes:
    routes: tuple[Route, ...]
    history: tuple[tuple[Route, ...], ...] = ()
    shadow: Shadow | None = None
    _versions: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _bounds: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        live = [r for r in self.routes if r.weight > 0]
        bounds = list(itertools.accumulate(r.weight for r in live))
        bounds[-1] = 1.0  # no float gap at the top: every point in [0, 1) lands somewhere
        object.__setattr__(self, "_versions", tuple(r.version for r in live))
        object.__setattr__(self, "_bounds", tuple(bounds))

    def pick(self, point: float) -> str:
        return self._versions[bisect.bisect_right(self._bounds, point)]

    def in_use(self) -> tuple[str, ...]:
        return self._versions

    def to_json(self) -> dict[str, Any]:
        doc = {
            "routes": [r.to_json() for r in self.routes],
            "history": [[r.to_json() for r in h] for h in self.history],
        }
        if self.shadow is not None:
            doc["shadow"] = self.shadow.to_json()
        return doc

    def with_routes(self, routes: tuple[Route, ...]) -> ModelRoutes:
        """New routes; the current ones go to history (unless unchanged); the shadow stays."""
        if routes == self.routes:
            return self
        return ModelRoutes(routes, (self.history + (self.routes,))[-HISTORY_MAX:], self.shadow)

    def with_shadow(self, shadow: Shadow | None) -> ModelRoutes:
        return ModelRoutes(self.routes, self.history, shadow)


@dataclasses.dataclass(frozen=True)
class TableState:
    default_model: str
    models: Mapping[str, ModelRoutes]

    def to_json(self) -> dict[str, Any]:
        return {
            "default_model": self.default_model,
            "models": {name: m.to_json() for name, m in sorted(self.models.items())},
        }


def _routes_from_json(model: str, raw: Any, where: str) -> tuple[Route, ...]:
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise InvalidWeights(f"{where}: routes must be a list of {{'version', 'weight'}} objects")
    return _normalise_weights(model, [(r.get("version"), r.get("weight")) for r in raw])


def parse_table(doc: Any, where: str = "routing table") -> TableState:
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict) or not doc["models"]:
        raise RoutingError(f'{where}: expected {{"models": {{"<model>": {{"routes": [...]}}}}}}')
    models: dict[str, ModelRoutes] = {}
    for raw_name, entry in doc["models"].items():
        name = model_name(raw_name)
        if not isinstance(entry, dict):
            raise RoutingError(f"{where}: model {raw_name!r} must be an object")
        routes = _routes_from_json(name, entry.get("routes"), f"{where}: {name}")
        history = tuple(_routes_from_json(name, h, f"{where}: {name} history") for h in entry.get("history") or ())
        models[name] = ModelRoutes(routes, history[-HISTORY_MAX:], _shadow_from_json(name, entry.get("shadow"), where))
    default = doc.get("default_model") or next(iter(models))
    default = model_name(default)
    if default not in models:
        raise RoutingError(f"{where}: default_model {default!r} is not in models")
    return TableState(default, models)


def _shadow_from_json(model: str, raw: Any, where: str) -> Shadow | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidShadow(f"{where}: {model} shadow must be an object {{'version', 'share'}}")
    return make_shadow(model, raw.get("version"), raw.get("share", 1.0))


def default_table(default_version: str = DEFAULT_VERSION) -> TableState:
    name, sep, _ = default_version.partition(":")
    if not sep:
        raise InvalidVersion(f"default version must be a full tag 'name:version', got {default_version!r}")
    model = model_name(name)
    tag = normalise_version(model, default_version)
    return TableState(model, {model: ModelRoutes((Route(tag, 1.0),))})


class RoutingTable:
    def __init__(
        self,
        path: str | None = None,
        *,
        default_version: str = DEFAULT_VERSION,
        poll_interval_s: float = 1.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``path`` None or "": in memory. A path whose file does not exist yet starts from the
        default table (the file is written by the first admin change)."""
        self.path = path or None
        self.default_version = default_version
        self.poll_interval_s = poll_interval_s
        self._rng = rng or random.Random()
        self._clock = clock
        self._admin_lock = threading.Lock()
        self._last_poll = clock()
        self._signature: tuple[int, int, int] | None = None
        self._state = default_table(default_version)
        if self.path is not None:
            self._signature = file_signature(self.path)
            if self._signature is not None:
                self._state = self._read_file()  # invalid at start-up: fail loudly
            else:
                log.info("routing file %s does not exist yet; routing all traffic to %s", self.path, default_version)

    @classmethod
    def in_memory(cls, default_version: str = DEFAULT_VERSION, **kwargs: Any) -> RoutingTable:
        return cls(None, default_version=default_version, **kwargs)

    @classmethod
    def from_settings(cls, routing: RoutingSection, model_tags: Sequence[str], **kwargs: Any) -> RoutingTable:
        """The table in ``GSAGE_ROUTING_FILE``; by default all traffic to the first of ``model_tags``."""
        return cls(
            routing.routing_file or None,
            default_version=model_tags[0] if model_tags else DEFAULT_VERSION,
            poll_interval_s=routing.routing_poll_interval_s,
            **kwargs,
        )

    # -- reads -----------------------------------------------------------------------------------

    @property
    def default_model(self) -> str:
        return self._state.default_model

    def models(self) -> list[str]:
        return sorted(self._state.models)

    def routes(self, model: str) -> list[Route]:
        return list(self._get(self._state, model).routes)

    def history(self, model: str) -> list[list[Route]]:
        return [list(h) for h in self._get(self._state, model).history]

    def shadow(self, model: str) -> Shadow | None:
        return self._get(self._state, model).shadow

    def routes_in_use(self, model: str) -> tuple[str, ...]:
        """The model's versions with weight > 0 (what a promotion replaces)."""
        return self._get(self._state, model).in_use()

    def shadow_for(self, tag: str) -> Shadow | None:
        """The shadow of the model a routed tag (``graphsage:v1``) belongs to, if any; called
        for every answered request group, so a plain lookup."""
        routes = self._state.models.get(tag.rpartition(":")[0])
        return routes.shadow if routes is not None else None

    def to_json(self) -> dict[str, Any]:
        return self._state.to_json()

    @staticmethod
    def _get(state: TableState, model: str) -> ModelRoutes:
        routes = state.models.get(model)
        if routes is None:
            routes = state.models.get(model.strip().lower())
        if routes is None:
            raise UnknownModel(f"unknown model {model!r}; known: {', '.join(sorted(state.models))}")
        return routes

    def choose(self, model: str | None, version: str | None = None, routing_key: str | None = None) -> str:
        """The ``name:version`` tag to serve this request (see the module doc for the rules)."""
        state = self._state  # one consistent snapshot even if a reload swaps it meanwhile
        name = model or state.default_model
        routes = self._get(state, name)
        name = name.strip().lower()
        if version:
            return normalise_version(name, version)
        if routing_key:
            return routes.pick(hash_point(name, routing_key))
        return routes.pick(self._rng.random())

    def versions_in_use(self) -> set[str]:
        """Every tag with weight > 0 and every shadow with a share > 0 (what the model runner
        must have loaded)."""
        models = self._state.models.values()
        return {v for m in models for v in m.in_use()} | {
            m.shadow.version for m in models if m.shadow is not None and m.shadow.share > 0
        }

    # -- file ------------------------------------------------------------------------------------

    def _read_file(self) -> TableState:
        assert self.path is not None
        with open(self.path, encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as exc:
                raise RoutingError(f"{self.path}: not valid JSON: {exc}") from None
        return parse_table(doc, self.path)

    def reload_if_changed(self, force: bool = False) -> bool:
        """Re-read the routing file if it changed; True when the table was replaced.

        At most one ``stat`` per ``poll_interval_s`` unless ``force``. A missing or invalid
        file keeps the current table (logged once per change of the file)."""
        if self.path is None:
            return False
        now = self._clock()
        if not force and now - self._last_poll < self.poll_interval_s:
            return False
        self._last_poll = now
        sig = file_signature(self.path)
        if sig == self._signature:
            return False
        self._signature = sig
        if sig is None:
            log.warning("routing file %s disappeared; keeping the current table", self.path)
            return False
        try:
            state = self._read_file()
        except (OSError, RoutingError) as exc:
            log.error("routing file %s not reloaded, keeping the current table: %s", self.path, exc)
            return False
        if state == self._state:
            return False
        self._state = state
        log.info("routing table reloaded from %s: %s", self.path, self._describe(state))
        return True

    @staticmethod
    def _describe(state: TableState) -> str:
        return "; ".join(
            f"{name}: "
            + ", ".join(f"{r.version}={r.weight:.1%}" for r in m.routes)
            + (f" (shadow {m.shadow.version} at {m.shadow.share:.1%})" if m.shadow is not None else "")
            for name, m in sorted(state.models.items())
        )

    # -- admin -----------------------------------------------------------------------------------

    def _mutate(self, change: Callable[[TableState], TableState]) -> None:
        with self._admin_lock:
            if self.path is None:
                self._state = change(self._state)
                return
            with file_lock(self.path):
                # Start from the file, not from what this process last saw.
                if os.path.exists(self.path):
                    current = self._read_file()
                else:
                    current = default_table(self.default_version)
                new = change(current)
                if new != current or not os.path.exists(self.path):
                    atomic_write_json(self.path, new.to_json())
                self._state = new
                self._signature = file_signature(self.path)
        log.info("routing changed: %s", self._describe(self._state))

    def _replace_routes(self, model: str, make: Callable[[ModelRoutes | None], ModelRoutes]) -> None:
        name = model_name(model)

        def change(state: TableState) -> TableState:
            models = dict(state.models)
            models[name] = make(models.get(name))
            return TableState(state.default_model, models)

        self._mutate(change)

    def set_weights(self, model: str, weights: Mapping[str, float]) -> list[Route]:
        """Replace the model's routes by ``weights`` (``{version: weight}``, any scale: 90/10 is
        0.9/0.1). Versions already routed keep their position (stickiness); new ones are
        appended; versions not named are removed. Creates the model if it is new."""
        name = model_name(model)
        given = _normalise_weights(name, list(weights.items()))

        self._replace_routes(name, lambda current: _merged_routes(current, given))
        return self.routes(name)

    def promote(self, model: str, version: str) -> list[Route]:
        """All traffic to ``version`` (the other routes are dropped; ``rollback`` restores).
        When ``version`` was the shadow, the shadow ends."""
        name = model_name(model)
        given = _normalise_weights(name, [(version, 1.0)])

        def make(current: ModelRoutes | None) -> ModelRoutes:
            merged = _merged_routes(current, given)
            if merged.shadow is not None and merged.shadow.version == given[0].version:
                return merged.with_shadow(None)
            return merged

        self._replace_routes(name, make)
        return self.routes(name)

    def set_shadow(self, model: str, version: str, share: float = 1.0) -> Shadow:
        """``version`` also scores ``share`` of ``model``'s answered requests (replacing any
        earlier shadow); the model must exist."""
        name = model_name(model)
        shadow = make_shadow(name, version, share)
        self._replace_routes(name, lambda current: _existing(model, current).with_shadow(shadow))
        return shadow

    def clear_shadow(self, model: str) -> None:
        name = model_name(model)
        self._replace_routes(name, lambda current: _existing(model, current).with_shadow(None))

    def rollback(self, model: str) -> list[Route]:
        """Restore the routes before the last change (``NoHistory`` when there is none)."""
        name = model_name(model)

        def make(current: ModelRoutes | None) -> ModelRoutes:
            current = _existing(model, current)
            if not current.history:
                raise NoHistory(f"model {name!r} has no earlier routes to roll back to")
            return ModelRoutes(current.history[-1], current.history[:-1], current.shadow)

        self._replace_routes(name, make)
        return self.routes(name)


def _merged_routes(current: ModelRoutes | None, given: tuple[Route, ...]) -> ModelRoutes:
    """``given`` as the routes: versions already routed keep their position (stickiness), new
    ones are appended, versions not named are removed."""
    if current is None:
        return ModelRoutes(given)
    by_tag = {r.version: r for r in given}
    ordered = [by_tag.pop(r.version) for r in current.routes if r.version in by_tag]
    return current.with_routes(tuple(ordered) + tuple(by_tag.values()))


def _existing(model: str, current: ModelRoutes | None) -> ModelRoutes:
    if current is None:
        raise UnknownModel(f"unknown model {model!r}")
    return current
