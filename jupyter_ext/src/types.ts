/**
 * The JSON the nblaunch server extension sends (see jupyter_ext/routes.py).
 * The schema itself is Python's (kernelside/config.py); nothing here repeats it.
 */

export type FieldType = 'int' | 'float' | 'bool' | 'str' | 'dict' | 'list';

export type Values = Record<string, unknown>;

/** One config key as kernelside.config.Field.to_json() describes it. */
export interface IFieldSchema {
  name: string;
  type: FieldType;
  default: unknown;
  help: string;
  group: string;
  choices: string[] | null;
  nullable: boolean;
  minimum: number | null;
  accelerate: boolean;
}

/** Why the file on disk could not be loaded (line is 1-based when known). */
export interface IFileError {
  message: string;
  line: number | null;
  key: string | null;
}

/** GET/PUT /nblaunch/config */
export interface IConfigResponse {
  path: string;
  display_path: string;
  root_dir: string;
  source: string;
  exists: boolean;
  read_from: string | null;
  values: Values;
  unknown_keys: string[];
  schema: IFieldSchema[];
  warnings: string[];
  field_errors: Record<string, string>;
  error: IFileError | null;
  features: { multi_machine: boolean };
  saved?: boolean;
}

export interface IGpu {
  index: number;
  name: string;
  memory_bytes: number;
}

/** GET /nblaunch/hardware */
export interface IHardware {
  cpu_count: number | null;
  ram_bytes: number | null;
  torch_version: string | null;
  cuda_version: string | null;
  gpus: IGpu[];
  error?: string;
}

/** POST /nblaunch/accelerate/import */
export interface IImportResponse {
  source: string;
  values: Values;
  warnings: string[];
}

/** POST /nblaunch/accelerate/export */
export interface IExportResponse {
  path: string;
  display_path: string;
  text: string;
  command: string;
}
