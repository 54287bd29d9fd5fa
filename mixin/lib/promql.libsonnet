// The PromQL the dashboard's panels compose: selectors, guarded ratios, the sidecars' break-even, the verdict.
// Ratios are pooled the one right way (numerator and denominator summed separately, then divided) and every
// division is guarded, `/ (… > 0)`: an idle model has no sample and a panel shows "No traffic", never NaN.
//
// The helpers every query calls many times join strings with +: jsonnet's % (std.format) reads its template a
// character at a time, and the dashboard renders in a fifth of the time without it there.
{
  // Labels as a `by (…)` or `on (…)` list.
  by(labels):: std.join(', ', labels),

  // Label matchers, the empty ones left out, as the inside of a selector's braces.
  matchers(parts):: std.join(', ', [part for part in parts if part != '']),

  // metric{matchers}; the bare metric without matchers.
  selector(metric, matchers=''):: if matchers == '' then metric else metric + '{' + matchers + '}',

  // Which series a query reads (matchers, possibly empty) and what it pools them by.
  scope(matchers, by):: {
    matchers: matchers,
    by: by,
    byClause: std.join(', ', by),
    // The scope's matchers and more.
    also(more):: $.matchers([matchers] + more),
  },

  // A number as Python's format(x, 'g') writes it: 1, 0.5, 1.1. (Whole numbers, the most, without std.format,
  // whose number formats cost milliseconds each.)
  num(x):: if x == std.floor(x) && std.abs(x) < 1e15 then std.toString(x) else '%(x)g' % { x: x },

  // A ratio as a whole percentage, as Python's format(x, '.0%') writes it (halves to even): 0.5 -> 50%.
  percent(ratio)::
    local value = ratio * 100;
    local whole = std.floor(value);
    local half = std.abs(value - whole - 0.5) < 1e-9;
    std.toString(if half then whole + whole % 2 else std.round(value)) + '%',

  // numerator / denominator, with no sample (rather than NaN or Inf) where the denominator is 0.
  guardedRatio(numerator, denominator):: numerator + '\n/\n(' + denominator + ' > 0)',

  rateSum(metric, scope, window, more=[]):: 'sum by (%(by)s) (rate(%(series)s[%(window)s]))' % {
    by: scope.byClause,
    series: $.selector(metric, scope.also(more)),
    window: window,
  },

  // histogram_quantile over a raw histogram, with no sample (not NaN) when the histogram saw nothing.
  histogramQuantile(quantile, histogram, scope, window)::
    local buckets = $.rateSum(histogram + '_bucket', $.scope(scope.matchers, scope.by + ['le']), window);
    local count = $.rateSum(histogram + '_count', scope, window);
    'histogram_quantile(%(q)s, %(buckets)s)\nand on (%(by)s)\n(%(count)s > 0)' % {
      q: $.num(quantile),
      buckets: buckets,
      by: scope.byClause,
      count: count,
    },

  // The sidecars' break-even α (= their cost per drafted token) on one cost basis, the highest in the scope.
  breakEven(metric, scope, basis='configured'):: 'max by (%(by)s) (%(series)s)' % {
    by: scope.byClause,
    series: $.selector(metric, scope.also(['cost_basis="' + basis + '"'])),
  },

  // The break-even α in force: calibrated to the observed speedup where a baseline gives one, else configured.
  breakEvenInForce(metric, scope)::
    $.breakEven(metric, scope, 'calibrated') + '\nor\n' + $.breakEven(metric, scope),

  // Mean requests waiting per spec-decode engine (control targets, whose info says method="off", left out).
  specPodsWaiting(metrics, scope, windowLabel)::
    local waiting = $.selector(metrics.requestsWaiting, scope.also(['window="' + windowLabel + '"']));
    local info = $.selector(metrics.info, scope.also(['method!="off"']));
    'avg by (%(by)s) (%(waiting)s\nand ignoring (window, api, method, num_speculative_tokens)\n%(info)s)' % {
      by: scope.byClause,
      waiting: waiting,
      info: info,
    },

  // The sidecar's verdict (core/contract/verdict.py judge()) in PromQL: 0 hurting, 1 marginal, 2 paying off, no sample
  // without traffic. `speedup`: the observed speedup where there is one, else the modelled; `tail`: the observed
  // P99 speedup, where there is one; `costs`: conditions that are 1 while spec decode costs no more than the
  // bounds allow against the control pods, 0 beyond. `bands`: hurtingBelow, payingOffFrom, pageAcceptanceRatio.
  // Comparisons bind looser than + and * in PromQL: every one is parenthesised.
  verdictCode(alpha, speedup, bands, tail=null, costs=[])::
    local values = {
      alpha: alpha,
      speedup: speedup,
      tail: tail,
      hurting: $.num(bands.hurtingBelow),
      paying: $.num(bands.payingOffFrom),
      page: $.num(bands.pageAcceptanceRatio),
    };
    local payingOff = '(((%(speedup)s) >= bool %(paying)s)\n*\n((%(alpha)s) >= bool %(page)s))' % values;
    // A tail regression keeps it at marginal; without a P99 figure (tail null) nothing changes.
    local withTail = if tail == null then payingOff else
      '(%(payingOff)s\n*\n(((%(tail)s) >= bool %(hurting)s) or ((%(speedup)s) * 0 + 1)))' % (
        values { payingOff: payingOff }
      );
    // Beyond a cost bound: marginal; without the figure (no control pods) nothing changes.
    local withCosts = std.foldl(
      function(verdict, cost) '(%(verdict)s\n*\n((%(cost)s) or ((%(speedup)s) * 0 + 1)))' % (
        values { verdict: verdict, cost: cost }
      ),
      costs,
      withTail,
    );
    '((%(speedup)s) >= bool %(hurting)s)\n+\n%(payingOff)s' % (values { payingOff: withCosts }),
}
