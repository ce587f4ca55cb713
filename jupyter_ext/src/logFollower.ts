/**
 * The state of one rank's log tab: the last lines first, then what the rank appends, while
 * its run is live, each line stamped with when the kernel had it (or, without the run's times, when it
 * reached the tab). No DOM: the fetch and the
 * clock are injected (request.ts in the lab), so it is unit-tested alone.
 *
 * Example:
 *   const log = new LogFollower(query => requestAPI<ILogChunk>(`runs/${id}/ranks/0/log`, { params: query }));
 *   await log.poll(); // log.lines holds the last 500 lines; poll again while log.live
 */

import { ILogChunk } from './types';

/**
 * One line of a log; `at` is when the kernel had it (ms since the epoch) or, for a run without times, when it
 * reached the tab; null for a line of such a run that was there before the tab opened.
 */
export interface ILogLine {
  at: number | null;
  text: string;
}

/** Follows one rank's log: the last lines first, then what is appended, while the run is live. */
export class LogFollower {
  live = true;
  /** Bytes of the log before what `lines` holds (not shown). */
  hiddenBytes = 0;
  /** Whether the run keeps its lines' times (the kernel's); else a line's time is when it reached the tab. */
  kernelTimes = false;
  /** The log's lines; the last one may still be growing (no newline yet). */
  readonly lines: ILogLine[] = [];

  constructor(
    private readonly _fetch: (query: { tail?: number; offset?: number }) => Promise<ILogChunk>,
    readonly tailLines = 500,
    readonly maxChars = 2_000_000,
    private readonly _now: () => number = () => Date.now()
  ) {}

  /** The whole text held, as the log has it. */
  get text(): string {
    return this.lines.map(l => l.text).join('');
  }

  /** Fetch the next piece; returns true when new text arrived. */
  async poll(): Promise<boolean> {
    const first = this._end === null;
    const chunk = await this._fetch(first ? { tail: this.tailLines } : { offset: this._end! });
    this.live = chunk.live;
    if (first) {
      this.hiddenBytes = chunk.start;
    }
    this._end = chunk.end;
    if (!chunk.text) {
      return false;
    }
    if (chunk.times?.some(t => typeof t === 'number')) {
      this.kernelTimes = true;
    }
    this._append(chunk.text, first ? null : this._now(), chunk.times);
    this._trim();
    return true;
  }

  /** `times`: the kernel's time of each piece (seconds), preferred to `at` (when it reached the tab). */
  private _append(text: string, at: number | null, times?: (number | null)[]): void {
    const pieces = text.split(/(?<=\n)/);
    const when = (i: number): number | null => {
      const t = times?.[i];
      return typeof t === 'number' ? t * 1000 : at;
    };
    let i = 0;
    const last = this.lines[this.lines.length - 1];
    if (last && !last.text.endsWith('\n')) {
      last.text += pieces.shift() ?? ''; // the rest of a line that was still being written
      const t = times?.[i++];
      if (typeof t === 'number') {
        last.at = t * 1000; // the kernel's time: when it was complete (else the stamp of its start stays)
      }
    }
    for (const piece of pieces) {
      this.lines.push({ at: when(i++), text: piece });
    }
    this._chars += text.length;
  }

  private _trim(): void {
    let dropped = 0;
    while (this._chars > this.maxChars && this.lines.length > 1) {
      const line = this.lines.shift()!;
      this._chars -= line.text.length;
      dropped += new TextEncoder().encode(line.text).length;
    }
    this.hiddenBytes += dropped;
  }

  private _end: number | null = null;
  private _chars = 0;
}

/** The lines that contain query (case-insensitive), with their index; all of them for ''. */
export function searchLines(lines: ILogLine[], query: string): { index: number; line: ILogLine }[] {
  const needle = query.toLowerCase();
  const found: { index: number; line: ILogLine }[] = [];
  lines.forEach((line, index) => {
    if (!needle || line.text.toLowerCase().includes(needle)) {
      found.push({ index, line });
    }
  });
  return found;
}

/** '15:23:01' for a line's time, '' for a line without one. */
export function stampText(at: number | null): string {
  if (at === null) {
    return '';
  }
  const d = new Date(at);
  return [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map(n => String(n).padStart(2, '0'))
    .join(':');
}
