"""Fixed bucket bounds shared by the sidecar's exposition and the request tap's own process (which imports this and
not core.contract.metrics, so that it does not load prometheus_client)."""

# The le bounds of both α histograms (per collection interval and per request): every 0.05, so the page's 0.5 is a
# bound and a rule can count what falls below it exactly.
ACCEPTANCE_RATIO_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))
