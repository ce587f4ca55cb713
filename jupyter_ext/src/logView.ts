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

/**
 * One rank's log as a pane: a rank switcher (when the run has more than one), a search box that shows only the
 * lines containing its text, Follow (keep the newest line in view), the lines stamped with when the kernel
 * received them, polled every second while the run is live. The log tab and the run's dashboard both show one.
 *
 * Example:
 *   const pane = new LogPane(runId, 0);
 *   parent.append(pane.node);
 *   pane.setRanks(4);        // a switcher for ranks 0-3
 *   pane.start();            // poll; pane.stop() when hidden
 */
export class LogPane {
  readonly node = h('div', { class: 'nblaunch-log' });

  constructor(
    readonly runId: string,
    public rank: number
  ) {
    this._search.addEventListener('input', () => this._render(true));
    this._ranks.addEventListener('change', () => this.setRank(Number(this._ranks.value)));
    this._follow.addEventListener('change', () => {
      if (this._follow.checked) {
        this._pre.scrollTop = this._pre.scrollHeight;
      }
    });
    // scrolled up to read: Follow lets go; back at the end: it follows again
    this._pre.addEventListener('scroll', () => {
      const end = this._pre.scrollHeight - this._pre.scrollTop - this._pre.clientHeight < 24;
      this._follow.checked = end;
    });
    this._ranks.hidden = true;
    this.node.append(
      h(
        'div',
        { class: 'nblaunch-log-bar' },
        this._ranks,
        this._search,
        h('label', { class: 'nblaunch-log-follow' }, this._follow, 'Follow'),
        this._count
      ),
      this._status,
      this._pre
    );
    this._follower = this._newFollower();
  }

  /** A switcher for ranks 0 … count-1 (none for a single rank). */
  setRanks(count: number): void {
    if (count === this._ranks.options.length) {
      return;
    }
    this._ranks.replaceChildren(
      ...Array.from({ length: count }, (_, r) => h('option', { value: String(r) }, `rank ${r}`))
    );
    this._ranks.value = String(this.rank);
    this._ranks.hidden = count < 2;
  }

  /** Show another rank's log (from its first lines on). */
  setRank(rank: number): void {
    if (rank === this.rank && this._started) {
      return;
    }
    this.rank = rank;
    this._ranks.value = String(rank);
    this._follower = this._newFollower();
    this._drawn = 0;
    this._firstLine = undefined;
    this._pre.replaceChildren();
    this._status.textContent = 'Loading the log…';
    if (this._started) {
      this._stopTimer();
      void this._poll();
    }
  }

  start(): void {
    this._started = true;
    if (this._timer === null) {
      void this._poll();
    }
  }

  stop(): void {
    this._started = false;
    this._stopTimer();
  }

  private _newFollower(): LogFollower {
    const rank = this.rank;
    this.node.dataset.rank = String(rank);
    return new LogFollower(query => fetchLog(this.runId, rank, query));
  }

  private async _poll(): Promise<void> {
    this._timer = null;
    const follower = this._follower;
    try {
      if (await follower.poll()) {
        if (follower !== this._follower) {
          return; // switched to another rank meanwhile
        }
        this._render(false);
        if (this._follow.checked) {
          this._pre.scrollTop = this._pre.scrollHeight; // the newest line in view
        }
      }
      this._status.textContent = this._statusText();
    } catch (error) {
      this._status.textContent = `Cannot read the log: ${error instanceof Error ? error.message : String(error)}`;
      return;
    }
    if (follower === this._follower && follower.live && this._started) {
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
    return `rank${this.rank}.log, read-only, ${state}${earlier}; ${times}`;
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
  private _started = false;
  private _ranks = h('select', { class: 'nblaunch-log-rank', 'aria-label': 'Rank' });
  private _follow = h('input', {
    type: 'checkbox',
    checked: true,
    'aria-label': 'Follow the newest line'
  });
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _drawn = 0;
  private _matches = 0;
  private _firstLine: ILogLine | undefined;
}

class LogContent extends Widget {
  constructor(runId: string, rank: number) {
    super();
    this.pane = new LogPane(runId, rank);
    this.node.append(this.pane.node);
    this.addClass('nblaunch-log-tab');
  }

  readonly pane: LogPane;

  protected onAfterAttach(): void {
    this.pane.start();
  }

  protected onBeforeDetach(): void {
    this.pane.stop();
  }

  dispose(): void {
    this.pane.stop();
    super.dispose();
  }
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
