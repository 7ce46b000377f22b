"""A bento's container build: BentoML's own build context and container backends, and the
BentoCloud deployment schema, all behind functions of this module."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any


def load_bento(tag_or_path: str | None) -> Any:
    """A bento by tag from the store, or a bento directory (a build context's ``$BENTO_PATH``)."""
    import bentoml
    from bentoml._internal.bento import Bento

    if tag_or_path and os.path.isdir(tag_or_path):
        return Bento.from_path(os.path.abspath(tag_or_path))
    return bentoml.bentos.get(tag_or_path or "graphsage-serving:latest")


@contextlib.contextmanager
def containerfile(bento: Any, enable_buildkit: bool = True) -> Iterator[tuple[str, str]]:
    """BentoML's own build context (bento + models resolved from the model store + Dockerfile)
    in a temporary directory: ``(context_dir, dockerfile)``.

    BentoML 1.4.40's ``construct_containerfile`` refuses a bento's ``dockerfile_template`` unless
    the temporary context lies under the current directory (``resolve_user_filepath(secure=
    True)``), which also breaks a plain ``bentoml containerize`` run from a project directory; it
    is called here from the temporary directory's parent."""
    from bentoml._internal.container import construct_containerfile

    prev = os.getcwd()
    os.chdir(tempfile.gettempdir())
    try:
        with construct_containerfile(bento, enable_buildkit=enable_buildkit, add_header=True) as (ctx, dockerfile):
            os.chdir(prev)
            yield ctx, dockerfile
    finally:
        os.chdir(prev)


def containerize(bento_tag: str, backend: str, image_tags: tuple[str, ...], **options: Any) -> bool:
    """``bentoml containerize`` in this process: ``bentoml.container.build``, the function the
    CLI calls, with the backend's options as keyword arguments (``isolation="chroot"``,
    ``layers=True``, ...). Returns whether the image was built.

    Called rather than the CLI because the CLI's ``--opt volume=...`` joins repeated values into
    one argument (``buildah``/``podman`` ``construct_build_args``: ``":".join(volume)``); a list
    is passed through as one ``--volume`` per mount. Run from the temporary directory's parent
    for the ``dockerfile_template`` check (see ``containerfile``). The builder's output, which
    BentoML logs line by line, goes to stderr."""
    import logging
    import sys

    import bentoml

    log = logging.getLogger("bentoml._internal.container")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    previous_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    prev = os.getcwd()
    os.chdir(tempfile.gettempdir())
    try:
        # build() logs a failure and returns None; success returns the builder's output.
        built = bentoml.container.build(bento_tag, backend=backend, image_tag=image_tags, **options)  # type: ignore[call-overload]
        return built is not None
    finally:
        os.chdir(prev)
        log.removeHandler(handler)
        log.setLevel(previous_level)


def backend_available(backend: str) -> bool:
    """Does BentoML's container backend ``backend`` (docker, buildah, podman, ...) answer here?"""
    from bentoml._internal.container import get_backend

    try:
        return bool(get_backend(backend).health())
    except Exception:
        return False


def deployment_schema_fields() -> dict[str, set[str]]:
    """The fields BentoCloud's deployment schema allows, per section (for checking a config)."""
    import attr
    from bentoml._internal.cloud.schemas.modelschemas import DeploymentServiceConfig, DeploymentTargetHPAConf, HPAPolicy
    from bentoml._internal.cloud.schemas.schemasv2 import CreateDeploymentSchema

    def fields(cls: Any) -> set[str]:
        return {f.name for f in attr.fields(cls)}

    return {
        "deployment": fields(CreateDeploymentSchema),
        "service": fields(DeploymentServiceConfig),
        "scaling": fields(DeploymentTargetHPAConf),
        "policy": fields(HPAPolicy),
    }


def structure_deployment(config: dict[str, Any]) -> Any:
    """``config`` as BentoCloud's ``CreateDeploymentSchema`` (raises when it does not fit)."""
    from bentoml._internal.cloud.schemas.schemasv2 import CreateDeploymentSchema
    from bentoml._internal.utils.cattr import bentoml_cattr

    return bentoml_cattr.structure(config, CreateDeploymentSchema)
