// The row: Token flow.
local panels = import '../../lib/panels.libsonnet';

local tokenFlow(ctx) =
  local drafted = ctx.rate('draft_tokens');
  local accepted = ctx.rate('accepted_tokens');
  local colour(name) = [panels.prop('color', { mode: 'fixed', fixedColor: name })];
  panels.timeseries(
    'Token flow',
    |||
      Drafted, accepted and rejected (drafted − accepted) draft tokens per second, and all emitted tokens, pooled
      per model. Rejected tokens are the draft and verification work that bought nothing.
    |||,
    panels.queries([
      [drafted, 'drafted ' + ctx.legend],
      [accepted, 'accepted ' + ctx.legend],
      ['%(drafted)s\n-\n%(accepted)s' % { drafted: drafted, accepted: accepted }, 'rejected ' + ctx.legend],
      [ctx.rate('series_emitted'), 'emitted ' + ctx.legend],
    ]),
    'si:tok/s', w=8,
  )
  + panels.min(0) + panels.overrideByQuery('C', colour('red')) + panels.overrideByQuery('B', colour('green'));

local draftsRate(ctx) =
  panels.timeseries(
    'Verification steps with a draft',
    |||
      Drafts per second (one per request per engine step that carried a draft), per model.
    |||,
    panels.queries([[ctx.rate('drafts'), ctx.legend]]),
    'reqps', w=8,
  )
  + panels.min(0);

local meanDraftLengthOverTime(ctx) =
  panels.timeseries(
    'Mean draft length (k̄, sidecar gauge)',
    |||
      %(gauge)s{window="$window"}: drafted tokens per draft as the engine counted them, never assumed equal to k.
      Below k when a batch-size schedule (vLLM's num_speculative_tokens_per_batch_size, TensorRT-LLM's
      draft_len_schedule), adaptive verification or short ngram lookups draft fewer tokens; absent where the
      engine counts no drafts.
    ||| % { gauge: ctx.metrics.meanDraftLength },
    panels.queries([
      [ctx.windowed(ctx.metrics.meanDraftLength), '{{model_name}} {{pod}}{{instance}} engine {{engine}}'],
    ]),
    'suffix: tok/step', w=8,
  )
  + panels.min(0);

// The row: its title, and its panels left to right (wrapping at 24 columns). A new panel is a function above and
// its name here.
function(ctx) {
  title: 'Token flow',
  panels: [tokenFlow(ctx), draftsRate(ctx), meanDraftLengthOverTime(ctx)],
}
