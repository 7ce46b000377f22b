"""The BentoML adapter: every use of BentoML internals lives in this package, and importing it
checks that the installed BentoML is a version these modules were written and tested against.

- ``traffic``: the timeout and concurrency middlewares patched (the timer leak; refusals as ``ApiError``);
- ``wiring``: a service's endpoints answered by the project's router behind its guard;
- ``config``: each service's BentoML configuration from its settings sections;
- ``dependencies``: the address BentoML gave a dependency (its proxy is not used for calls);
- ``serving``: which service this process was started to serve, and what each service module runs first;
- ``foreign_errors``: error answers BentoML writes itself, rewritten in the one error shape;
- ``logs``: client errors that BentoML's dispatch would log at ERROR with a traceback;
- ``openapi``: the gateway's OpenAPI document, declared as what it is, with every route and its errors;
- ``launch``: the command that starts one service of a bento (``start-http-server``);
- ``store``: model-store entries read and written, and this process's stores pointed at a BentoML home;
- ``release``: a bento's container build context and the container backends;
- ``tracing``: BentoML's tracer provider, for the spans of the gateway's own gRPC server;
- ``untraced``: OpenTelemetry's ASGI middleware passing requests straight on while tracing is off.
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
            "against the new release and add it to common.bento.TESTED_VERSIONS"
        )
    return installed


BENTOML_VERSION = check_version()
