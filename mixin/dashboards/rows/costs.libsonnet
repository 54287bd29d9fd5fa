// The row: What it costs against the control pods: memory and throughput.
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

// One capacity figure of the spec-decode pods (A) and of the control pods (B, dashed).
local specAndControl(ctx, what, legend) = panels.queries([
  [ctx.side(what, 'true'), '%(legend)s with spec decode {{model_name}}' % { legend: legend }],
  [ctx.side(what, 'false'), '%(legend)s without (control) {{model_name}}' % { legend: legend }],
]);

local kvUsage(ctx) =
  panels.timeseries(
    'KV-cache usage: spec-decode pods and control pods',
    |||
      Mean KV-cache usage per engine (vLLM's kv_cache_usage_perc) over $window, spec-decode pods against control
      pods (the same model with spec decode off, spec_decode="false"). A draft model takes GPU memory, and each
      running request holds k lookahead slots: the spec-decode pods fill their cache at a smaller batch.
    |||,
    specAndControl(ctx, 'kv_cache', 'KV usage'),
    'percentunit', w=8,
  )
  + panels.min(0) + panels.max(1) + panels.overrideByQuery('B', panels.dashed);

local preemptions(ctx) =
  panels.timeseries(
    'Preemptions per request: spec-decode pods and control pods',
    |||
      vLLM's preemptions (requests evicted for want of KV-cache blocks, recomputed later) per finished request over
      $window. More than %(bound)s above the control pods': SpecDecodePreemptionsRaised, and the verdict is at best
      'Marginal' (a latency win that preempts is not paying off).
    ||| % { bound: promql.num(ctx.config.maxPreemptionsPerRequestIncrease) },
    specAndControl(ctx, 'preemptions', 'preemptions'),
    'short', w=8,
  )
  + panels.min(0) + panels.overrideByQuery('B', panels.dashed);

local throughput(ctx) =
  local waiting = promql.specPodsWaiting(ctx.metrics, ctx.scope, '$window');
  panels.timeseries(
    'Generated tokens/s per engine: spec-decode pods and control pods',
    |||
      Throughput per engine over $window, with the requests waiting on the spec-decode pods (right axis). At
      comparable load — the spec-decode pods queue at least %(waiting)s request(s), so they run at their capacity —
      below %(ratio)s of the control pods' tokens/s is SpecDecodeThroughputCut: faster tokens per request do not
      make up for fewer requests served.
    ||| % {
      waiting: promql.num(ctx.config.minWaitingRequests),
      ratio: ctx.percent(ctx.config.minThroughputRatio),
    },
    specAndControl(ctx, 'generated', 'tokens/s')
    + [panels.query(waiting, 'waiting on spec decode {{model_name}}', ref='C')],
    'si:tok/s', w=8,
  )
  + panels.min(0) + panels.overrideByQuery('B', panels.dashed)
  + panels.overrideByQuery('C', [panels.prop('unit', 'short'), panels.prop('custom.axisPlacement', 'right')]);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'What it costs against the control pods: memory and throughput (window $window)',
  panels: [kvUsage(ctx), preemptions(ctx), throughput(ctx)],
}
