"""The BentoML model store, as the cores use it: entries read and written through BentoML's
public ``bentoml.models`` API, and this process's stores pointed at a home directory.

- ``get_entry`` / ``create_entry``: a ``graphsage:<v>`` or ``graph-snapshot:<v>`` entry (its exact
  tag, directory and metadata); ``StoreEntryNotFound`` for a tag the store does not hold.
- ``use_home``: setting ``BENTOML_HOME`` alone is not enough once BentoML is imported: it
  resolves the home and the stores once per process and caches them (simple_di singletons), so
  the providers are overridden too, and reset when the block ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any


class StoreEntryNotFound(LookupError):
    """The model store holds no entry with this tag."""


@dataclasses.dataclass(frozen=True)
class StoreEntry:
    tag: str  # exact: name:version, never :latest
    path: str
    metadata: dict[str, Any]


def get_entry(tag: str) -> StoreEntry:
    """The entry ``tag`` names (``:latest`` resolves to the newest); ``StoreEntryNotFound`` otherwise."""
    import bentoml
    from bentoml.exceptions import BentoMLException

    try:
        model = bentoml.models.get(tag)
    except (BentoMLException, ValueError) as exc:
        raise StoreEntryNotFound(f"{tag!r} is not in the model store ({exc})") from exc
    return StoreEntry(str(model.tag), model.path, dict(model.info.metadata))


@contextlib.contextmanager
def create_entry(name: str, labels: Mapping[str, str], metadata: Mapping[str, Any]) -> Iterator[StoreEntry]:
    """A new entry ``name:<auto version>``: write its files under ``entry.path`` in the block; it
    is in the store once the block ends without an error."""
    import bentoml

    with bentoml.models.create(name, labels=dict(labels), metadata=dict(metadata)) as model:
        yield StoreEntry(str(model.tag), model.path, dict(metadata))


def model_store_dir() -> str:
    from bentoml._internal.configuration.containers import BentoMLContainer

    return str(BentoMLContainer.model_store_dir.get())


@contextlib.contextmanager
def use_home(home: str) -> Iterator[str]:
    """This process's model and bento stores under ``home`` while the block runs (nestable)."""
    from bentoml._internal.bento import BentoStore
    from bentoml._internal.configuration.containers import BentoMLContainer
    from bentoml._internal.models import ModelStore

    dirs = {name: os.path.join(home, name) for name in ("models", "bentos", "envs", "tmp")}
    for path in dirs.values():
        os.makedirs(path, exist_ok=True)
    c = BentoMLContainer
    overrides = [
        (c.bentoml_home, home),
        (c.model_store_dir, dirs["models"]),
        (c.model_store, ModelStore(dirs["models"])),
        (c.bento_store_dir, dirs["bentos"]),
        (c.bento_store, BentoStore(dirs["bentos"])),
        (c.tmp_bento_store_dir, dirs["tmp"]),
        (c.tmp_bento_store, BentoStore(dirs["tmp"])),
        (c.env_store_dir, dirs["envs"]),
    ]
    # patch() restores whatever override was there before, so these can nest.
    with contextlib.ExitStack() as stack:
        for provider, value in overrides:
            stack.enter_context(provider.patch(value))
        yield home
