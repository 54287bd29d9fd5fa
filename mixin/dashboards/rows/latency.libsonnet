// The row: Latency beside it (vLLM).
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local quantiles = [[0.5, 'p50'], [0.99, 'p99']];

// vLLM's TPOT histogram as the sidecars export it, from the rules' stage: cheap at any range.
local tpotQuantiles(ctx) =
  panels.timeseries(
    'Time per output token (vLLM) p50 / p99',
    |||
      vLLM's per-request TPOT histogram (true time per generated token; vLLM ≥ 0.11), as the sidecars export it
      (reset-safe; spec_decode=false: control pods), per model from the rules' one-minute stage. This is what spec
      decode should lower: read it beside α.
    |||,
    panels.queries([
      [
        ctx.pooled.quantile(q[0], 'tpot', ctx.rateInterval, byAlso=['spec_decode']),
        '%(name)s {{model_name}} spec_decode={{spec_decode}}' % { name: q[1] },
      ]
      for q in quantiles
    ]),
    's', w=8,
  )
  + panels.min(0);

// P50 and P99 of vLLM's inter-token latency, per model, from vLLM's own series (the sidecar does not export it:
// the one panel that ranges over raw series).
local itlQuantiles(ctx) =
  panels.timeseries(
    'Inter-token latency (vLLM) p50 / p99',
    |||
      vLLM's inter-token latency: one sample per engine step, which emits 1 … k+1 tokens under spec decode, so it
      rises while TPOT falls when acceptance is good.
    |||,
    panels.queries([
      [
        promql.histogramQuantile(q[0], 'vllm:inter_token_latency_seconds', ctx.vllm, ctx.rateInterval),
        '%(name)s {{model_name}}' % { name: q[1] },
      ]
      for q in quantiles
    ]),
    's', w=8,
  )
  + panels.min(0);

local load(ctx) =
  local running = 'sum by (model_name) (%(running)s)' % {
    running: promql.selector('vllm:num_requests_running', ctx.vllm.matchers),
  };
  panels.timeseries(
    'Running requests and generated tokens (vLLM)',
    |||
      Load context: requests running (left) and vLLM's generated tokens per second (right). Acceptance and the
      verification cost both move with batch size.
    |||,
    panels.queries([
      [running, 'running {{model_name}}'],
      [ctx.stagedSum('generated', ['model_name']), 'generated {{model_name}}'],
    ]),
    'short', w=8,
  )
  + panels.min(0)
  + panels.overrideByQuery('B', [panels.prop('unit', 'si:tok/s'), panels.prop('custom.axisPlacement', 'right')]);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Latency beside it (vLLM)',
  panels: [tpotQuantiles(ctx), itlQuantiles(ctx), load(ctx)],
}
