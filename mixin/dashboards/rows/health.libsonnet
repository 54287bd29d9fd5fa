// The row: Health: the sidecars, their targets and the alerts firing.
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local upStat(ctx, title, description, expr, legend) =
  panels.stat(title, description, expr, 'none', legend, w=4, h=6)
  + panels.mappings(panels.upMappings) + panels.noValue('No sidecar')
  + panels.thresholds(panels.steps([[null, 'red'], [1, 'green']]));

local collectionUp(ctx) =
  upStat(
    ctx,
    'Sidecar → vLLM collection',
    |||
      %(up)s per sidecar target: 1 when the sidecar's last collection from vLLM succeeded.
    ||| % { up: ctx.metrics.up },
    'min by (instance, target) (%(up)s)' % { up: promql.selector(ctx.metrics.up, ctx.health) },
    '{{instance}} {{target}}',
  );

local scrapeUp(ctx) =
  local values = { health: ctx.health, up: promql.selector(ctx.metrics.up, ctx.health), name: ctx.metrics.up };
  upStat(
    ctx,
    'Prometheus → sidecar scrape',
    |||
      Prometheus' own up{} for the sidecar job: 0 means Prometheus cannot scrape the sidecar
      (SpecDecodeExporterDown). Only scrape targets that exported %(name)s in the last day: vLLM's own job is left
      out.
    ||| % values,
    'min by (instance) (up{%(health)s}\n  and on (job, instance) last_over_time(%(up)s[1d]))' % values,
    '{{instance}}',
  );

local collectionErrors(ctx) =
  panels.timeseries(
    'Collection errors by reason',
    |||
      Failed collections per second by reason (connect, timeout, http_status, too_large, parse, no_spec_metrics).
      no_spec_metrics after a vLLM upgrade means the metric names changed or spec decode is off.
    |||,
    // The per-target record the health alerts read.
    panels.queries([[ctx.stagedSum('collect_errors', ['reason'], ctx.health), '{{reason}}']]),
    'ops', w=6, h=6,
  )
  + panels.min(0);

local collectionDuration(ctx) =
  panels.timeseries(
    'Collection duration',
    |||
      Duration of the sidecar's last collection (fetch + parse) per target.
    |||,
    panels.queries([[
      'max by (instance, target) (%(duration)s)' % {
        duration: promql.selector(ctx.metrics.collectDuration, ctx.health),
      },
      '{{instance}} {{target}}',
    ]]),
    's', w=4, h=6,
  )
  + panels.min(0);

local firingAlerts(ctx) =
  local prefix = ctx.shape.alertPrefix;
  panels.table(
    'Firing alerts',
    |||
      Alerts named %(prefix)s* now firing (Prometheus' ALERTS series). Alerts without a model_name label (sidecar
      absent, target down) are shown whatever model is selected. See the runbook link at the top.
    ||| % { prefix: prefix },
    panels.query(
      'ALERTS{alertname=~"%(prefix)s.*", alertstate="firing", namespace=~"$namespace", model_name=~"$model_name|"}' % {
        prefix: prefix,
      },
      '{{alertname}}', instant=true, format='table',
    ),
    w=6, h=6, noValue='No alerts firing',
    exclude={ Time: true, Value: true, __name__: true, alertstate: true },
    order={ alertname: 0, severity: 1, model_name: 2 },
  );

local sidecarTargets(ctx) =
  panels.table(
    'Sidecar targets',
    |||
      %(info)s: per target the API (vllm-v1, vllm-v0, …), method and configured k.
    ||| % { info: ctx.metrics.info },
    panels.query(promql.selector(ctx.metrics.info, ctx.scope.matchers), '{{target}}', instant=true, format='table'),
    w=24, h=5, noValue='No sidecar', exclude={ Time: true, Value: true, __name__: true },
  );

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Health',
  panels: [
    collectionUp(ctx),
    scrapeUp(ctx),
    collectionErrors(ctx),
    collectionDuration(ctx),
    firingAlerts(ctx),
    sidecarTargets(ctx),
  ],
}
