// The row: Acceptance over time.
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local perPodLegend = '{{model_name}} {{pod}}{{instance}} engine {{engine}}';

local alphaOverTime(ctx) =
  panels.timeseries(
    'α over time vs break-even',
    |||
      Pooled α per model over a sliding $window (from counters), with the sidecar's break-even α dashed. The red
      band is below the page threshold (%(page)s).
    ||| % { page: ctx.percent(ctx.page) },
    panels.queries([[ctx.alpha(), 'α ' + ctx.legend],
                    [ctx.breakEvenInForce, 'break-even ' + ctx.legend]]),
    'percentunit',
  )
  + panels.min(0) + panels.max(1) + panels.thresholds(panels.steps(ctx.belowPageBand))
  + panels.thresholdsStyle('line+area') + panels.overrideByQuery('B', panels.dashed);

local speedupOverTime(ctx) =
  panels.timeseries(
    'Expected speedup over time',
    |||
      Modelled speedup per model; the line at %(hurting)s× is break-even, below it spec decode hurts.
    ||| % { hurting: promql.num(ctx.config.hurtingBelow) },
    panels.queries([[ctx.speedup(), ctx.legend]]),
    'suffix:×',
  )
  + panels.thresholds(panels.steps([[null, 'red'], [ctx.config.hurtingBelow, 'transparent']]))
  + panels.thresholdsStyle('line+area') + panels.custom({ axisSoftMin: 0.5, axisSoftMax: 2 });

local alphaByPod(ctx) =
  panels.timeseries(
    'α by pod and engine (sidecar gauge)',
    |||
      %(gauge)s{window="$window"} as each sidecar computes it — one line per target and data-parallel engine, to
      find the one bad pod. Not averaged: pooled values are in the panel on the left.
    ||| % { gauge: ctx.metrics.acceptanceRatio },
    panels.queries([[ctx.windowed(ctx.metrics.acceptanceRatio), perPodLegend]]),
    'percentunit',
  )
  + panels.min(0) + panels.max(1) + panels.thresholds(panels.steps(ctx.alphaSteps))
  + panels.thresholdsStyle('dashed');

local meanLengthOverTime(ctx) =
  panels.timeseries(
    'Mean acceptance length and token acceptance probability',
    |||
      Mean acceptance length (tokens per target forward pass, left axis) and Leviathan's per-token acceptance
      probability (right axis; a different quantity from α, from the sidecar's per-position fit).
    |||,
    panels.queries([
      [ctx.meanLength(), 'mean length ' + ctx.legend],
      [ctx.windowed(ctx.metrics.tokenAcceptanceProbability), 'per-token p ' + perPodLegend],
    ]),
    'suffix: tok/step',
  )
  + panels.overrideByQuery('B', [
    panels.prop('unit', 'percentunit'),
    panels.prop('min', 0),
    panels.prop('max', 1),
    panels.prop('custom.axisPlacement', 'right'),
  ]);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Acceptance over time',
  panels: [alphaOverTime(ctx), speedupOverTime(ctx), alphaByPod(ctx), meanLengthOverTime(ctx)],
}
