"""What the admin calls asked of a GraphSAGERunner, shared by all of its worker processes.

An admin ``load`` or ``unload`` reaches one worker (the one its connection landed on); the
others learn it from this file: ``{"versions": {tag: "loaded" | "unloaded"}}``, the last action
per tag, written under a file lock and replaced atomically. Every worker looks at the file at
most every ``Settings.model_sync_interval_s`` (one ``stat``) and, when it changed, loads (in its
loader thread, never on the event loop) or unloads what it lists. Versions loaded on demand by a
request are not written here: every worker loads those on its own first request.

The file lives in the service's BentoML home, which the workers of one service share (one per
pod in Kubernetes): an admin call reaches every worker of the pod it lands on; the other
replicas load the version on the first request that names it.
"""

from __future__ import annotations

import os
from typing import Literal

from common.files import atomic_write_json, file_lock, file_signature

Action = Literal["loaded", "unloaded"]


class AdminState:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._seen: tuple[int, int, int] | None = None

    @classmethod
    def for_this_service(cls) -> AdminState:
        home = os.environ.get("BENTOML_HOME") or os.path.expanduser("~/bentoml")
        return cls(os.path.join(home, "graphsage-runner", "admin-state.json"))

    def record(self, tag: str, action: Action) -> None:
        with file_lock(self.path):
            versions = self._read()
            versions[tag] = action
            atomic_write_json(self.path, {"versions": versions})

    def _read(self) -> dict[str, Action]:
        import json

        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return {}
        versions = doc.get("versions") if isinstance(doc, dict) else None
        return {str(k): v for k, v in (versions or {}).items() if v in ("loaded", "unloaded")}

    def changes(self) -> dict[str, Action] | None:
        """The whole state when the file changed since the last call, else None (one ``stat``)."""
        signature = file_signature(self.path)
        if signature is None or signature == self._seen:
            return None
        self._seen = signature
        return self._read()
