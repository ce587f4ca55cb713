/**
 * The panel's state: the schema and values the server sent, the user's unsaved draft,
 * and what is wrong with it. No DOM and no JupyterLab imports, so it is unit-tested alone.
 *
 * Example:
 *   const model = new ConfigModel();
 *   model.load(responseFromServer);
 *   model.setText('num_processes', '3');
 *   model.dirtyKeys(); // ['num_processes']
 */

import { IConfigResponse, IFieldSchema, Values } from './types';

/** One editable row of a mapping field (env, dynamo_config, ...). */
export interface IRow {
  key: string;
  value: string;
}

/** The fields of one schema group, in schema order. */
export interface IFieldGroup {
  group: string;
  fields: IFieldSchema[];
}

// Environment variables are strings; the Accelerate sub-configs hold numbers and booleans too.
const STRING_VALUED_MAPPINGS = new Set(['env']);

const GPU_IDS = 'gpu_ids';

export class ConfigModel {
  /** The last answer from the server, or null before the first load. */
  info: IConfigResponse | null = null;

  get loaded(): boolean {
    return this.info !== null;
  }

  get schema(): readonly IFieldSchema[] {
    return this.info?.schema ?? [];
  }

  field(name: string): IFieldSchema | undefined {
    return this.schema.find(f => f.name === name);
  }

  /** Take the server's config as the saved state; the draft starts equal to it. */
  load(response: IConfigResponse): void {
    this.info = response;
    this._saved = clone(response.values);
    this._serverErrors = { ...response.field_errors };
    this._resetDraft();
  }

  /** Drop every unsaved change. */
  revert(): void {
    if (this.info) {
      this._serverErrors = { ...this.info.field_errors };
    }
    this._resetDraft();
  }

  /** Merge values imported from an Accelerate config into the draft (unsaved). */
  applyImport(values: Values): void {
    for (const [name, value] of Object.entries(values)) {
      if (this.field(name)) {
        this._draft[name] = clone(value);
        if (isMapping(this.field(name))) {
          this._rows[name] = rowsFromMapping(value);
        }
        delete this._serverErrors[name];
      }
    }
    this._emit();
  }

  value(name: string): unknown {
    return this._draft[name];
  }

  /** The value as an input shows it: empty for null, mappings as JSON. */
  text(name: string): string {
    const value = this._draft[name];
    if (value === null || value === undefined) {
      return '';
    }
    return typeof value === 'object' ? JSON.stringify(value) : String(value);
  }

  setValue(name: string, value: unknown): void {
    this._draft[name] = value;
    delete this._serverErrors[name];
    this._emit();
  }

  /** Set a field from what the user typed, converting by the field's type. */
  setText(name: string, text: string): void {
    const field = this.field(name);
    if (!field) {
      return;
    }
    this.setValue(name, valueFromText(field, text));
  }

  rows(name: string): IRow[] {
    return (this._rows[name] ?? []).map(row => ({ ...row }));
  }

  /** Replace a mapping field's rows; rows without a name and value are ignored. */
  setRows(name: string, rows: IRow[]): void {
    const field = this.field(name);
    if (!field) {
      return;
    }
    this._rows[name] = rows.map(row => ({ ...row }));
    const stringsOnly = STRING_VALUED_MAPPINGS.has(name);
    const mapping: Values = {};
    for (const row of rows) {
      const key = row.key.trim();
      if (key) {
        mapping[key] = stringsOnly ? row.value : parseScalar(row.value);
      }
    }
    this.setValue(name, mapping);
  }

  isDirty(name?: string): boolean {
    if (name === undefined) {
      return this.dirtyKeys().length > 0;
    }
    return stableJson(this._draft[name]) !== stableJson(this._saved[name]);
  }

  dirtyKeys(): string[] {
    return this.schema.map(f => f.name).filter(name => this.isDirty(name));
  }

  /** The message to show next to a field, or null: local checks first, then the server's. */
  errorFor(name: string): string | null {
    const field = this.field(name);
    if (!field) {
      return null;
    }
    return (
      checkValue(field, this._draft[name]) ??
      rowsProblem(this._rows[name]) ??
      this._serverErrors[name] ??
      null
    );
  }

  get hasErrors(): boolean {
    return this.schema.some(f => this.errorFor(f.name) !== null);
  }

  /** Messages from a rejected save, shown next to their fields until edited. */
  setServerErrors(fields: Record<string, string>): void {
    this._serverErrors = { ...fields };
    this._emit();
  }

  /** The draft, as PUT /nblaunch/config expects it. */
  payload(): Values {
    return clone(this._draft);
  }

  /** Which of these GPU indices gpu_ids selects. */
  gpuSelection(allIndices: number[]): Set<number> {
    const ids = this._draft[GPU_IDS];
    if (ids === 'all' || ids === undefined || ids === null) {
      return new Set(allIndices);
    }
    const picked = String(ids)
      .split(',')
      .filter(part => /^\d+$/.test(part.trim()))
      .map(part => Number(part));
    return new Set(allIndices.filter(index => picked.includes(index)));
  }

  /** Tick or untick one GPU; every GPU ticked is written as 'all'. */
  setGpuSelected(index: number, selected: boolean, allIndices: number[]): void {
    const chosen = this.gpuSelection(allIndices);
    if (selected) {
      chosen.add(index);
    } else {
      chosen.delete(index);
    }
    const everyGpu = allIndices.every(i => chosen.has(i));
    const ids = [...chosen].sort((a, b) => a - b).join(',');
    this.setValue(GPU_IDS, everyGpu ? 'all' : ids);
  }

  /** The schema's fields grouped by their group, groups in order of first appearance. */
  groups(): IFieldGroup[] {
    const groups: IFieldGroup[] = [];
    for (const field of this.schema) {
      let group = groups.find(g => g.group === field.group);
      if (!group) {
        group = { group: field.group, fields: [] };
        groups.push(group);
      }
      group.fields.push(field);
    }
    return groups;
  }

  /** Call listener after every change; returns a function that unsubscribes. */
  onChange(listener: () => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  private _resetDraft(): void {
    this._draft = clone(this._saved);
    this._rows = {};
    for (const field of this.schema) {
      if (isMapping(field)) {
        this._rows[field.name] = rowsFromMapping(this._draft[field.name]);
      }
    }
    this._emit();
  }

  private _emit(): void {
    for (const listener of [...this._listeners]) {
      listener();
    }
  }

  private _saved: Values = {};
  private _draft: Values = {};
  private _rows: Record<string, IRow[]> = {};
  private _serverErrors: Record<string, string> = {};
  private _listeners = new Set<() => void>();
}

/** Whether a field is edited as name/value rows. */
export function isMapping(field: IFieldSchema | undefined): boolean {
  return field?.type === 'dict';
}

/** Convert typed text by field type; text that does not convert is kept so checkValue reports it. */
export function valueFromText(field: IFieldSchema, text: string): unknown {
  const trimmed = text.trim();
  if (trimmed === '' && field.nullable) {
    return null;
  }
  if (field.type === 'int' && /^-?\d+$/.test(trimmed)) {
    return Number(trimmed);
  }
  if (field.type === 'float' && trimmed !== '' && Number.isFinite(Number(trimmed))) {
    return Number(trimmed);
  }
  return text;
}

/** A client-side check from the schema; the server checks again on save. */
export function checkValue(field: IFieldSchema, value: unknown): string | null {
  if (value === null || value === undefined) {
    return field.nullable || isMapping(field) ? null : 'a value is required';
  }
  switch (field.type) {
    case 'int':
      if (typeof value !== 'number' || !Number.isInteger(value)) {
        return 'must be a whole number' + (field.nullable ? ' (or empty)' : '');
      }
      break;
    case 'float':
      if (typeof value !== 'number' || !Number.isFinite(value)) {
        return 'must be a number' + (field.nullable ? ' (or empty)' : '');
      }
      break;
    case 'bool':
      if (typeof value !== 'boolean') {
        return 'must be true or false';
      }
      break;
    case 'str':
      if (typeof value !== 'string') {
        return 'must be text';
      }
      if (field.choices && !field.choices.includes(value)) {
        return `must be one of ${field.choices.join(', ')}`;
      }
      if (field.name === GPU_IDS && value !== 'all' && !/^\d+(,\d+)*$/.test(value)) {
        return value === ''
          ? 'choose at least one GPU (or tick use_cpu)'
          : "'all' or GPU indices separated by commas, such as 0,1";
      }
      break;
    case 'dict':
      if (typeof value !== 'object' || Array.isArray(value)) {
        return 'must be a mapping';
      }
      break;
  }
  return checkRange(field, value);
}

/** The schema's bounds, worded as the kernel words them (a port: "from 1 to 65535"). */
function checkRange(field: IFieldSchema, value: unknown): string | null {
  if (typeof value !== 'number') {
    return null;
  }
  const min = field.minimum ?? null;
  const max = field.maximum ?? null;
  const tooLow = min !== null && (field.above_minimum ? value <= min : value < min);
  const tooHigh = max !== null && value > max;
  if (!tooLow && !tooHigh) {
    return null;
  }
  if (min !== null && max !== null) {
    return `must be from ${min} to ${max}`;
  }
  if (tooLow) {
    return field.above_minimum ? `must be more than ${min}` : `must be at least ${min}`;
  }
  return `must be at most ${max}`;
}

/** "2" → 2, "true" → true, "[1, 2]" → [1, 2], anything else stays text. */
export function parseScalar(text: string): unknown {
  const trimmed = text.trim();
  if (/^(-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null|\[.*\]|\{.*\}|".*")$/s.test(trimmed)) {
    try {
      return JSON.parse(trimmed);
    } catch {
      return text;
    }
  }
  return text;
}

function rowsFromMapping(value: unknown): IRow[] {
  if (!value || typeof value !== 'object') {
    return [];
  }
  return Object.entries(value as Values).map(([key, v]) => ({
    key,
    value: typeof v === 'string' ? v : JSON.stringify(v)
  }));
}

function rowsProblem(rows: IRow[] | undefined): string | null {
  const seen = new Set<string>();
  for (const row of rows ?? []) {
    const key = row.key.trim();
    if (!key && row.value.trim()) {
      return `the value "${row.value}" has no name`;
    }
    if (key && seen.has(key)) {
      return `${key} is set twice`;
    }
    seen.add(key);
  }
  return null;
}

function clone<T>(value: T): T {
  return value === undefined ? value : (JSON.parse(JSON.stringify(value)) as T);
}

function stableJson(value: unknown): string {
  return JSON.stringify(value ?? null, (_key, v) =>
    v && typeof v === 'object' && !Array.isArray(v)
      ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => a.localeCompare(b)))
      : v
  );
}
