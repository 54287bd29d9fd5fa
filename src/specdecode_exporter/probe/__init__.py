"""`specdecode-exporter probe`: measure α, acceptance length, TPOT and the observed speedup per temperature and
prompt group against a live server before a speculative-decoding configuration ships (docs/probe.md).

prompts.py (the prompt set), client.py (HTTP: models, /metrics, streamed completions), measure.py (pure
aggregation: quantiles, α, verdicts), run.py (the measurement: plan, cells, other-traffic checks, progress),
report.py (table, JSON, CSV, plot), cli.py (flags).
"""
