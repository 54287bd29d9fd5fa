"""The statistics behind every alert on a ratio: what a window of counters proves (evidence) and the variance per
drafted token, measured on the user's traffic (dispersion)."""
