"""End-to-end benchmark suite: ``python -m bench.suite [--quick] [--out bench/results]``.

Starts the composed app for real (Gateway, FeatureRunner, GraphSAGERunner as separate
processes, Redis for L2 on a free loopback port), drives it with ``bench.suite.loadgen``, runs
the baselines (B1 trivial 3-service topology, B2 one trivial service, B3 in-process
sampler+ONNX monolith, B4 in-process PyG monolith) in the same run, and writes JSON, PNG plots
and a Markdown report. Modules:

    loadgen.py           closed- and open-loop HTTP load (asyncio + aiohttp), percentiles
    trivial_services.py  B1/B2: BentoML services that do no work
    procs.py             start/stop services as separate processes; Redis; RSS/CPU per service
    promtext.py          /metrics scraping and histogram diffs
    inproc.py            B3/B4 (run as a subprocess)
    workload.py          Zipf(1.0) / uniform target ids
    runner.py            the scenarios, in order, with a time budget
    report.py            plots + Markdown
"""
