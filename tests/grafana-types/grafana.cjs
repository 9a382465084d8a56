// Grafana's own display code under node, for agent/tests/dashboards (Grafana cannot run here).
//
//   node grafana.cjs units   <<< ["percent", "suffix:GPU-h", ...]
//       -> {"known": [...ids getValueFormats() lists], "custom": [...ids getValueFormat parses as custom units]}
//   node grafana.cjs format  <<< [{"unit": "bytes", "decimals": null, "value": 2150000000}, ...]
//       -> ["2.00 GiB", ...]   (getValueFormat(unit)(value, decimals), as a panel shows it)
//   node grafana.cjs render  <<< [{"panel": <panel JSON>, "frames": [<frames as the InfluxQL backend builds them>]}]
//       -> per panel, per field after the panel's transformations: its display name, resolved unit and
//          decimals (fieldConfig defaults, then overrides in order, matched by Grafana's field matchers),
//          and a sample value formatted with them.
//
// Everything is @grafana/data 13.2.3's code: getValueFormat/getValueFormats, fieldMatchers,
// transformDataFrame over the standard transformers, toDataFrame, getFieldDisplayName. Node 20
// has no `navigator` or `window`: `navigator` is set to an en-US browser's (the date formatter
// reads the locale); `window` exists while @grafana/data's local-storage helper (utils/store)
// loads, which registers a listener at import, and afterwards holds only the marker of a Scenes
// dashboard (Grafana 12 renders dashboards with Scenes, and transformDataFrame checks for it).
// The transformer registry is filled the way Grafana's app fills it: one item per standard
// transformer (public/app/features/transformers/standardTransformers.ts). From Grafana 13.2 an
// item's `transformation` is a loader that resolves to the transformer (TransformerRegistryItem
// in @grafana/data's standardTransformersRegistry.d.ts), so each item wraps its transformer in one.
'use strict';

globalThis.navigator = { language: 'en-US', languages: ['en-US'] };
const path = require('node:path');
const base = path.join(path.dirname(require.resolve('@grafana/data/package.json')), 'dist', 'cjs');
globalThis.window = { addEventListener() {} };
require(path.join(base, 'utils', 'store.cjs'));
delete globalThis.window;
console.info = () => {}; // i18next advertises itself on console.info when Grafana's i18n initialises
const data = require('@grafana/data');
globalThis.window = { __grafanaSceneContext: {} };
data.standardTransformersRegistry.setInit(() => {
  const byId = new Map(); // seriesToColumnsTransformer is the deprecated twin of joinByField
  for (const t of Object.values(data.standardTransformers)) {
    if (!byId.has(t.id)) {
      byId.set(t.id, { id: t.id, aliasIds: t.aliasIds, name: t.name, transformation: () => Promise.resolve(t) });
    }
  }
  return [...byId.values()];
});
const { lastValueFrom } = require('rxjs');

function read() {
  return JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
}

function out(value) {
  process.stdout.write('\n' + JSON.stringify(value) + '\n');
}

const CUSTOM = /^(suffix|prefix|si|count|currency|time|bool):/;

function units(ids) {
  const known = new Set(data.getValueFormats().flatMap((c) => c.submenu.map((s) => s.value)));
  return { known: ids.filter((id) => known.has(id)), custom: ids.filter((id) => !known.has(id) && CUSTOM.test(id)) };
}

function format(unit, decimals, value) {
  return data.formattedValueToString(data.getValueFormat(unit)(value, decimals ?? undefined));
}

function frame(f) {
  return data.toDataFrame({
    refId: f.refId,
    name: f.name,
    fields: f.fields.map((x) => ({
      name: x.name,
      type: x.type,
      labels: x.labels,
      config: x.displayNameFromDS ? { displayNameFromDS: x.displayNameFromDS } : {},
      values: x.type === 'time' ? x.values.map((v) => (v === null ? null : v)) : x.values,
    })),
  });
}

async function transform(panel, frames) {
  const transformations = panel.transformations ?? [];
  for (const t of transformations) {
    if (!data.standardTransformersRegistry.getIfExists(t.id)) {
      throw new Error(`transformation ${t.id} is not one of @grafana/data's standard transformers`);
    }
  }
  return lastValueFrom(data.transformDataFrame(transformations, frames, { interpolate: (s) => s }));
}

function resolve(panel, field, frame, allFrames) {
  const defaults = panel.fieldConfig?.defaults ?? {};
  const config = { unit: defaults.unit, decimals: defaults.decimals };
  for (const o of panel.fieldConfig?.overrides ?? []) {
    const matcher = data.fieldMatchers.get(o.matcher.id).get(o.matcher.options);
    if (!matcher(field, frame, allFrames)) {
      continue;
    }
    for (const p of o.properties) {
      if (p.id === 'unit' || p.id === 'decimals') {
        config[p.id] = p.value;
      }
    }
  }
  return config;
}

async function render(items) {
  const results = [];
  for (const { panel, frames } of items) {
    const input = frames.map(frame);
    const output = await transform(panel, input);
    const fields = [];
    for (const f of output) {
      for (const field of f.fields) {
        const name = data.getFieldDisplayName(field, f, output);
        const { unit, decimals } = resolve(panel, field, f, output);
        const sample = field.values.find((v) => v !== null && v !== undefined);
        // a time field shows as a date unless its unit is a date format (getDisplayProcessor)
        const numeric = field.type === 'number' || (field.type === 'time' && /^dateTime/.test(unit ?? ''));
        fields.push({
          name,
          type: field.type,
          refId: f.refId ?? null,
          unit: unit ?? null,
          decimals: decimals ?? null,
          value: sample ?? null,
          text: numeric && typeof sample === 'number' ? format(unit ?? 'none', decimals, sample) : null,
        });
      }
    }
    results.push({ title: panel.title, fields });
  }
  return results;
}

async function main() {
  const command = process.argv[2];
  const input = read();
  if (command === 'units') {
    out(units(input));
  } else if (command === 'format') {
    out(input.map((x) => format(x.unit, x.decimals, x.value)));
  } else if (command === 'render') {
    out(await render(input));
  } else {
    throw new Error(`unknown command ${command}: units | format | render`);
  }
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
