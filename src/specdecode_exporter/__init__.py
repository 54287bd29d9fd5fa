"""specdecode-exporter: is vLLM's speculative decoding paying off?

The package is laid out by lifetime (docs/architecture.md; the layering is checked by `make lint`):

    cli          the `specdecode-exporter` command: one subcommand per tool, each imported only when it runs
    demo         the simulator and the sidecar wired together (`specdecode-exporter demo`)
    check        a one-shot verdict in the terminal (`specdecode-exporter check URL`)
    probe        a before-you-ship measurement against a live server (`specdecode-exporter probe`)
    simulator    a fake vLLM for demos and tests (`specdecode-exporter simulate`)
    monitoring   build time: rules, dashboard, manifests and mixin from the one monitoring config
    sidecar      the running sidecar: config, the collection loop, /metrics, the status page, reload
    tap          the request tap: a byte relay in front of vLLM's OpenAI API and its per-request figures
    pipeline     scrape → parse → engines → store → derive: pure collection and arithmetic
    core         what every part shares: the metric contract, the monitoring config, the verdict, logging
"""
