"""The BentoML boundary: every use of BentoML internals is in common/bento/, which refuses a
BentoML release it was not tested with."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from common.bento import TESTED_VERSIONS, UntestedBentoML, check_version
from common.bento.logs import DISPATCH_LOGGER, quiet_client_errors

ROOT = Path(__file__).resolve().parent.parent
INTERNALS = re.compile(r"\b(_bentoml_impl|_bentoml_sdk|bentoml\._internal|bentoml_cli)\b")
CODE_DIRS = ("common", "services", "runners", "training_export", "bentos", "harness", "bench", "tests")


def test_the_installed_bentoml_is_a_tested_one_and_another_is_refused_clearly():
    assert check_version() in TESTED_VERSIONS
    with pytest.raises(
        UntestedBentoML, match=r"BentoML 1\.5\.0 is installed, but common/bento/ was tested with 1\.4\.40"
    ):
        check_version("1.5.0")


def test_no_module_outside_the_adapter_imports_bentoml_internals():
    offenders = []
    for top in CODE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if (
                (rel.parts[0] == "common" and rel.parts[1] == "bento")
                or "grpc_gen" in rel.parts
                or path == Path(__file__)
            ):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if INTERNALS.search(code) and ("import" in code or "-m" in code):
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "BentoML internals outside common/bento/:\n" + "\n".join(offenders)


def test_client_errors_are_logged_at_debug_and_server_errors_stay_errors(caplog):
    from bentoml.exceptions import BentoMLException, InvalidArgument
    from pydantic import BaseModel, ValidationError

    class Body(BaseModel):
        x: int

    quiet_client_errors()
    quiet_client_errors()  # idempotent: one filter
    logger = logging.getLogger(DISPATCH_LOGGER)
    assert sum(type(f).__name__ == "ClientErrorsAtDebug" for f in logger.filters) == 1
    try:
        Body.model_validate({"x": "no"})
    except ValidationError as exc:
        invalid = exc
    with caplog.at_level(logging.DEBUG, logger=DISPATCH_LOGGER):
        for exc in (invalid, InvalidArgument("bad ids"), BentoMLException("boom"), RuntimeError("bug")):
            logger.error("Exception on /x [POST]", exc_info=(type(exc), exc, None))
    levels = [(r.levelname, bool(r.exc_info)) for r in caplog.records]
    assert levels == [("DEBUG", False), ("DEBUG", False), ("ERROR", True), ("ERROR", True)]
    assert "bad ids" in caplog.records[1].getMessage()
