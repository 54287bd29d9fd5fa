// The row: Is it still speculating? Which k at which batch size?
local panels = import '../../lib/panels.libsonnet';
local promql = import '../../lib/promql.libsonnet';

local speculativeShare(ctx) =
  // The records SpecDecodeSpeculationStopped reads, per engine.
  local rate(key) = ctx.stage.rate(key, ctx.rateInterval, [ctx.engines]);
  local stopped = ctx.config.speculationShareBelow;
  panels.timeseries(
    'Speculative token share',
    |||
      Share of each engine's generated tokens that speculative steps produced: (drafts + accepted) / generated
      tokens. 1 while every step speculates (a little below: each request's first token comes from prefill), 0 once
      speculation stopped while the engine still generates: an acceptance gate (TensorRT-LLM switches it off for
      good), a batch-size schedule at k = 0, an ngram drafter that finds nothing. Below %(stopped)s:
      SpecDecodeSpeculationStopped.
    ||| % { stopped: ctx.percent(stopped) },
    panels.queries([[
      promql.guardedRatio(rate('series_emitted'), rate('series_generated')),
      '{{instance}} {{target}} engine {{engine}}',
    ]]),
    'percentunit', w=6,
  )
  + panels.min(0) + panels.max(1) + panels.thresholds(panels.steps([[null, 'red'], [stopped, 'transparent']]))
  + panels.thresholdsStyle('line+area');

local scheduledSteps(ctx) =
  panels.timeseries(
    'Scheduler steps by the k the schedule chose',
    |||
      Where vLLM exports it (vllm:spec_decode_scheduled_steps, proposed upstream in vllm#54748): scheduler steps
      per second by the number of speculative tokens a batch-size schedule (num_speculative_tokens_per_batch_size)
      chose, 0 included. Steps at k = 0 are speculation stopped on purpose. Empty for every released vLLM.
    |||,
    panels.queries([[
      ctx.pooled.rate('scheduled_steps', ctx.rateInterval, byAlso=['num_speculative_tokens']),
      'k={{num_speculative_tokens}} {{model_name}}',
    ]]),
    'short', w=6,
  )
  + panels.min(0) + panels.custom({ stacking: { mode: 'normal' } });

local scheduleTable(ctx) =
  local recommended = 'max by (%(by)s, batch_size) (%(gauge)s)' % {
    by: ctx.scope.byClause,
    gauge: promql.selector(ctx.metrics.recommendedKByBatchSize, ctx.scope.matchers),
  };
  panels.table(
    'Recommended k by batch size',
    |||
      The sidecar's batch-size schedule over its longest window: for each range of running requests, the k with the
      highest modelled speedup (the acceptance seen at that batch size, the cost model's c_verify at that batch,
      calibrated to the observed speedup where a baseline gives one). Paste it as vLLM's
      num_speculative_tokens_per_batch_size or TensorRT-LLM's draft_len_schedule: the status page and `check` print
      both. Highest over the selected pods.
    |||,
    panels.query(recommended, instant=true, format='table'),
    w=4, h=8, noValue='No schedule yet',
    exclude={ Time: true }, order={ model_name: 0, batch_size: 1, Value: 2 },
  );

local scheduleGain(ctx) =
  local by = ctx.scope.byClause;
  local speedup(schedule) = 'max by (%(by)s, batch_size) (%(gauge)s)' % {
    by: by,
    gauge: promql.selector(ctx.metrics.expectedSpeedupByBatchSize,
                           ctx.scope.also(['schedule="%(schedule)s"' % { schedule: schedule }])),
  };
  local gain = 'max by (%(by)s) (%(gauge)s)' % {
    by: by,
    gauge: promql.selector(ctx.metrics.scheduleExpectedGain, ctx.scope.matchers),
  };
  panels.timeseries(
    'Modelled speedup by batch size: fixed k against the schedule',
    |||
      The evidence for the schedule: the modelled speedup over plain decoding in each batch-size range with today's
      fixed k (dashed) and with the recommended k, and the schedule's expected gain over fixed k with each range
      weighted by the time the engines spent there (right axis). Modelled, not measured: measure a change with
      `specdecode-exporter probe`.
    |||,
    panels.queries([
      [speedup('fixed'), 'fixed k {{batch_size}}'],
      [speedup('recommended'), 'schedule {{batch_size}}'],
      [gain, 'expected gain {{model_name}}'],
    ]),
    'suffix:×', w=8,
  )
  + panels.overrideByQuery('A', panels.dashed);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Is it still speculating? Which k at which batch size?',
  panels: [speculativeShare(ctx), scheduledSteps(ctx), scheduleTable(ctx), scheduleGain(ctx)],
}
