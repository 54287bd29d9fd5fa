"""The running sidecar: config (YAML + flags), the collection loop over the pipeline (collection, series), the
exposition (expose), the HTTP endpoints (web: /metrics, /healthz, /readyz, /api/v1/status, the status page),
reload, web security, and the wiring of the request tap (proxy.py)."""
