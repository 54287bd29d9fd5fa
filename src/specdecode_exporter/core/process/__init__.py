"""What a running command sets up: its log lines (log) and SIGINT/SIGTERM stopping it alike (signals)."""
