// The row: Routing: the traffic spec decode slows down, sent to a pool without it (tap.route).
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

// The labels of a routed class.
local routeClass = ['model_name', 'workload', 'temperature', 'prompt_length'];

local routedClasses(ctx) =
  local state = promql.selector(ctx.metrics.routeClassState, ctx.tapped.matchers);
  panels.timeseries(
    'Classes routed to the pool without spec decode',
    |||
      1 while the request tap (tap.route) sends a class of requests (model, workload, temperature band, and
      prompt-length band where configured) to the fallback pool: a block of its requests showed α below the
      break-even. A class routed for long is the SpecDecodeClassRouted ticket: its draft needs attention.
    |||,
    panels.queries([[
      'max by (%(by)s) (%(state)s)' % { by: promql.by(routeClass), state: state },
      '{{model_name}} {{workload}} T {{temperature}} {{prompt_length}}',
    ]]),
    'none', w=8, h=8,
  )
  + panels.min(0) + panels.max(1) + panels.decimals(0);

local routedRequests(ctx) =
  panels.timeseries(
    'Requests by pool and reason',
    |||
      Completions through a routing tap: to the speculative pool (unrouted classes, and the canary of routed ones)
      or to the fallback (benefit); fallback_down: meant for the fallback, which was unreachable. In observe mode
      the fallback counts say where enforce mode would have sent them.
    |||,
    panels.queries([[ctx.stagedSum('route_requests_by_pool', ['upstream', 'reason']), '{{upstream}} {{reason}}']]),
    'reqps', w=8, h=8,
  )
  + panels.min(0);

local routedSpeedup(ctx) =
  local measured = promql.selector(ctx.metrics.routeMeasuredSpeedup, ctx.tapped.matchers);
  panels.timeseries(
    'Measured speedup of routed classes (randomized canary)',
    |||
      Per routed class: mean latency on the fallback / mean latency of its canary (the random share still served
      with speculative decoding), for time per output token and end to end. Below 1× the fallback is faster, as
      routing assumed; the most direct measure of what spec decode does for this traffic.
    |||,
    panels.queries([[
      'max by (%(by)s) (%(measured)s)' % { by: promql.by(routeClass + ['latency']), measured: measured },
      '{{model_name}} {{workload}} T {{temperature}} {{latency}}',
    ]]),
    'suffix:×', w=8, h=8,
  )
  + panels.thresholds(panels.steps([[null, 'red'], [ctx.config.hurtingBelow, 'transparent']]))
  + panels.thresholdsStyle('line+area') + panels.custom({ axisSoftMin: 0.5, axisSoftMax: 1.5 });

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Routing: the traffic spec decode slows down, sent to a pool without it (tap.route)',
  panels: [routedClasses(ctx), routedRequests(ctx), routedSpeedup(ctx)],
}
