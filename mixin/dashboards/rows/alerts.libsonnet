// The row: What the alerts see.
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local alertsAlpha(ctx) =
  local config = ctx.config;
  local shape = ctx.shape;
  local select(record) = promql.selector(record, ctx.ruleMatchers);
  local values = {
    short: config.shortWindow,
    long: shape.longWindow,
    shortRecord: shape.records.alpha % { window: config.shortWindow },
    longRecord: shape.records.alpha % { window: shape.longWindow },
    baseline: shape.records.baseline,
    range: shape.baselineRange,
    offset: config.baselineOffset,
    page: ctx.percent(ctx.page),
    drop: promql.num(config.driftDrop),
    dropPercent: ctx.percent(config.driftDrop),
    legend: ctx.legend,
  };
  panels.timeseries(
    'α as the alerts see it (recording rules)',
    |||
      The recording rules the alerts fire on (%(shortRecord)s, %(longRecord)s; the alert level's filters only:
      these are per model). Red band: the page (critical) threshold %(page)s. Dashed: the %(range)s baseline
      (%(baseline)s, ending %(offset)s ago) and the drift threshold %(dropPercent)s below it
      (SpecDecodeAcceptanceRateDrift); they need %(range)s of history.
    ||| % values,
    panels.queries([
      [select(values.shortRecord), '%(short)s %(legend)s' % values],
      [select(values.longRecord), '%(long)s %(legend)s' % values],
      [select(values.baseline), '%(range)s baseline %(legend)s' % values],
      [
        select(values.baseline) + ' - ' + values.drop,
        'drift threshold (baseline − %(dropPercent)s) %(legend)s' % values,
      ],
    ]),
    'percentunit',
  )
  + panels.overrideByQuery('C', panels.dashed) + panels.overrideByQuery('D', panels.dashed)
  + panels.min(0) + panels.max(1) + panels.thresholds(panels.steps(ctx.belowPageBand))
  + panels.thresholdsStyle('line+area');

local intervalQuantiles(ctx) =
  panels.timeseries(
    'Per-interval α quantiles (recording rules)',
    |||
      The quantile recording rules behind SpecDecodeIntervalAcceptanceLow (over %(long)s).
    ||| % { long: ctx.shape.longWindow },
    panels.queries([
      [promql.selector(q.record, ctx.ruleMatchers), '%(name)s %(legend)s' % {
        name: std.asciiUpper(q.name),
        legend: ctx.legend,
      }]
      for q in ctx.shape.intervalQuantiles
    ]),
    'percentunit',
  )
  + panels.min(0) + panels.max(1);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'What the alerts see',
  panels: [alertsAlpha(ctx), intervalQuantiles(ctx)],
}
