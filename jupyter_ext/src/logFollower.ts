/**
 * The state of one rank's log tab: the last lines first, then what the rank appends, while
 * its run is live. No DOM: the fetch is injected (request.ts in the lab), so it is unit-tested alone.
 *
 * Example:
 *   const log = new LogFollower(query => requestAPI<ILogChunk>(`runs/${id}/ranks/0/log`, { params: query }));
 *   await log.poll(); // log.text holds the last 500 lines; poll again while log.live
 */

import { ILogChunk } from './types';

/** Follows one rank's log: the last lines first, then what is appended, while the run is live. */
export class LogFollower {
  text = '';
  live = true;
  /** Bytes of the log before what `text` holds (not shown). */
  hiddenBytes = 0;

  constructor(
    private readonly _fetch: (query: { tail?: number; offset?: number }) => Promise<ILogChunk>,
    readonly tailLines = 500,
    readonly maxChars = 2_000_000
  ) {}

  /** Fetch the next piece; returns true when new text arrived. */
  async poll(): Promise<boolean> {
    const chunk = await this._fetch(
      this._end === null ? { tail: this.tailLines } : { offset: this._end }
    );
    this.live = chunk.live;
    if (this._end === null) {
      this.hiddenBytes = chunk.start;
    }
    this._end = chunk.end;
    if (!chunk.text) {
      return false;
    }
    this.text += chunk.text;
    if (this.text.length > this.maxChars) {
      const cut = this.text.indexOf('\n', this.text.length - this.maxChars);
      const dropped = this.text.slice(0, cut + 1);
      this.hiddenBytes += new TextEncoder().encode(dropped).length;
      this.text = this.text.slice(cut + 1);
    }
    return true;
  }

  private _end: number | null = null;
}
