"""What every part of the exporter shares: the metric contract (metrics), the monitoring config the verdict,
rules and dashboard read (monitoring_config + monitoring.yaml), the one way to validate config (validation: the
config error, durations, sizes), the verdict's definition, logging, the small HTTP server runner, flag conversion
and SVG charts. Imports nothing else of the package."""
