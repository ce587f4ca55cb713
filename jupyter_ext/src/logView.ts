/**
 * A rank's log in a read-only main-area tab: the last lines first, then following (every
 * second) while the run is live. The text comes from the server extension
 * (GET /nblaunch/runs/{id}/ranks/{rank}/log): log folders stay outside the server's root.
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { LogFollower } from './logFollower';
import { POLL_MS } from './runsModel';
import { fetchLog } from './request';

/** The tab's DOM id for one rank's log, so a second "Logs" click shows the open tab. */
export function logWidgetId(runId: string, rank: number): string {
  return `nblaunch-log-${runId}-${rank}`;
}

class LogContent extends Widget {
  constructor(
    readonly runId: string,
    readonly rank: number
  ) {
    super();
    this.addClass('nblaunch-log');
    this.node.append(this._status, this._pre);
    this._follower = new LogFollower(query => fetchLog(runId, rank, query));
  }

  protected onAfterAttach(): void {
    void this._poll();
  }

  protected onBeforeDetach(): void {
    this._stopTimer();
  }

  dispose(): void {
    this._stopTimer();
    super.dispose();
  }

  private async _poll(): Promise<void> {
    this._timer = null;
    const pinned = this._pre.scrollHeight - this._pre.scrollTop - this._pre.clientHeight < 24;
    try {
      if (await this._follower.poll()) {
        this._pre.textContent = this._follower.text;
        if (pinned) {
          this._pre.scrollTop = this._pre.scrollHeight; // follow the end unless the user scrolled up
        }
      }
      this._status.textContent = this._statusText();
    } catch (error) {
      this._status.textContent = `Cannot read the log: ${error instanceof Error ? error.message : String(error)}`;
      return;
    }
    if (this._follower.live && this.isAttached && !this.isDisposed) {
      this._timer = setTimeout(() => void this._poll(), POLL_MS);
    }
  }

  private _statusText(): string {
    const f = this._follower;
    const earlier = f.hiddenBytes ? ` (the first ${f.hiddenBytes} bytes are not shown)` : '';
    const state = f.live ? 'following the live run' : 'the run has ended';
    return `rank${this.rank}.log of ${this.runId}, read-only, ${state}${earlier}`;
  }

  private _stopTimer(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _status = h('div', { class: 'nblaunch-log-status', role: 'status' }, 'Loading the log…');
  private _pre = h('pre', { class: 'nblaunch-log-text', tabindex: '0' });
  private _follower: LogFollower;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}

/** A new tab for the log of ``rank`` in ``runId``; the caller adds it to the shell. */
export function createLogWidget(runId: string, rank: number): MainAreaWidget<LogContent> {
  const widget = new MainAreaWidget({ content: new LogContent(runId, rank) });
  widget.id = logWidgetId(runId, rank);
  widget.title.label = `rank ${rank} log`;
  widget.title.caption = `rank${rank}.log of ${runId}`;
  widget.title.closable = true;
  return widget;
}
