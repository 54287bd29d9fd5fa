// The panel kinds this dashboard draws (stat, time series, table, heatmap, bar chart, bar gauge) with Grafana 11's
// fields as the dashboard sets them, and the settings the rows add to a panel with `+`:
//
//   panels.timeseries('Token flow', 'Drafted and accepted …', panels.queries([[expr, legend]]), 'si:tok/s', w=8)
//   + panels.min(0) + panels.overrideByQuery('B', panels.dashed)
//
// A panel's gridPos holds its width and height; the dashboard places it (dashboards/specdecode.libsonnet).
local datasource = { type: 'prometheus', uid: '${datasource}' };
local refIds = 'ABCDEFGHIJ';

// A description written as a wrapped paragraph (a ||| block) is one line in Grafana.
local oneLine(text) = std.join(' ', std.split(std.rstripChars(text, '\n'), '\n'));

local base(type, title, description, w, h) = {
  type: type,
  title: title,
  description: oneLine(description),
  datasource: datasource,
  gridPos: { w: w, h: h },
  repeatDirection: 'h',
  transparent: false,
};

local reduceLastNotNull = { calcs: ['lastNotNull'], fields: '', values: false };
local hiddenLegend = { calcs: [], displayMode: 'list', placement: 'bottom', showLegend: false };

{
  datasource: datasource,

  // ----------------------------------------------------------------------------------------------- queries

  // A Prometheus query: a range query unless `instant`; `format` 'table' or 'heatmap' where the panel needs it.
  query(expr, legend='__auto', ref='A', instant=false, format=null):: {
    datasource: datasource,
    expr: expr,
    legendFormat: legend,
    refId: ref,
    instant: instant,
    range: !instant,
  } + (if format == null then {} else { format: format }),

  // Range queries from [expr, legend] pairs, with refIds A, B, C, …
  queries(items):: [$.query(items[i][0], items[i][1], ref=refIds[i]) for i in std.range(0, std.length(items) - 1)],

  // ------------------------------------------------------------------------------------ what a panel shows

  // Absolute thresholds from [value, colour] pairs (the first value null: the base colour).
  steps(pairs):: { mode: 'absolute', steps: [{ value: pair[0], color: pair[1] } for pair in pairs] },

  noTrafficMappings: [{
    type: 'special',
    options: { match: 'null+nan', result: { text: 'No traffic', color: 'text', index: 0 } },
  }],

  // A value mapping from [value, text, colour] triples.
  valueMappings(texts):: [{
    type: 'value',
    options: {
      [std.toString(texts[i][0])]: { text: texts[i][1], color: texts[i][2], index: i }
      for i in std.range(0, std.length(texts) - 1)
    },
  }],

  upMappings: $.valueMappings([[0, 'DOWN', 'red'], [1, 'UP', 'green']]),

  // One field-config property of an override: prop('unit', 'short'); a null value clears the panel's own.
  prop(id, value=null):: { id: id } + (if value == null then {} else { value: value }),

  // A dashed line without fill: the reference series of a panel.
  dashed: [$.prop('custom.lineStyle', { fill: 'dash', dash: [10, 10] }), $.prop('custom.fillOpacity', 0)],

  // --------------------------------------------------------------- settings a row adds to a panel with `+`

  min(value):: { fieldConfig+: { defaults+: { min: value } } },
  max(value):: { fieldConfig+: { defaults+: { max: value } } },
  decimals(value):: { fieldConfig+: { defaults+: { decimals: value } } },
  noValue(text):: { fieldConfig+: { defaults+: { noValue: text } } },
  thresholds(steps):: { fieldConfig+: { defaults+: { thresholds: steps } } },
  mappings(mappings):: { fieldConfig+: { defaults+: { mappings: mappings } } },
  // A time series' own settings (fieldConfig.defaults.custom): axisSoftMin, stacking, …
  custom(values):: { fieldConfig+: { defaults+: { custom+: values } } },
  // How a time series draws its thresholds: 'line+area', 'dashed'.
  thresholdsStyle(mode):: $.custom({ thresholdsStyle: { mode: mode } }),
  // The properties (a list of prop(), or dashed) of the series of one query.
  overrideByQuery(ref, properties):: { fieldConfig+: { overrides+: [{
    matcher: { id: 'byFrameRefID', options: ref },
    properties: properties,
  }] } },
  options(values):: { options+: values },
  targets(targets):: { targets: targets },

  // ----------------------------------------------------------------------------------------- panel kinds

  // A row of the dashboard, expanded: the panels after it up to the next row are its.
  row(title):: { type: 'row', title: title, collapsed: false, panels: [], gridPos: { w: 24, h: 1 } },

  // The latest value of one instant query per series, its background coloured by `thresholds`.
  stat(title, description, expr, unit, legend, w=4, h=5):: base('stat', title, description, w, h) {
    targets: [$.query(expr, legend, instant=true)],
    fieldConfig: {
      defaults: { unit: unit, noValue: 'No traffic', mappings: $.noTrafficMappings },
      overrides: [],
    },
    options: {
      reduceOptions: reduceLastNotNull,
      colorMode: 'background',
      graphMode: 'none',
      textMode: 'value_and_name',
      justifyMode: 'auto',
      orientation: 'auto',
      percentChangeColorMode: 'standard',
      showPercentChange: false,
      wideLayout: true,
    },
  },

  // Lines over time, a table legend (last, min, mean) below.
  timeseries(title, description, targets, unit, w=12, h=8):: base('timeseries', title, description, w, h) {
    targets: targets,
    fieldConfig: {
      defaults: {
        unit: unit,
        noValue: 'No traffic',
        custom: { lineWidth: 2, fillOpacity: 10, showPoints: 'never', spanNulls: false },
      },
      overrides: [],
    },
    options: {
      legend: { displayMode: 'table', placement: 'bottom', showLegend: true, calcs: ['lastNotNull', 'min', 'mean'] },
      tooltip: { mode: 'multi', sort: 'desc' },
    },
  },

  // One instant query as a table: the columns in `exclude` hidden, those in `order` first.
  table(title, description, target, w, h, noValue, exclude, order={}):: base('table', title, description, w, h) {
    targets: [target],
    transformations: [{
      id: 'organize',
      options: { excludeByName: exclude, indexByName: order, renameByName: {} },
    }],
    fieldConfig: {
      defaults: { unit: 'none', noValue: noValue, custom: { align: 'auto', inspect: false } },
      overrides: [],
    },
    options: {
      cellHeight: 'sm',
      showHeader: true,
      footer: { countRows: false, reducer: [], show: false },
      frameIndex: 0,
      showTypeIcons: false,
    },
  },

  // An α histogram (buckets of 5 points) over time, as Grafana draws pre-bucketed data: `cells` is a query of
  // each bucket's count by le.
  acceptanceHeatmap(title, description, cells, noValue):: base('heatmap', title, description, 12, 9) {
    targets: [$.query(cells, '{{le}}', format='heatmap')],
    fieldConfig: {
      defaults: {
        unit: 'short',
        noValue: noValue,
        custom: {
          hideFrom: { legend: false, tooltip: false, viz: false },
          scaleDistribution: { type: 'linear' },
        },
      },
      overrides: [],
    },
    options: {
      calculate: false,
      yAxis: { unit: 'percentunit', min: 0, max: 1, decimals: 0 },
      color: {
        mode: 'scheme',
        scheme: 'Spectral',
        scale: 'exponential',
        exponent: 0.5,
        steps: 64,
        fill: 'dark-orange',
        reverse: false,
      },
      cellGap: 1,
      cellValues: { unit: 'short' },
      rowsFrame: { layout: 'le' },
      showValue: 'never',
      legend: { show: true },
      tooltip: { mode: 'single', yHistogram: true, showColorScale: true },
      exemplars: { color: 'rgba(255,0,255,0.7)' },
      filterValues: { le: 1e-9 },
      selectionMode: 'x',
    },
  },

  // Vertical bars, one per row of a table query, coloured by `thresholds`.
  barchart(title, description, target, unit, w, h):: base('barchart', title, description, w, h) {
    targets: [target],
    fieldConfig: {
      defaults: {
        unit: unit,
        noValue: 'No traffic',
        color: { mode: 'thresholds' },
        custom: { lineWidth: 1, fillOpacity: 80, gradientMode: 'none' },
      },
      overrides: [],
    },
    options: {
      orientation: 'vertical',
      showValue: 'auto',
      stacking: 'none',
      barWidth: 0.97,
      barRadius: 0,
      groupWidth: 0.7,
      fullHighlight: false,
      xTickLabelRotation: 0,
      xTickLabelMaxLength: 0,
      xTickLabelSpacing: 0,
      legend: hiddenLegend,
      tooltip: { mode: 'single', sort: 'none' },
    },
  },

  // Horizontal gradient bars, the latest value of each series.
  bargauge(title, description, target, unit, w, h):: base('bargauge', title, description, w, h) {
    targets: [target],
    fieldConfig: { defaults: { unit: unit, noValue: 'No traffic' }, overrides: [] },
    options: {
      displayMode: 'gradient',
      orientation: 'horizontal',
      reduceOptions: reduceLastNotNull,
      showUnfilled: true,
      valueMode: 'color',
      namePlacement: 'auto',
      sizing: 'auto',
      minVizHeight: 16,
      minVizWidth: 8,
      maxVizHeight: 300,
      legend: hiddenLegend,
    },
  },
}
