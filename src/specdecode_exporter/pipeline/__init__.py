"""The collection pipeline, pure and configuration-free: scrape (fetch one exposition) → parse (select the needed
families) → engines (one dialect per serving engine) → store (reset-aware rings) → derive and latency (windowed
figures, break-even, histograms). The sidecar drives it; the probe, check and simulator reuse its arithmetic."""
