// The row: Per request: which traffic does spec decode hurt? (the request tap)
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local requestHeatmap(ctx) =
  panels.acceptanceHeatmap(
    'Per-request α over time',
    |||
      One observation per completion request through the request tap: that request's own α from vLLM's per-request
      metrics (--per-request-spec-decode-metrics summary). A band of mass below the page threshold is traffic spec
      decode slows down, however healthy the aggregate α looks. Empty without the tap (--tap.listen-address).
    |||,
    ctx.pooled.increaseByLe('request', ctx.rateInterval),
    'No tapped requests',
  );

// The largest of the ascending bucket bounds at or below x: the per-request histogram's bucket the page
// threshold falls on.
local bucketAtOrBelow(bounds, x) = std.foldl(function(best, b) if b <= x + 1e-9 then b else best, bounds, null);

local requestsBelowPage(ctx) =
  local bound = bucketAtOrBelow(ctx.shape.acceptanceBuckets, ctx.page);
  local quantile = ctx.shape.requestQuantile;
  local name = std.asciiUpper(quantile.name);
  local either(query) = '%(tap)s\nor\n%(engine)s' % { tap: query('request'), engine: query('engine_request') };
  local share = either(function(histogram) ctx.pooled.shareBelow(histogram, bound, '$window'));
  local low = either(function(histogram) ctx.pooled.quantile(quantile.quantile, histogram, '$window'));
  panels.stat(
    'Requests with α ≤ %(bound)s' % { bound: promql.num(bound) },
    |||
      Share of tapped requests over $window whose own α was at most %(bound)s (the page threshold's bucket), and
      the %(name)s of per-request α. A %(name)s below the page threshold is the SpecDecodeRequestAcceptanceLow
      ticket. Without the tap, from vLLM's own per-request histogram where it exports one
      (specdecode_engine_request_acceptance_ratio).
    ||| % { bound: promql.num(bound), name: name },
    share, 'percentunit', ctx.legend, w=4, h=9,
  )
  + panels.targets([
    panels.query(share, 'share ' + ctx.legend, ref='A', instant=true),
    panels.query(low, '%(name)s α %(legend)s' % { name: name, legend: ctx.legend }, ref='B', instant=true),
  ])
  + panels.thresholds(panels.steps([[null, 'green'], [0.1, 'yellow'], [0.25, 'red']]))
  + panels.decimals(1) + panels.noValue('No tapped requests');

local bandAlpha(ctx, label) = ctx.pooled.ratio('request_accepted', 'request_drafted', '$window', byAlso=[label]);

local alphaByBand(ctx) =
  panels.timeseries(
    'α by temperature band and by workload',
    |||
      Exact α of the tapped requests (their accepted over their drafted tokens) per temperature band and per
      workload (the tap's workload header). The band that sits below the page threshold is the one to route away
      from spec decode (SpecDecodeBandAcceptanceLow).
    |||,
    panels.queries([
      [bandAlpha(ctx, 'temperature'), 'T {{temperature}} {{model_name}}'],
      [bandAlpha(ctx, 'workload'), '{{workload}} {{model_name}}'],
    ]),
    'percentunit', w=8, h=9,
  )
  + panels.min(0) + panels.max(1) + panels.thresholds(panels.steps(ctx.belowPageBand))
  + panels.thresholdsStyle('line+area') + panels.overrideByQuery('B', panels.dashed);

local speedByAcceptance(ctx) =
  panels.timeseries(
    'Request speed by acceptance band',
    |||
      Mean generation speed (output tokens per second) of the tapped requests in each band of their own α: are the
      low-α requests the slow ones? (The distribution: specdecode_request_output_tokens_per_second.)
    |||,
    panels.queries([[
      ctx.pooled.ratio('request_speed_sum', 'request_speed_count', '$window', byAlso=['acceptance']),
      'α {{acceptance}} {{model_name}}',
    ]]),
    'si:tok/s', w=12, h=8,
  )
  + panels.min(0);

local requestsWithoutMetrics(ctx) =
  panels.timeseries(
    'Tapped requests without spec-decode metrics',
    |||
      By reason: not_enabled means vLLM runs without --per-request-spec-decode-metrics; n_gt_1 and multi_prompt
      are requests vLLM gives no per-request figures for; the rest are failures.
    |||,
    panels.queries([[ctx.stagedSum('requests_without_spec', ['reason']), '{{reason}}']]),
    'reqps', w=12, h=8,
  )
  + panels.min(0);

// The variance per drafted token the page divides by: measured on the tapped requests, or assumed.
local pageVariance(ctx) =
  local gauge = promql.selector(ctx.metrics.acceptanceVariance, ctx.tapped.also(['window="$window"']));
  local records = ctx.shape.records;
  panels.timeseries(
    "The page's variance per drafted token: measured or assumed",
    |||
      What the page's test divides by. Per sidecar over $window: source=measured, the upper confidence bound of v
      measured on the tapped requests (never below α(1 − α)), once the window holds statistics.min_requests
      requests; source=assumed, the monitoring config's bound (draft_tokens_per_request, request_acceptance_sd).
      Dashed: the rules' bound over the fleet (the hour before the last 10 minutes), which the page uses where it
      exists. Right axis: the tapped requests of the last hour it rests on. Measured above assumed for an hour is
      SpecDecodeDispersionAboveAssumed.
    |||,
    panels.queries([
      ['max by (model_name, source) (%(gauge)s)' % { gauge: gauge }, '{{source}} {{model_name}}'],
      [promql.selector(records.varianceBound, ctx.ruleMatchers), "page's bound {{model_name}}"],
      [promql.selector(records.tappedRequests, ctx.ruleMatchers), 'requests (1h) {{model_name}}'],
    ]),
    'short', w=24, h=8,
  )
  + panels.min(0) + panels.overrideByQuery('B', panels.dashed)
  + panels.overrideByQuery('C', [panels.prop('unit', 'short'), panels.prop('custom.axisPlacement', 'right')]);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Per request: which traffic does spec decode hurt? (the request tap)',
  panels: [
    requestHeatmap(ctx),
    alphaByBand(ctx),
    requestsBelowPage(ctx),
    speedByAcceptance(ctx),
    requestsWithoutMetrics(ctx),
    pageVariance(ctx),
  ],
}
