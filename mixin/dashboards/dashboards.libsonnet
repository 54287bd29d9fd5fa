// The mixin's grafanaDashboards: the dashboard under this mixin's _config (config.libsonnet, or yours merged over
// it) and the shape of the rules it reads (shape.libsonnet, generated from the monitoring config).
local dashboard = import 'specdecode.libsonnet';

{
  grafanaDashboards+:: {
    'specdecode.json': dashboard($._config, import 'shape.libsonnet'),
  },
}
