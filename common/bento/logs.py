"""BentoML's dispatch logs every exception of an API call at ERROR with its traceback
(``bentoml._internal.server.http_app.log_exception``), a caller's bad input included: a 400 for
an invalid body or a 409 from ``/admin/routing`` read like a crash in the service's log. This
filter lowers those records to DEBUG without the traceback; server errors stay as they are.
"""

from __future__ import annotations

import logging

DISPATCH_LOGGER = "bentoml._internal.server.http_app"


def is_client_error(exc: BaseException | None) -> bool:
    from bentoml.exceptions import BentoMLException
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return True
    return isinstance(exc, BentoMLException) and int(exc.error_code) < 500


class ClientErrorsAtDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if is_client_error(exc):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg = f"{record.msg}: {exc.__class__.__name__}: {str(exc)[:300]}"
            record.exc_info = record.exc_text = None
        return True


def quiet_client_errors() -> None:
    """Install the filter on BentoML's dispatch logger (idempotent)."""
    logger = logging.getLogger(DISPATCH_LOGGER)
    if not any(isinstance(f, ClientErrorsAtDebug) for f in logger.filters):
        logger.addFilter(ClientErrorsAtDebug())
