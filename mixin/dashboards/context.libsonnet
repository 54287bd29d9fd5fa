// What every panel reads: _config, the shape (shape.libsonnet), and the selectors and queries built from them.
// A row is a function of this context; new(config, shape) makes it.
local promql = import '../lib/promql.libsonnet';
local stageReader = import '../lib/stage.libsonnet';

// The variables every dashboard has; labels of the alert level that are not among them get their own.
local standardVariables = ['namespace', 'job', 'model_name', 'engine', 'pod', 'instance'];
local rateInterval = '$__rate_interval';

// Label matchers that select each label by the dashboard variable of its name.
local byVariables(names) = std.join(', ', [name + '=~"$' + name + '"' for name in names]);

{
  new(config, shape):: {
    local ctx = self,
    config: config,
    shape: shape,
    metrics: shape.metrics,
    page: config.pageAcceptanceRatio,
    rateInterval: rateInterval,

    local levelLabels = shape.levelLabels,
    extraVariables: [label for label in levelLabels if !std.member(standardVariables, label)],
    local extra = self.extraVariables,

    // The sidecar's series under every variable, pooled by the alert level (per model).
    scope: promql.scope(byVariables(extra + ['namespace', 'job', 'pod', 'instance', 'model_name', 'engine']),
                        levelLabels),
    // The request tap's series: per model (they have no engine label), by the alert level.
    tapped: promql.scope(byVariables(extra + ['namespace', 'job', 'pod', 'instance', 'model_name']), levelLabels),
    // The stage's per-engine records (the speculation-stopped test's): scrape and engine identity, no pod.
    engines: byVariables(extra + ['namespace', 'job', 'instance', 'model_name', 'engine']),
    // Health series may lack model_name (a target that never answered): scrape identity only.
    health: byVariables(extra + ['namespace', 'job', 'pod', 'instance']),
    // vLLM's own series come from another scrape job and port: pod and model identity only.
    vllm: promql.scope(byVariables(extra + ['namespace', 'pod', 'model_name', 'engine']), ['model_name']),
    // The rules' records carry the alert level's labels only.
    ruleMatchers: byVariables(levelLabels),
    legend: std.join(' ', ['{{model_name}}'] + ['{{' + label + '}}' for label in levelLabels if label != 'model_name']),

    // Per-model panels read the rules' short stage, never the pods' raw series over a window.
    stage: stageReader.new(shape.stage, shape.stageSteps, shape.stageClock),
    pooled: self.stage.pooled(self.ruleMatchers, levelLabels),

    // The colours of α and of a speedup, and the red band below the page threshold.
    alphaSteps: [[null, 'red'], [config.pageAcceptanceRatio, 'yellow'], [config.goodAcceptanceRatio, 'green']],
    speedupSteps: [[null, 'red'], [config.hurtingBelow, 'yellow'], [config.payingOffFrom, 'green']],
    belowPageBand: [[null, 'red'], [config.pageAcceptanceRatio, 'transparent']],

    // A number as a percentage, as the descriptions write it: 0.5 -> 50%.
    percent(ratio):: promql.percent(ratio),

    // A counter's rate from the stage's record of it, summed by the labels a panel splits on. `matchers`: the
    // record's own labels to select on (the models' by default).
    stagedSum(key, byLabels, matchers='', window=rateInterval):: 'sum by (%(by)s) (%(rate)s)' % {
      by: promql.by(byLabels),
      rate: ctx.stage.rate(key, window, [if matchers == '' then ctx.ruleMatchers else matchers]),
    },

    // A counter's rate per model, from the stage's record of it.
    rate(key, window=rateInterval):: ctx.pooled.rate(key, window),

    alpha(window='$window'):: ctx.pooled.ratio('accepted_tokens', 'draft_tokens', window),

    meanLength():: '1 + ' + ctx.pooled.ratio('accepted_tokens', 'drafts', '$window'),

    breakEven: promql.breakEven(self.metrics.breakEven, self.scope),
    breakEvenInForce: promql.breakEvenInForce(self.metrics.breakEven, self.scope),

    // The modelled speedup from the pooled counters and the configured break-even:
    // (1 + A/D) / (1 + T/D · break-even).
    speedup()::
      local rate(key) = ctx.pooled.rate(key, '$window');
      '(1 + %(accepted)s / %(drafts)s)\n/\n(1 + %(drafted)s / %(drafts)s\n   * %(breakEven)s)' % {
        accepted: rate('accepted_tokens'),
        drafted: rate('draft_tokens'),
        drafts: '(%(rate)s > 0)' % { rate: rate('drafts') },
        breakEven: ctx.breakEven,
      },

    // The sidecars' pooled TPOT for spec-decode ("true") or control ("false") pods, exact from _sum/_count.
    tpotMean(specDecode):: ctx.pooled.ratio('tpot_sum', 'tpot_count', '$window', ['spec_decode="%(side)s"' % {
      side: specDecode,
    }], byAlso=['spec_decode']),

    tpotQuantile(quantile, specDecode):: ctx.pooled.quantile(quantile, 'tpot', '$window', [
      'spec_decode="%(side)s"' % { side: specDecode },
    ], byAlso=['spec_decode']),

    // One of the sidecar's windowed gauges, at the dashboard's window.
    windowed(metric, more=[]):: promql.selector(metric, ctx.scope.also(['window="$window"'] + more)),

    // Observed speedup per model: the fleet's (control pods' TPOT over spec-decode pods') where there are control
    // pods, else the best pod's own (against its control target or measured baseline). `statistic`: mean, p50, p99.
    observed(statistic)::
      local quantile = { mean: null, p50: 0.5, p99: 0.99 }[statistic];
      local side(specDecode) =
        if quantile == null then ctx.tpotMean(specDecode) else ctx.tpotQuantile(quantile, specDecode);
      '((%(control)s)\n/ ignoring (spec_decode)\n(%(spec)s > 0))\nor\n%(pods)s' % {
        control: side('false'),
        spec: side('true'),
        pods: 'max by (%(by)s) (%(gauge)s)' % {
          by: ctx.scope.byClause,
          gauge: ctx.windowed(ctx.metrics.observedSpeedup, ['statistic="%(statistic)s"' % { statistic: statistic }]),
        },
      },

    // A capacity figure of the spec-decode ("true") or control ("false") pods over $window: preemptions per
    // request, generated tokens per engine, KV-cache usage.
    side(what, specDecode)::
      local marked = ['spec_decode="%(side)s"' % { side: specDecode }];
      local ratio(numerator, denominator) =
        ctx.pooled.ratio(numerator, denominator, '$window', marked, byAlso=['spec_decode']);
      {
        preemptions: ratio('preemptions', 'tpot_count'),
        generated: ratio('generated', 'engines'),
        kv_cache: ctx.pooled.rate('kv_cache', '$window', marked, byAlso=['spec_decode']),
      }[what],

    // The verdict's capacity conditions against the control pods over $window (core/contract/verdict.py): 1 within the
    // bounds, 0 beyond.
    capacityCosts()::
      local values = {
        spec: ctx.side('preemptions', 'true'),
        control: ctx.side('preemptions', 'false'),
        specGenerated: ctx.side('generated', 'true'),
        controlGenerated: ctx.side('generated', 'false'),
        by: ctx.scope.byClause,
        waiting: promql.specPodsWaiting(ctx.metrics, ctx.scope, '$window'),
        minWaiting: promql.num(config.minWaitingRequests),
        maxIncrease: promql.num(config.maxPreemptionsPerRequestIncrease),
        minThroughput: promql.num(config.minThroughputRatio),
      };
      local increase = '(%(spec)s)\n- ignoring (spec_decode)\n(%(control)s)' % values;
      local throughput = |||
        (%(specGenerated)s)
        / ignoring (spec_decode)
        (%(controlGenerated)s > 0)
        and on (%(by)s)
        (%(waiting)s >= %(minWaiting)s)
      ||| % values;
      [
        '(%(increase)s) <= bool %(maxIncrease)s' % (values { increase: increase }),
        '(%(throughput)s) >= bool %(minThroughput)s' % (values { throughput: std.rstripChars(throughput, '\n') }),
      ],
  },
}
