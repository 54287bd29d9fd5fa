"""The HTTP server runner: uvicorn on a socket bound before start, for the sidecar, the simulator and the demo."""
