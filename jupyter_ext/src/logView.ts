/**
 * A rank's log in a read-only main-area tab named after its run and rank ('train 15:23:01 · rank 1'):
 * the last lines first, then following (every second) while the run is live, each line stamped
 * with when the kernel received it, and a search box that shows only the lines containing its text. The text
 * comes from the server extension (GET /nblaunch/runs/{id}/ranks/{rank}/log): log folders stay
 * outside the server's root.
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { launchIcon } from './icon';
import { ILogLine, LogFollower, searchLines, stampText } from './logFollower';
import { POLL_MS } from './runsModel';
import { fetchLog } from './request';

/** The tab's DOM id for one rank's log, so a second "Log" click shows the open tab. */
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
    this._search.addEventListener('input', () => this._render(true));
    this.node.append(
      h('div', { class: 'nblaunch-log-bar' }, this._search, this._count),
      this._status,
      this._pre
    );
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
        this._render(false);
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

  /** Draw the lines the search lets through; only new lines unless `full` (or lines were dropped). */
  private _render(full: boolean): void {
    const lines = this._follower.lines;
    const query = this._search.value;
    const first = lines[0];
    if (full || first !== this._firstLine || this._drawn > lines.length) {
      this._pre.replaceChildren();
      this._drawn = 0;
      this._matches = 0;
      this._firstLine = first;
    } else if (this._drawn > 0) {
      // the last line drawn may have grown since (a line written in pieces): draw it again
      this._drawn -= 1;
      const last = this._pre.lastElementChild as HTMLElement | null;
      if (last?.dataset.index === String(this._drawn)) {
        last.remove();
        this._matches -= 1;
      }
    }
    const found = searchLines(lines.slice(this._drawn), query);
    const nodes = found.map(({ index, line }) => lineNode(line, this._drawn + index, query));
    this._pre.append(...nodes);
    this._matches += found.length;
    this._drawn = lines.length;
    this._count.textContent = query
      ? `${this._matches} of ${lines.length} lines contain “${query}”`
      : `${lines.length} lines`;
  }

  private _statusText(): string {
    const f = this._follower;
    const earlier = f.hiddenBytes ? ` (the first ${f.hiddenBytes} bytes are not shown)` : '';
    const state = f.live ? 'following the live run' : 'the run has ended';
    const times = f.kernelTimes
      ? 'times are when the kernel received each line'
      : 'times are when a line reached this tab';
    return `rank${this.rank}.log of ${this.runId}, read-only, ${state}${earlier}; ${times}`;
  }

  private _stopTimer(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _search = h('input', {
    type: 'search',
    class: 'nblaunch-input nblaunch-log-search',
    placeholder: 'Search this log',
    'aria-label': 'Show only the lines that contain'
  });
  private _count = h('span', { class: 'nblaunch-help nblaunch-log-count' });
  private _status = h('div', { class: 'nblaunch-log-status', role: 'status' }, 'Loading the log…');
  private _pre = h('pre', { class: 'nblaunch-log-text', tabindex: '0' });
  private _follower: LogFollower;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _drawn = 0;
  private _matches = 0;
  private _firstLine: ILogLine | undefined;
}

function lineNode(line: ILogLine, index: number, query: string): HTMLElement {
  const node = h(
    'span',
    { class: 'nblaunch-log-line', 'data-index': String(index) },
    h('span', { class: 'nblaunch-log-stamp', 'aria-hidden': 'true' }, stampText(line.at))
  );
  if (!query) {
    node.append(line.text);
    return node;
  }
  const lower = line.text.toLowerCase();
  const needle = query.toLowerCase();
  let at = 0;
  for (let hit = lower.indexOf(needle); hit >= 0; hit = lower.indexOf(needle, at)) {
    node.append(line.text.slice(at, hit), h('mark', {}, line.text.slice(hit, hit + needle.length)));
    at = hit + needle.length;
  }
  node.append(line.text.slice(at));
  return node;
}

/** A new tab for the log of ``rank`` in ``runId``, titled ``title``; the caller adds it to the shell. */
export function createLogWidget(
  runId: string,
  rank: number,
  title: string
): MainAreaWidget<LogContent> {
  const widget = new MainAreaWidget({ content: new LogContent(runId, rank) });
  widget.id = logWidgetId(runId, rank);
  widget.title.label = title;
  widget.title.icon = launchIcon;
  widget.title.caption = `rank${rank}.log of ${runId}`;
  widget.title.closable = true;
  return widget;
}
