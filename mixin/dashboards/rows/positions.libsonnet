// The row: Where along the draft does acceptance fall off, and which k is better?
local panels = import '../../lib/panels.libsonnet';

local positionCurve(ctx) =
  local rate(key) = ctx.stage.rate(key, '$window', [ctx.ruleMatchers]);
  local curve = 'sum by (position) (%(accepted)s)\n/ on () group_left ()\n(sum (%(drafts)s) > 0)' % {
    accepted: rate('accepted_by_position'),
    drafts: rate('drafts'),
  };
  panels.barchart(
    'Acceptance by draft position (now)',
    |||
      P(accepted prefix > i) for each draft position i over $window: per-position accepted counts / drafts, pooled
      over the selected pods (pick one model for a clean curve). Where it falls off, later draft tokens are mostly
      wasted work.
    |||,
    panels.query(curve, '{{position}}', instant=true, format='table'),
    'percentunit', w=8, h=9,
  )
  + {
    transformations: [
      {
        id: 'convertFieldType',
        options: { conversions: [{ targetField: 'position', destinationType: 'number' }], fields: {} },
      },
      { id: 'sortBy', options: { fields: {}, sort: [{ field: 'position', desc: false }] } },
      {
        id: 'organize',
        options: { excludeByName: { Time: true }, indexByName: {}, renameByName: { Value: 'P(prefix > i)' } },
      },
    ],
  }
  + panels.options({ xField: 'position' }) + panels.min(0) + panels.max(1)
  + panels.thresholds(panels.steps(ctx.alphaSteps));

local positionCurveOverTime(ctx) =
  local expr = '%(accepted)s\n/ on (%(by)s) group_left ()\n(%(drafts)s > 0)' % {
    accepted: ctx.pooled.rate('accepted_by_position', '$window', byAlso=['position']),
    by: ctx.scope.byClause,
    drafts: ctx.pooled.rate('drafts', '$window'),
  };
  panels.timeseries(
    'Acceptance by draft position over time',
    |||
      The same curve over time, one line per position: a drop that starts at a late position is a draft getting
      stale; a drop at position 0 is a task-mix or temperature change.
    |||,
    panels.queries([[expr, 'pos {{position}} {{model_name}}']]),
    'percentunit', w=8, h=9,
  )
  + panels.min(0) + panels.max(1);

local speedupByLength(ctx) =
  local expr = 'avg by (model_name, num_speculative_tokens) (%(gauge)s)' % {
    gauge: ctx.windowed(ctx.metrics.expectedSpeedupByLength),
  };
  panels.bargauge(
    "Expected speedup by k'",
    |||
      The sidecar's modelled speedup for each shorter k' ≤ k, from the per-position curve over $window (mean over
      the selected sidecars). The longest bar is the k to configure; compare with 'k: configured → recommended'
      above.
    |||,
    panels.query(expr, "k'={{num_speculative_tokens}} {{model_name}}", instant=true),
    'suffix:×', w=8, h=9,
  )
  + panels.decimals(2) + panels.min(0) + panels.thresholds(panels.steps(ctx.speedupSteps));

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Where along the draft does acceptance fall off, and which k is better?',
  panels: [positionCurve(ctx), positionCurveOverTime(ctx), speedupByLength(ctx)],
}
