// Vendored from grafana/grafana-influxdb-datasource, src/types.ts (Apache-2.0), at commit b3008cfa.
//
// The InfluxDB query model is not part of @grafana/schema: it lives in the datasource's own
// source. From Grafana 13 the InfluxDB datasource is an external plugin that the grafana/grafana
// image bundles (grafana/grafana PRs #129593 "InfluxDB: Add to default bundled and preinstalled
// plugins" and #129602 "InfluxDB: Remove from core plugins"), so its types come from that
// repository, not from public/app/plugins/datasource/influxdb/ as up to Grafana 12.4. The file is
// the InfluxQL, Flux and SQL query model with the annotation fields the datasource's migration
// writes and its annotation runner reads (fromAnnotations, queryType, textColumn, tagsColumn,
// titleColumn, timeEndColumn); every field gpulse writes is in it, unchanged since Grafana 10.
// Unchanged below this header.
import { type AdHocVariableFilter, type DataQuery, type DataSourceJsonData } from '@grafana/data';

export const DEFAULT_POLICY = 'default';

export enum InfluxVersion {
  InfluxQL = 'InfluxQL',
  Flux = 'Flux',
  SQL = 'SQL',
}

export interface InfluxOptions extends DataSourceJsonData {
  version?: InfluxVersion;

  timeInterval?: string;
  httpMode?: string;
  showTagTime?: string;

  dbName?: string;
  product?: string;
  pdcInjected?: boolean;
  oauthPassThru?: boolean;

  // With Flux
  organization?: string;
  defaultBucket?: string;
  maxSeries?: number;

  // With SQL
  metadata?: Array<Record<string, string>>;
  insecureGrpc?: boolean;
}

/**
 * @deprecated
 */
export interface InfluxOptionsV1 extends InfluxOptions {
  user?: string;
  database?: string;
}

export interface InfluxSecureJsonData {
  // For Flux
  token?: string;

  // In 1x a different password can be sent than then HTTP auth
  password?: string;
}

export interface InfluxQueryPart {
  type: string;
  params?: Array<string | number>;
  // FIXME: `interval` does not seem to be used.
  // check all the influxdb parts (query-generation etc.),
  // if it is really so, and if yes, remove it
  interval?: string;
}

export interface InfluxQueryTag {
  key: string;
  operator?: string;
  condition?: string;
  value: string;
}

export type ResultFormat = 'time_series' | 'table' | 'logs';

export interface InfluxVariableQuery extends DataQuery {
  query: string;
  maxDataPoints?: number;
}

export interface InfluxQuery extends DataQuery {
  policy?: string;
  measurement?: string;
  resultFormat?: ResultFormat;
  orderByTime?: string;
  tags?: InfluxQueryTag[];
  groupBy?: InfluxQueryPart[];
  select?: InfluxQueryPart[][];
  limit?: string | number;
  slimit?: string | number;
  tz?: string;
  // NOTE: `fill` is not used in the query-editor anymore, and is removed
  // if any change happens in the query-editor. the query-generation still
  // supports it for now.
  fill?: string;
  rawQuery?: boolean;
  query?: string;
  alias?: string;
  // for migrated InfluxQL annotations
  queryType?: string;
  fromAnnotations?: boolean;
  tagsColumn?: string;
  textColumn?: string;
  timeEndColumn?: string;
  titleColumn?: string;
  name?: string;

  adhocFilters?: AdHocVariableFilter[];
}

export type MetadataQueryType = 'TAG_KEYS' | 'TAG_VALUES' | 'MEASUREMENTS' | 'FIELDS' | 'RETENTION_POLICIES';
