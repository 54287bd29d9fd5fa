// The row: How is α distributed? The per-interval histogram the tickets read.
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local intervalHeatmap(ctx) =
  panels.acceptanceHeatmap(
    'Per-interval α distribution',
    |||
      One observation per sidecar collection interval that had drafts: that interval's α (histogram %(histogram)s,
      buckets of 5 points). Mass below the page threshold means spec decode is net-negative that share of the time,
      even if the mean looks fine.
    ||| % { histogram: ctx.metrics.intervalAcceptance },
    ctx.pooled.increaseByLe('interval', ctx.rateInterval),
    'No traffic',
  );

local intervalQuantiles(ctx) =
  panels.timeseries(
    'Per-interval α: P10 / P50 / P90',
    |||
      Quantiles of the per-interval α histogram over $window (interpolated within 5-point buckets). P10 below
      %(page)s means at least a tenth of the intervals were net-negative (the SpecDecodeIntervalAcceptanceLow
      alert).
    ||| % { page: ctx.percent(ctx.page) },
    panels.queries([
      [ctx.pooled.quantile(quantile, 'interval', '$window'), 'P%(percent)d %(legend)s' % {
        percent: std.round(quantile * 100),
        legend: ctx.legend,
      }]
      for quantile in [0.1, 0.5, 0.9]
    ]),
    'percentunit', w=8, h=9,
  )
  + panels.min(0) + panels.max(1) + panels.thresholds(panels.steps(ctx.belowPageBand))
  + panels.thresholdsStyle('line+area');

local intervalsBelowPage(ctx) =
  panels.stat(
    'Intervals with α < %(page)s' % { page: ctx.percent(ctx.page) },
    |||
      Share of collection intervals over $window whose α was below %(page)s (the histogram's le="%(bound)s" bucket
      over its count).
    ||| % { page: ctx.percent(ctx.page), bound: promql.num(ctx.page) },
    ctx.pooled.shareBelow('interval', ctx.page, '$window'),
    'percentunit', ctx.legend, w=4, h=9,
  )
  + panels.thresholds(panels.steps([[null, 'green'], [0.1, 'yellow'], [0.25, 'red']]))
  + panels.options({ graphMode: 'area' }) + panels.decimals(1);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'How is α distributed?',
  panels: [intervalHeatmap(ctx), intervalQuantiles(ctx), intervalsBelowPage(ctx)],
}
