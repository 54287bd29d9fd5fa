"""Benchmarks for specdecode-exporter (issue #7). Entry point: ``python bench/run.py`` (``make bench``)."""
