"""Development tools that are not part of the sidecar: process helpers for tests and benchmarks, and the
alert chain behind `make see-it-work`. Not shipped in the package."""
