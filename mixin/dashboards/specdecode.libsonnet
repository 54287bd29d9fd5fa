// The dashboard: its header, links and variables, then the rows in order, each placed on Grafana's 24-column grid.
// A function of _config and the shape (shape.libsonnet): dashboards.libsonnet gives it the mixin's, the build
// (python -m specdecode_exporter.monitoring.build) those of the monitoring config it is given.
local panels = import '../lib/panels.libsonnet';
local context = import 'context.libsonnet';

// The rows, top to bottom: a row is a file in rows/ and its place here.
local rows = [
  import 'rows/paying_off.libsonnet',
  import 'rows/measured.libsonnet',
  import 'rows/acceptance_over_time.libsonnet',
  import 'rows/distribution.libsonnet',
  import 'rows/per_request.libsonnet',
  import 'rows/routing.libsonnet',
  import 'rows/positions.libsonnet',
  import 'rows/token_flow.libsonnet',
  import 'rows/latency.libsonnet',
  import 'rows/speculating.libsonnet',
  import 'rows/costs.libsonnet',
  import 'rows/alerts.libsonnet',
  import 'rows/health.libsonnet',
];

local allSelected = { selected: true, text: ['All'], value: ['$__all'] };
local variableDefaults = { allowCustomValue: true, auto: false, auto_count: 30, auto_min: '10s', skipUrlSync: false };

// A multi-value variable of one label's values, All by default.
local labelVariable(name, label, series, description) = variableDefaults {
  type: 'query',
  name: name,
  label: label,
  description: description,
  datasource: panels.datasource,
  query: 'label_values(%(series)s, %(name)s)' % { series: series, name: name },
  refresh: 2,  // on time range change
  sort: 1,  // alphabetical
  multi: true,
  includeAll: true,
  allValue: '.*',
  current: allSelected,
};

local variables(ctx) =
  local extra = ctx.extraVariables;
  local up = ctx.metrics.up;
  local drafts = ctx.metrics.drafts;
  // The series of `metric` under the extra variables and those named.
  local within(metric, names) = '%(metric)s{%(matchers)s}' % {
    metric: metric,
    matchers: std.join(', ', ['%(name)s=~"$%(name)s"' % { name: name } for name in extra + names]),
  };
  local windows = ctx.shape.windows;
  local default = ctx.shape.defaultWindow;
  [
    variableDefaults {
      type: 'datasource',
      name: 'datasource',
      label: 'Data source',
      description: 'The Prometheus that scrapes the sidecars and vLLM.',
      query: 'prometheus',
      multi: false,
      includeAll: false,
      current: { selected: true, text: 'default', value: 'default' },
    },
  ] + [
    labelVariable(name, std.asciiUpper(name[0]) + std.strReplace(name[1:], '_', ' '), up,
                  'The %(name)s label (an aggregation level).' % { name: name })
    for name in extra
  ] + [
    labelVariable('namespace', 'Namespace', if extra == [] then up else within(up, []),
                  'Kubernetes namespace (All outside k8s).'),
    labelVariable('job', 'Job', within(up, ['namespace']),
                  "The sidecar's scrape job (vLLM's own job is not filtered by it)."),
    labelVariable('model_name', 'Model', within(drafts, ['namespace', 'job']), "vLLM's served model name."),
    labelVariable('engine', 'Engine', within(drafts, ['namespace', 'job', 'model_name']),
                  'vLLM data-parallel engine index.'),
    labelVariable('pod', 'Pod', within(up, ['namespace', 'job']), 'Pod (sidecar and vLLM share it; All outside k8s).'),
    labelVariable('instance', 'Instance', within(up, ['namespace', 'job', 'pod']),
                  "The sidecar's scrape address (vLLM's panels are not filtered by it)."),
    variableDefaults {
      type: 'custom',
      name: 'window',
      label: 'Window',
      description: "Window of the ratios: the sidecar's window label and the PromQL range of rate().",
      query: std.join(',', windows),
      multi: false,
      includeAll: false,
      current: { selected: true, text: default, value: default },
      options: [{ selected: window == default, text: window, value: window } for window in windows],
    },
  ];

// Grafana's grid: each panel right of the one before, a new line once 24 columns are full; a row below the lowest
// panel of its line. The state: the next panel's x and y, and the tallest panel of the current line.
local place(state, panel) =
  local isRow = panel.type == 'row';
  local y = if isRow then state.y + state.height else state.y;
  local placed = panel { gridPos+: { x: if isRow then 0 else state.x, y: y }, id: std.length(state.panels) + 1 };
  local x = if isRow then 0 else state.x + panel.gridPos.w;
  local height = if isRow then 0 else std.max(state.height, panel.gridPos.h);
  local full = x >= 24;
  {
    panels: state.panels + [placed],
    x: if full then 0 else x,
    y: if isRow then y + 1 else if full then y + height else y,
    height: if full then 0 else height,
  };

local layout(items) = std.foldl(place, items, { panels: [], x: 0, y: 0, height: 0 }).panels;

function(config, shape)
  local ctx = context.new(config, shape);
  local runbook = std.rstripChars(config.runbookBaseURL, '/') + '/alerts/runbook.md';
  {
    uid: config.dashboardUID,
    title: config.dashboardTitle,
    description: std.join(' ', [
      'vLLM speculative decoding: acceptance rate α, break-even, modelled speedup, per-position acceptance, k advice',
      'and latency, from the specdecode-exporter sidecar. Generated from the monitoring config by the jsonnet mixin,',
      'mixin/dashboards/ (a file per row).',
    ]),
    tags: ['specdecode', 'vllm', 'llm-serving'],
    editable: true,
    graphTooltip: 1,  // shared crosshair
    fiscalYearStartMonth: 0,
    schemaVersion: 41,
    time: { from: config.dashboardTimeFrom, to: 'now' },
    timezone: 'browser',
    refresh: config.dashboardRefresh,
    timepicker: { hidden: false, refresh_intervals: ['10s', '30s', '1m', '5m', '15m', '1h'] },
    links: [{
      title: 'Runbook',
      type: 'link',
      url: runbook,
      icon: 'doc',
      tooltip: 'What to do when a specdecode alert fires',
      targetBlank: true,
      asDropdown: false,
      includeVars: false,
      keepTime: false,
      tags: [],
    }],
    annotations: { list: [
      {
        name: 'Annotations & Alerts',
        builtIn: 1,
        enable: true,
        hide: true,
        iconColor: 'rgba(0, 211, 255, 1)',
        type: 'dashboard',
        datasource: { type: 'grafana', uid: '-- Grafana --' },
      },
      {
        name: '%(prefix)s alerts firing' % { prefix: shape.alertPrefix },
        builtIn: 0,
        enable: true,
        hide: false,
        iconColor: 'red',
        datasource: panels.datasource,
        expr: 'ALERTS{alertname=~"%(prefix)s.*", alertstate="firing", namespace=~"$namespace"}' % {
          prefix: shape.alertPrefix,
        },
      },
    ] },
    templating: { list: variables(ctx) },
    panels: layout(std.flattenArrays([
      [panels.row(section.title)] + section.panels
      for section in [row(ctx) for row in rows]
    ])),
  }
