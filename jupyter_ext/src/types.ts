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
  /** Inclusive upper bound (a port: 65535); absent from older servers' schemas. */
  maximum?: number | null;
  /** The minimum itself is not allowed (a timeout of 0 s). */
  above_minimum?: boolean;
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

/**
 * A run's state (kernelside/run_contract.py RunState), as the kernel that runs it writes it; "lost"
 * (its kernel went away mid-run) and "unknown" (an unreadable state file) are the server's verdicts.
 * tests/test_run_contract.py fails if this list and the enum differ.
 */
export type RunState =
  | 'starting'
  | 'running'
  | 'idle'
  | 'done'
  | 'failed'
  | 'timeout'
  | 'interrupted'
  | 'stopped'
  | 'lost'
  | 'unknown';

/**
 * A rank's state (kernelside/run_contract.py RankState, where its transitions are written down), as the
 * kernel's run recorder decided it. tests/test_run_contract.py fails if this list and the enum differ.
 */
export type RankState =
  'starting' | 'running' | 'idle' | 'busy' | 'done' | 'failed' | 'stopped' | 'dead';

/** One entry of GET /nblaunch/runs (newest first). */
export interface IRunSummary {
  id: string;
  state: RunState;
  live: boolean;
  can_stop: boolean;
  started: number | null;
  elapsed_s: number | null;
  /** The notebook's path, relative to the server's root when it is inside it (notebook_path: as the kernel gave it). */
  notebook: string | null;
  notebook_path: string | null;
  /** The execution count of the cell that started it, and that cell's %%distributed flags. */
  cell?: number | null;
  flags?: string | null;
  kernel_id: string | null;
  kernel_pid: number | null;
  engine: string | null;
  world_size: number | null;
  backend: string | null;
  start_method: string | null;
  root_cause: string | null;
  /** Another run-folder format (its state not read) or a kernel with another nblaunch: what to upgrade. */
  note?: string | null;
  /** A live session (%distributed_start): one entry for its whole life, with its cells and restarts. */
  session?: boolean;
  cells_run?: number | null;
  restarts?: number | null;
}

/** One rank in GET /nblaunch/runs/{id}; the figures are there only for a live rank proven to be the run's. */
export interface IRankInfo {
  rank: number;
  pid: number | null;
  /** A RankState; the server passes on what the state file says (read, never trusted), so any word may come. */
  state: RankState | string;
  exit: string | null;
  log: string | null;
  gpu?: string | null;
  /** A rank of a world past one machine: its node ('IP (node id)'); a rank elsewhere reports its own figures. */
  node?: string | null;
  /** Its process's start time on the server's machine; null for a rank on another machine. */
  pid_start?: number | null;
  cpu_percent?: number | null;
  rss_bytes?: number;
  gpu_index?: number;
  gpu_memory_bytes?: number | null;
  gpu_util_percent?: number | null;
}

/** GET /nblaunch/runs/{id} */
export interface IRunDetail extends IRunSummary {
  ranks: IRankInfo[];
  log_dir: string;
  report: { startup_s: number | null; wall_s: number | null; exit: string[] } | null;
  /** The ranks' figures over the run so far, as the server sampled them (jupyter_ext/rank_history.py). */
  history?: IRankHistory;
  /** The run's training curves and each rank's progress counts (GET /nblaunch/runs/{id}/series). */
  curves?: IRunCurves;
}

/** GET /nblaunch/runs/{id}/series (jupyter_ext/run_curves.py): what the run's kernel wrote to series.jsonl. */
export interface IRunCurves {
  /** Metrics points as logged ({step, loss, …}, 'rank' with --progress all), with when and from which rank. */
  metrics: Record<string, number | string | boolean | null>[];
  /** Each rank's progress bars: [wall seconds, count] pairs, oldest first. */
  bars: {
    rank: number;
    bar: string;
    desc: string;
    total: number | null;
    unit: string;
    pace: [number, number][];
  }[];
  full: boolean;
}

/** One figure a rank is charted by. */
export type RankFigure = 'cpu_percent' | 'rss_bytes' | 'gpu_memory_bytes' | 'gpu_util_percent';

/** Samples oldest first: one time (wall seconds) per entry, one value (or null: none then) per figure. */
export interface IRankHistory {
  t: number[];
  ranks: Record<string, Record<RankFigure, (number | null)[]>>;
}

/** GET /nblaunch/runs/{id}/ranks/{rank}/log */
export interface ILogChunk {
  id: string;
  rank: number;
  log: string;
  live: boolean;
  text: string;
  start: number;
  end: number;
  size: number;
  /**
   * When the kernel had each piece of `text` (a line with its newline; a last one without), in seconds
   * since the epoch (the run folder's rank<N>.times); null where that file does not say.
   */
  times?: (number | null)[];
}

/** POST /nblaunch/runs/{id}/stop */
/** Where Stop was pressed (the server's STOP_PLACES): the words after it name it. */
export type StopPlace = 'dashboard' | 'sidebar' | 'panel';

export interface IStopResponse {
  id: string;
  stopping: boolean;
  message: string;
}

/** One frame of a rank's stack, outermost first; `where` is how a person reads it. */
export interface IStackFrame {
  file: string;
  line: number | null;
  function: string;
  where: string;
  /** Not torch's, nblaunch's or another library's: the user's own code. */
  user: boolean;
}

/** One rank's answer: its main thread's frames and the collective it waits in, or why it gave none. */
export interface IRankStack {
  rank: number;
  answered: boolean;
  reason?: string;
  frames?: IStackFrame[];
  collective?: string | null;
  where?: string | null;
  /** The text of the line the rank stands on, '' when unknown. */
  source?: string;
  /** The C function that line calls now ('sleep'), or null. */
  calling?: string | null;
}

/** GET /nblaunch/runs/{id}/stacks */
export interface IStacksResponse {
  id: string;
  ranks: IRankStack[];
  /** When the ranks were asked, seconds since the epoch (null from an older kernel). */
  taken?: number | null;
}
