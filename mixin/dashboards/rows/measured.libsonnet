// The row: Is it paying off, measured? Latency against a baseline over $window.
local panels = import '../../lib/panels.libsonnet';

local tpotSpecVsControl(ctx) =
  panels.timeseries(
    'Time per output token: with spec decode and without',
    |||
      Mean and P99 time per output token over $window, pooled per model from the sidecars' re-export of vLLM's
      per-request histogram: spec_decode=true are the spec-decode pods, false the control pods (the same model with
      spec decode off). Spec decode should lower TPOT; it does not help time to first token.
    |||,
    panels.queries([
      [ctx.tpotMean('true'), 'mean with ' + ctx.legend],
      [ctx.tpotMean('false'), 'mean without ' + ctx.legend],
      [ctx.tpotQuantile(0.99, 'true'), 'P99 with ' + ctx.legend],
      [ctx.tpotQuantile(0.99, 'false'), 'P99 without ' + ctx.legend],
    ]),
    's', w=8,
  )
  + panels.min(0) + panels.overrideByQuery('C', panels.dashed) + panels.overrideByQuery('D', panels.dashed);

local observedVsModelled(ctx) =
  panels.timeseries(
    'Observed vs modelled speedup',
    |||
      Observed: baseline TPOT / current TPOT (mean, P50, P99), against the control pods where there are any, else
      each pod's own baseline (the best pod). Modelled: the cost model from α. P99 below 1× while P50 is above is a
      tail regression. If the two disagree, trust the observed one and read the calibrated cost. Before shipping a
      change, measure it with `specdecode-exporter probe --baseline-url`.
    |||,
    panels.queries([
      [ctx.observed('mean'), 'observed mean ' + ctx.legend],
      [ctx.observed('p50'), 'observed P50 ' + ctx.legend],
      [ctx.observed('p99'), 'observed P99 ' + ctx.legend],
      [ctx.speedup(), 'modelled ' + ctx.legend],
    ]),
    'suffix:×', w=8,
  )
  + panels.thresholds(panels.steps([[null, 'red'], [ctx.config.hurtingBelow, 'transparent']]))
  + panels.thresholdsStyle('line+area')
  + panels.overrideByQuery('D', panels.dashed);

local loadAndBreakEven(ctx) =
  local gauge(how, metric) = '%(how)s by (%(by)s) (%(gauge)s)' % {
    how: how,
    by: ctx.scope.byClause,
    gauge: ctx.windowed(metric),
  };
  panels.timeseries(
    'α against break-even at load and calibrated',
    |||
      Pooled α, with the break-even α at the current batch (the cost model's c_verify grown toward c_verify_max as
      the batch nears saturating_batch: a model) and the cost calibrated to the observed speedup (measured; where a
      baseline exists). Running requests on the right axis.
    |||,
    panels.queries([
      [ctx.alpha(), 'α ' + ctx.legend],
      [gauge('max', ctx.metrics.breakEvenAtLoad), 'break-even at load ' + ctx.legend],
      [gauge('max', ctx.metrics.calibratedCost), 'calibrated ' + ctx.legend],
      [gauge('sum', ctx.metrics.requestsRunning), 'running ' + ctx.legend],
    ]),
    'percentunit', w=8,
  )
  + panels.min(0) + panels.overrideByQuery('B', panels.dashed) + panels.overrideByQuery('C', panels.dashed)
  + panels.overrideByQuery('D', [
    panels.prop('unit', 'short'),
    panels.prop('custom.axisPlacement', 'right'),
    panels.prop('max'),
  ]);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Is it paying off, measured? (latency against a baseline, window $window)',
  panels: [tpotSpecVsControl(ctx), observedVsModelled(ctx), loadAndBreakEven(ctx)],
}
