// The types the generated dashboard files are checked against (agent/tests/dashboards/grafana_ts.py
// writes one .ts file per dashboard; `tsc --strict --noEmit` checks them).
//
// Everything comes from Grafana's own packages at the image's version (@grafana/schema 13.2.3,
// @grafana/data 13.2.3) or from the vendored InfluxDB datasource types. Two adaptations, both
// exact:
//  - Dashboard JSON holds an enum's *value* ("line"), while TypeScript string enums are nominal
//    (GraphDrawStyle.Line). Lit<T> replaces each string enum by the union of its values
//    (`${E}`), so "line" passes and "lines" fails exactly as the enum allows.
//  - Grafana's AnnotationQuery makes `target` optional, but its InfluxDB datasource returns no
//    events for an annotation without one (migrations.ts prepareAnnotation leaves it empty;
//    datasource.ts _query runs only targets with fromAnnotations and a query), so an InfluxDB
//    annotation here must carry its target.
import type { DataLink, FieldMatcherID, FrameMatcherID, standardTransformers } from '@grafana/data';
import type * as schema from '@grafana/schema';

import type { InfluxQuery } from './vendor/influxdb/types';

/** T with string enums widened to the union of their values, recursively. */
export type Lit<T> = T extends (...args: never[]) => unknown
  ? T
  : T extends string
    ? string extends T
      ? string
      : `${T}`
    : T extends readonly (infer U)[]
      ? Array<Lit<U>>
      : T extends object
        ? { [K in keyof T]: Lit<T[K]> }
        : T;

/** A panel or annotation target of the InfluxDB datasource. */
export type InfluxTarget = Lit<InfluxQuery>;

/** An InfluxDB annotation: Grafana's AnnotationQuery, with the query and its columns in `target`. */
export type InfluxAnnotation = Lit<Omit<schema.AnnotationQuery<InfluxQuery>, 'target'>> & { target: InfluxTarget };

/** A data link on a field (Grafana's DataLink). */
export type Link = Lit<DataLink>;

/** A field-override matcher: one of Grafana's field matcher ids. */
export type Matcher = { id: `${FieldMatcherID}`; options?: unknown };

type Transformers = typeof standardTransformers;
type OptionsOf<K extends keyof Transformers> = Transformers[K] extends {
  operator: (options: infer O, ...rest: never[]) => unknown;
}
  ? O
  : never;

/** The options of each transformation gpulse uses, keyed by its id, from Grafana's own transformers. */
export interface TransformerOptions {
  calculateField: OptionsOf<'calculateFieldTransformer'>;
  filterFieldsByName: OptionsOf<'filterFieldsByNameTransformer'>;
  groupBy: OptionsOf<'groupByTransformer'>;
  joinByField: OptionsOf<'joinByFieldTransformer'>;
  limit: OptionsOf<'limitTransformer'>;
  merge: OptionsOf<'mergeTransformer'>;
  organize: OptionsOf<'organizeFieldsTransformer'>;
  reduce: OptionsOf<'reduceTransformer'>;
  sortBy: OptionsOf<'sortByTransformer'>;
}

/** A transformation: one of the ids above with exactly its options, optionally limited to some frames. */
export type Transformation = {
  [K in keyof TransformerOptions]: {
    id: K;
    options: Lit<TransformerOptions[K]>;
    disabled?: boolean;
    filter?: { id: `${FrameMatcherID}`; options?: unknown };
  };
}[keyof TransformerOptions];
