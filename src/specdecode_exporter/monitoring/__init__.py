"""Build time: the recording and alerting rules (rules), the Grafana dashboard (dashboard, needs the `dashboard`
extra), the shared PromQL (promql) and the one command that writes them all with the Kubernetes objects and the
mixin (build). The running sidecar never imports this package."""
