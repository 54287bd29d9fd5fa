// Reading the rules' short stage (docs/fleet.md, "Two stages"): each raw counter the panels need is recorded per
// model, at every step of its stage group, as its increase over that step. A panel reads those records over any
// window, one series per model instead of one per pod: a rate is their mean over the step, a count their sum.
//
// new(stage, steps, clock): `stage` is the shape's table of records (key: {record, group, how}), `steps` each stage
// group's step in seconds, `clock` the record of each stage group's evaluation times.
local promql = import 'promql.libsonnet';

{
  new(stage, steps, clock):: {
    local reader = self,
    local family(key) = stage[key],
    local step(key) = promql.num(steps[family(key).group]),

    // The stage's record of `key`, selected by `matchers` (a list; empty ones left out).
    record(key, matchers=[]):: promql.selector(family(key).record, promql.matchers(matchers)),

    // The per-second rate of `key` over `window` (per record series): its step increases averaged, over the step.
    // A gauge's avg or count record is averaged as it is.
    rate(key, window, matchers=[])::
      local averaged = 'avg_over_time(' + reader.record(key, matchers) + '[' + window + '])';
      if family(key).how == 'increase' then averaged + ' / ' + step(key) else averaged,

    // How many steps each of `key`'s records over `window` stands for: the mean spacing of its group's clock over
    // the step (more than 1 where the ruler ran the group less often than every step).
    coverage(key, window)::
      local ticks = '%(clock)s{stage="%(group)s"}[%(window)s]' % {
        clock: clock,
        group: family(key).group,
        window: window,
      };
      '((max_over_time(%(ticks)s) - min_over_time(%(ticks)s)) / (count_over_time(%(ticks)s) - 1 > 0) / %(step)s)' % {
        ticks: ticks,
        step: step(key),
      },

    // What `key` counted over `window`: the sum of its step increases, scaled by the stage's coverage.
    count(key, window, matchers=[])::
      'sum_over_time(%(record)s[%(window)s])\n* on () group_left ()\n%(coverage)s' % {
        record: reader.record(key, matchers),
        window: window,
        coverage: reader.coverage(key, window),
      },

    // Queries over the records pooled by `labels` (the alert level's), the models selected by `matchers`.
    pooled(matchers, labels):: {
      local pool = self,
      local selected(more) = [matchers] + more,

      rate(key, window, more=[], byAlso=[])::
        'sum by (' + promql.by(labels + byAlso) + ') (' + reader.rate(key, window, selected(more)) + ')',

      ratio(numerator, denominator, window, more=[], byAlso=[])::
        promql.guardedRatio(pool.rate(numerator, window, more, byAlso), pool.rate(denominator, window, more, byAlso)),

      quantile(quantile, histogram, window, more=[], byAlso=[])::
        'histogram_quantile(%(q)s, %(buckets)s)\nand on (%(by)s)\n(%(count)s > 0)' % {
          q: promql.num(quantile),
          buckets: pool.rate(histogram + '_bucket', window, more, byAlso + ['le']),
          by: promql.by(labels + byAlso),
          count: pool.rate(histogram + '_count', window, more, byAlso),
        },

      // The share of a histogram's observations at or below `bound` (one of its bucket bounds).
      shareBelow(histogram, bound, window)::
        promql.guardedRatio(pool.rate(histogram + '_bucket', window, ['le="%(bound)s"' % { bound: promql.num(bound) }]),
                            pool.rate(histogram + '_count', window)),

      // Per bucket bound, what the histogram counted over `window` (a heatmap's cells).
      increaseByLe(histogram, window)::
        'sum by (le) (\n' + reader.count(histogram + '_bucket', window, [matchers]) + '\n)',
    },
  },
}
