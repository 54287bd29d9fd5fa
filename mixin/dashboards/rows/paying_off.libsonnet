// The row: Is speculative decoding paying off? The headline stats over $window.
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local alpha(ctx) =
  panels.stat(
    'Acceptance rate α',
    |||
      α = accepted draft tokens / drafted tokens over $window, pooled over the selected pods and engines (sums of
      counter rates, then divided). Red below the page threshold (%(page)s), green from %(good)s.
    ||| % { page: ctx.percent(ctx.page), good: ctx.percent(ctx.config.goodAcceptanceRatio) },
    ctx.alpha(), 'percentunit', ctx.legend,
  )
  + panels.thresholds(panels.steps(ctx.alphaSteps)) + panels.min(0) + panels.max(1) + panels.decimals(1);

local meanLength(ctx) =
  panels.stat(
    'Mean acceptance length',
    |||
      Tokens produced per target forward pass: 1 + accepted / drafts (vLLM's definition; includes the bonus
      token). 1.0 means every draft was rejected.
    |||,
    ctx.meanLength(), 'suffix: tok/step', ctx.legend,
  )
  + panels.thresholds(panels.steps([[null, 'blue']])) + panels.options({ colorMode: 'value' }) + panels.decimals(2);

local speedup(ctx) =
  panels.stat(
    'Expected speedup',
    |||
      Modelled speedup over plain decoding (docs/architecture.md, break-even model): (1 + accepted/drafts) / (1 +
      draft_tokens/drafts · configured break-even α), pooled over the selected pods. Below 1× spec decode costs
      more than it saves. A model of the cost, not a measurement: compare with the latency row, and measure it
      before you ship with `specdecode-exporter probe`.
    |||,
    ctx.speedup(), 'suffix:×', ctx.legend,
  )
  + panels.thresholds(panels.steps(ctx.speedupSteps)) + panels.decimals(2);

local breakEven(ctx) =
  panels.stat(
    'Break-even α',
    |||
      α below which spec decode costs more than it saves, from the sidecar's cost model (c_draft + c_verify, see
      the sidecar config), calibrated to the observed speedup where a baseline gives one. Highest value over the
      selected pods.
    |||,
    ctx.breakEvenInForce, 'percentunit', ctx.legend,
  )
  + panels.thresholds(panels.steps([[null, 'blue']])) + panels.options({ colorMode: 'value' }) + panels.decimals(1);

local verdictColours = { hurting: 'red', marginal: 'yellow', 'paying off': 'green' };

local verdict(ctx) =
  local config = ctx.config;
  local texts = [
    [v.code, std.asciiUpper(v.verdict[0]) + v.verdict[1:], verdictColours[v.verdict]]
    for v in ctx.shape.verdicts
  ];
  panels.stat(
    'Verdict',
    |||
      The sidecar's verdict, computed the same way (specdecode_exporter/core/contract/verdict.py, bands from the monitoring
      config), from the observed speedup where there is a baseline (control pods, or the pods' own baselines), else
      the modelled one: 'Hurting' below %(hurting)s×; 'Marginal' below %(paying)s×, with α below the page threshold
      (%(page)s), with an observed P99 speedup below %(hurting)s× (a tail regression), or, against the control
      pods, with %(preemptions)s more preemptions per request or below %(throughput)s of their tokens/s while
      requests wait (it costs memory or capacity); else 'Paying off'. 'No traffic' when the model drafted nothing
      over $window.
    ||| % {
      hurting: promql.num(config.hurtingBelow),
      paying: promql.num(config.payingOffFrom),
      page: ctx.percent(ctx.page),
      preemptions: promql.num(config.maxPreemptionsPerRequestIncrease),
      throughput: ctx.percent(config.minThroughputRatio),
    },
    promql.verdictCode(
      ctx.alpha(),
      '(%(observed)s)\nor\n(%(modelled)s)' % { observed: ctx.observed('mean'), modelled: ctx.speedup() },
      config,
      tail=ctx.observed('p99'),
      costs=ctx.capacityCosts(),
    ),
    'none', ctx.legend,
  )
  + panels.mappings(panels.noTrafficMappings + panels.valueMappings(texts))
  + panels.thresholds(panels.steps([[null, 'red'], [1, 'yellow'], [2, 'green']]));

local kAdvice(ctx) =
  local by = ctx.scope.byClause;
  local configured = 'count by (%(by)s) (count by (%(by)s, position) (%(positions)s))' % {
    by: by,
    positions: promql.selector(ctx.metrics.acceptedByPosition, ctx.scope.matchers),
  };
  local recommended = 'max by (%(by)s) (%(gauge)s)' % { by: by, gauge: ctx.windowed(ctx.metrics.recommendedK) };
  panels.stat(
    'k: configured → recommended',
    |||
      Configured k = number of draft positions the sidecar sees. Recommended k' = the sidecar's argmax of expected
      speedup over k' ≤ k over $window (highest over the selected pods).
    |||,
    '', 'none', ctx.legend,
  )
  + panels.targets([
    panels.query(configured, 'configured {{model_name}}', ref='A', instant=true),
    panels.query(recommended, 'recommended {{model_name}}', ref='B', instant=true),
  ])
  + panels.thresholds(panels.steps([[null, 'blue']])) + panels.options({ colorMode: 'value' }) + panels.decimals(0);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Is speculative decoding paying off? (window $window)',
  panels: [alpha(ctx), meanLength(ctx), speedup(ctx), breakEven(ctx), verdict(ctx), kAdvice(ctx)],
}
