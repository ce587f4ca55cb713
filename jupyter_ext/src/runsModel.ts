/**
 * The Runs' state, shared by the sidebar's list and every run's dashboard tab: the runs the server
 * lists, the details of the runs a dashboard shows (`watched`), what
 * Stop answered, and whether to keep polling. No DOM and no JupyterLab imports: the server
 * is reached through an IRunsBackend (request.ts in the panel), so it is unit-tested alone.
 *
 * Example:
 *   const model = new RunsModel(backend);
 *   await model.refresh();          // list, and the detail of every run a dashboard shows
 *   model.shouldPoll();             // true while a run is live (or a cell was just started)
 */

import {
  IRankInfo,
  IRunDetail,
  IRunSummary,
  IStackFrame,
  IStacksResponse,
  IStopResponse,
  StopPlace
} from './types';

/** How the model reaches the server; the panel's implementation calls requestAPI. */
export interface IRunsBackend {
  list(): Promise<IRunSummary[]>;
  detail(id: string): Promise<IRunDetail>;
  stop(id: string, place: StopPlace): Promise<IStopResponse>;
  stacks(id: string): Promise<IStacksResponse>;
}

/** After a cell finishes, keep polling this long: a launch it started may just be ending. */
export const CELL_GRACE_MS = 3000;
const STOPPING = 'Stopping';
/** While any run is live the view refreshes this often (at least once a second). */
export const POLL_MS = 1000;

export class RunsModel {
  runs: IRunSummary[] = [];
  /** Why the last refresh failed, or null. */
  error: string | null = null;
  readonly watched = new Set<string>();
  readonly details = new Map<string, IRunDetail>();
  /** Per run: "Stopping…", or the server's reason for refusing Stop. */
  readonly notes = new Map<string, string>();
  /** Per run: its ranks' stacks as last asked for (Stacks), as text. */
  readonly stacks = new Map<string, string>();

  constructor(
    private readonly _backend: IRunsBackend,
    private readonly _now: () => number = () => Date.now()
  ) {}

  get anyLive(): boolean {
    return this.runs.some(run => run.live);
  }

  /** Poll while a run is live, while a cell is executing in this lab, and shortly after. */
  shouldPoll(): boolean {
    return this.anyLive || this._cellsRunning.size > 0 || this._now() < this._graceUntil;
  }

  /** A notebook cell (by its id) was scheduled to run: it may start a launch, so start watching. */
  cellStarted(cellId: string): void {
    this._cellsRunning.add(cellId);
  }

  /** That cell finished (markdown cells finish without having started: ignored). */
  cellFinished(cellId: string): void {
    if (this._cellsRunning.delete(cellId)) {
      this._graceUntil = this._now() + CELL_GRACE_MS;
    }
  }

  /**
   * Fetch the list, then the detail of each watched run that is still listed. Refreshes run
   * one at a time (a poll and a Stop's refresh never interleave, so no older answer lands last);
   * asked for during one, one more follows it.
   */
  refresh(): Promise<void> {
    if (this._inFlight) {
      this._again ??= this._inFlight.then(() => {
        this._again = null;
        return this.refresh();
      });
      return this._again;
    }
    this._inFlight = this._refreshOnce().finally(() => {
      this._inFlight = null;
    });
    return this._inFlight;
  }

  private async _refreshOnce(): Promise<void> {
    try {
      this.runs = await this._backend.list();
      this.error = null;
    } catch (error) {
      this.error = messageOf(error);
      this._emit();
      return;
    }
    for (const run of this.runs) {
      const stopped = !run.live || (run.session && run.state !== 'running'); // (a session's stopped cell)
      if (stopped && this.notes.get(run.id)?.startsWith(STOPPING)) {
        this.notes.delete(run.id); // its state says "stopped" (or "idle") now; a refusal's reason stays
      }
    }
    const listed = new Set(this.runs.map(run => run.id));
    for (const id of [...this.watched]) {
      if (!listed.has(id)) {
        this.watched.delete(id);
        this.details.delete(id);
      }
    }
    await Promise.all([...this.watched].map(id => this._loadDetail(id)));
    this._emit();
  }

  /** A dashboard shows this run: its detail is loaded now and on every refresh until unwatch(). */
  async watch(id: string): Promise<void> {
    this.watched.add(id);
    await this._loadDetail(id);
    this._emit();
  }

  /** The run's dashboard closed: stop loading its detail. */
  unwatch(id: string): void {
    this.watched.delete(id);
    this.details.delete(id);
  }

  /** Ask the server to stop a run, saying where Stop was pressed; a refusal's reason is kept as the run's note. */
  async stop(id: string, place: StopPlace): Promise<void> {
    this.notes.set(id, `${STOPPING}…`);
    this._emit();
    try {
      await this._backend.stop(id, place);
    } catch (error) {
      this.notes.set(id, `Not stopped: ${messageOf(error)}`);
    }
    await this.refresh();
  }

  /** Ask for every rank's current stack (the run goes on); Stacks again refreshes, a refusal is the note. */
  async showStacks(id: string): Promise<void> {
    try {
      this.stacks.set(id, stacksText(await this._backend.stacks(id)));
      this.notes.delete(id);
    } catch (error) {
      this.stacks.delete(id);
      this.notes.set(id, `No stacks: ${messageOf(error)}`);
    }
    this._emit();
  }

  /** Hide the stacks shown for a run. */
  hideStacks(id: string): void {
    this.stacks.delete(id);
    this._emit();
  }

  run(id: string): IRunSummary | undefined {
    return this.runs.find(run => run.id === id);
  }

  /** Call listener after every change; returns a function that unsubscribes. */
  onChange(listener: () => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  private async _loadDetail(id: string): Promise<void> {
    try {
      this.details.set(id, await this._backend.detail(id));
    } catch (error) {
      this.notes.set(id, messageOf(error));
    }
  }

  private _emit(): void {
    for (const listener of [...this._listeners]) {
      listener();
    }
  }

  private _cellsRunning = new Set<string>();
  private _inFlight: Promise<void> | null = null;
  private _again: Promise<void> | null = null;
  private _graceUntil = 0;
  private _listeners = new Set<() => void>();
}

/**
 * Calls model.refresh() every POLL_MS while model.shouldPoll(); start() again to wake it.
 * Timers are injected so tests drive time themselves.
 */
export class RunsPoller {
  constructor(
    private readonly _model: RunsModel,
    private readonly _timers: {
      set: (fn: () => void, ms: number) => unknown;
      clear: (handle: unknown) => void;
    } = {
      set: (fn, ms) => setTimeout(fn, ms),
      clear: handle => clearTimeout(handle as ReturnType<typeof setTimeout>)
    },
    private readonly _intervalMs: number = POLL_MS
  ) {}

  get polling(): boolean {
    return this._handle !== null || this._busy;
  }

  /** Refresh now and keep polling while there is something to watch. */
  async start(): Promise<void> {
    this.stop();
    this._stopped = false;
    await this._tick();
  }

  /** No more refreshes until start() (a refresh in flight does not re-arm the timer). */
  stop(): void {
    this._stopped = true;
    if (this._handle !== null) {
      this._timers.clear(this._handle);
      this._handle = null;
    }
  }

  private async _tick(): Promise<void> {
    this._handle = null;
    this._busy = true;
    try {
      await this._model.refresh();
    } finally {
      this._busy = false;
    }
    if (!this._stopped && this._model.shouldPoll() && this._handle === null) {
      this._handle = this._timers.set(() => void this._tick(), this._intervalMs);
    }
  }

  private _handle: unknown = null;
  private _busy = false;
  private _stopped = false;
}

/** "00:42", "12:03", "1:02:03" */
export function formatElapsed(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '–';
  }
  const s = Math.floor(seconds);
  const mm = String(Math.floor(s / 60) % 60).padStart(2, '0');
  const ss = String(s % 60).padStart(2, '0');
  return s >= 3600 ? `${Math.floor(s / 3600)}:${mm}:${ss}` : `${mm}:${ss}`;
}

/** "512 MiB", "1.5 GiB" */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return '–';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 10 || unit === 0 ? value.toFixed(0) : value.toFixed(1)} ${units[unit]}`;
}

/** Whether any rank carries GPU figures: only then does the ranks table show GPU columns. */
export function hasGpuColumns(ranks: IRankInfo[]): boolean {
  return ranks.some(r => r.gpu_index !== undefined || (r.gpu !== undefined && r.gpu !== null));
}

/** What the ranks table's state cell says: "running", "failed: exit code 1". */
export function rankStateText(rank: IRankInfo): string {
  return rank.exit && rank.state !== 'running' ? `${rank.state}: ${rank.exit}` : rank.state;
}

/** What ran, as the list shows it: 'local · 2 ranks · gloo', and for a live session its cells and restarts. */
export function runMeta(run: IRunSummary): string {
  const ranks = run.world_size ? `${run.world_size} ranks` : '';
  let session = '';
  if (run.session) {
    const cells = run.cells_run ?? 0;
    session = `live session, ${cells} cell${cells === 1 ? '' : 's'} run`;
    if (run.restarts) {
      session += `, ${run.restarts} restart${run.restarts === 1 ? '' : 's'}`;
    }
  }
  return [run.engine, ranks, run.backend, session].filter(Boolean).join(' · ');
}

/** The notebook (or kernel) a run came from, as the list shows it. */
export function runOrigin(run: IRunSummary): string {
  if (run.notebook) {
    return run.notebook;
  }
  if (run.kernel_id) {
    return `kernel ${run.kernel_id.slice(0, 8)}`;
  }
  return run.kernel_pid ? `process ${run.kernel_pid}` : 'unknown origin';
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Each rank's place and collective, then its own frames (innermost last), as the Stacks box shows them. */
export function stacksText(answer: IStacksResponse, now: number = Date.now() / 1000): string {
  const taken = new Date((answer.taken ?? now) * 1000);
  const clock = [taken.getHours(), taken.getMinutes(), taken.getSeconds()]
    .map(n => String(n).padStart(2, '0'))
    .join(':');
  const head = `Taken at ${clock}, every rank at once; the run went on.`;
  const ranks = answer.ranks.map(rank => {
    if (!rank.answered) {
      return `rank ${rank.rank}: ${rank.reason ?? 'no answer'}`;
    }
    const calling = rank.calling ? `, calling ${rank.calling}()` : '';
    const waits = rank.collective ? `, waiting in torch.distributed.${rank.collective}()` : '';
    const lines = [`rank ${rank.rank}: ${rank.where ?? 'no Python frame'}${calling}${waits}`];
    if (rank.source) {
      lines.push(`    ${rank.source}`);
    }
    // the frames around it, outermost first; the one named above is not repeated
    const frames = rank.frames ?? [];
    const at = frames.map(f => f.where).lastIndexOf(rank.where ?? '');
    const show = (title: string, list: IStackFrame[]) =>
      list.length ? [title, ...list.map(f => `    ${f.user ? '' : '· '}${f.where}`)] : [];
    lines.push(
      ...show('  called from:', at < 0 ? frames : frames.slice(0, at)),
      ...show('  inside:', at < 0 ? [] : frames.slice(at + 1))
    );
    return lines.join('\n');
  });
  return [head, ...ranks].join('\n\n');
}
