"""`specdecode-exporter check URL`: collect a vLLM twice and print a verdict (command), and, with
--send-test-completion, whether its responses carry the per-request metrics the tap reads (per_request)."""
