"""The metric contract and its thresholds: the exported metrics (metrics) and their fixed buckets (buckets), the
values of the collection errors' reason label (failure), the adaptive-verification sentence both counts give
(adaptive_verification), the verdict's definition (verdict) and the monitoring config (monitoring_config +
monitoring.yaml) the verdict, the rules and the dashboard read.

This file imports none of them: the tap's process imports buckets and adaptive_verification alone."""
