"""Pointing this process's BentoML model and bento stores at a home directory.

Setting ``BENTOML_HOME`` alone is not enough once BentoML is imported: it resolves the home and
the stores once per process and caches them (simple_di singletons), so the providers are
overridden too, and reset when the block ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


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
