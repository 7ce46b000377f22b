"""The BentoML adapter: every use of BentoML internals lives in this package, and importing it
checks that the installed BentoML is a version these modules were written and tested against.

- ``timeout_fix``: the request-timeout middleware's timer leak, fixed in place;
- ``direct_api``: hot routes answered past BentoML's per-request dispatch, errors as ``ApiError``;
- ``dependencies``: the address BentoML gave a dependency (its proxy is not used for calls);
- ``serving``: which service this process was started to serve;
- ``logs``: client errors that BentoML's dispatch would log at ERROR with a traceback;
- ``openapi``: the served OpenAPI document, declared as what it is, with the plain routes;
- ``launch``: the command that starts one service of a bento (``start-http-server``);
- ``store``: pointing this process's model and bento stores at a BentoML home;
- ``release``: a bento's container build context and the container backends.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# The releases whose internals the modules here were read against and tested with; another one
# may have moved any of them (a private module, a middleware's shape, an IO descriptor).
TESTED_VERSIONS = frozenset({"1.4.40"})


class UntestedBentoML(ImportError):
    """The installed BentoML is not one the adapter was tested with."""


def check_version(installed: str | None = None) -> str:
    """The installed BentoML's version; raises ``UntestedBentoML`` for any other than the tested ones."""
    if installed is None:
        try:
            installed = version("bentoml")
        except PackageNotFoundError:
            raise UntestedBentoML("BentoML is not installed; pip install bentoml==1.4.40") from None
    if installed not in TESTED_VERSIONS:
        raise UntestedBentoML(
            f"BentoML {installed} is installed, but common/bento/ was tested with {', '.join(sorted(TESTED_VERSIONS))} "
            "only: install that version (pip install 'bentoml==1.4.40'), or review every module of common/bento/ "
            "against the new release and add it to common.bento.TESTED_VERSIONS")
    return installed


BENTOML_VERSION = check_version()
