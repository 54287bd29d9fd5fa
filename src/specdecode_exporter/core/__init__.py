"""What every part of the exporter shares, by role: the metric contract and its thresholds (contract), the statistics
behind the alerts (stats), the config machinery (config), the HTTP server runner (net), what a running command sets
up for its log and its signals (process) and the SVG charts (svg). Imports nothing else of the package."""
