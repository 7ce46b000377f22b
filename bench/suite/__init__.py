"""End-to-end benchmark suite: ``python -m bench.suite [--quick] [--out bench/results]``.

Starts the composed app for real (Gateway, FeatureRunner, GraphSAGERunner as separate
processes, Redis for L2 on a free loopback port), drives it with ``harness.load``, runs
the baselines (B1 trivial 3-service topology, B2 one trivial service, B3 in-process
sampler+ONNX monolith, B4 in-process PyG monolith) in the same run, and writes JSON, PNG plots
and a Markdown report (``report.md``, the only account of a run it writes; docs/performance.md is
the hand-written guide that links to it). Modules:

    scenarios.py         the scenarios as data: name, topology, load, duration, tags; the profiles
    targets.py           the baselines and the targets as data: each bound, its scenarios, its pairing
    trivial_services.py  B1/B2: BentoML services that do no work
    procs.py             start/stop services as separate processes; Redis; RSS/CPU per service
    promtext.py          /metrics scraping and histogram diffs
    inproc.py            B3/B4 (run as a subprocess)
    runner.py            runs the scenarios in order, with a time budget, and records their rows
    report.py            plots + Markdown: finds its rows and judges the targets by the data above

The load itself (closed and open loop, target ids) comes from the harness the tests use too:
``harness/load.py`` and ``harness/workload.py``; the processes from ``harness/processes.py``.
"""
