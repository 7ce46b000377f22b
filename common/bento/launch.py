"""The command that starts one service of a bento as its own server, as the image's entrypoint
does (``start-http-server``; the public ``bentoml serve`` starts every service of the bento).

    [*START_HTTP_SERVER, "services.gateway:Gateway", "--service-name", "FeatureRunner",
     "--port", "3010", "--depends", "GraphSAGERunner=http://127.0.0.1:3020"]

``WORKER_MODULE`` is what BentoML's worker processes run, for finding them in a process tree.
"""

from __future__ import annotations

import sys

START_HTTP_SERVER = [sys.executable, "-m", "bentoml_cli._internal.start", "start-http-server"]
WORKER_MODULE = "_bentoml_impl.worker.service"
