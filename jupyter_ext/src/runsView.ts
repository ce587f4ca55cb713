/**
 * The "Runs" section of the panel: every launch of this user, newest first, with its state,
 * notebook, engine, elapsed time and root cause; expanded, its ranks (pid, state, CPU, memory,
 * GPU when there is one), a Logs button per rank, and Stacks (where every rank is now) and Stop
 * while it is live.
 *
 * Rows are kept per run and per rank and only their text is updated on each poll, so a
 * button under the pointer is never replaced between press and release.
 */

import { button, h } from './dom';
import {
  formatBytes,
  formatElapsed,
  hasGpuColumns,
  rankStateText,
  runMeta,
  runOrigin,
  RunsModel
} from './runsModel';
import { IRankInfo, IRunDetail, IRunSummary } from './types';

export type OpenLog = (runId: string, rank: number) => void;

export class RunsSection {
  readonly node = h(
    'section',
    { class: 'nblaunch-section nblaunch-runs', 'aria-labelledby': 'nblaunch-runs-title' },
    h('h3', { id: 'nblaunch-runs-title', class: 'nblaunch-section-title' }, 'Runs')
  );

  constructor(
    private readonly _model: RunsModel,
    private readonly _openLog: OpenLog,
    refresh: () => void
  ) {
    this.node.append(
      h(
        'div',
        { class: 'nblaunch-actions' },
        button('Refresh', refresh, {
          class: 'nblaunch-runs-refresh',
          title: 'Read the run folders again'
        }),
        this._summary
      ),
      this._error,
      this._list
    );
    _model.onChange(() => this.render());
    this.render();
  }

  render(): void {
    const model = this._model;
    this._error.textContent = model.error ?? '';
    this._error.hidden = !model.error;
    const live = model.runs.filter(r => r.live).length;
    const count = model.runs.length;
    this._summary.textContent = count
      ? `${count} run${count === 1 ? '' : 's'}, ${live} live${live ? ' · updating every second' : ''}`
      : 'No runs yet: a %%distributed cell or notebook_launcher() call shows up here.';
    const rows: HTMLElement[] = [];
    for (const run of model.runs) {
      let row = this._rows.get(run.id);
      if (!row) {
        row = new RunRow(run.id, this._model, this._openLog);
        this._rows.set(run.id, row);
      }
      row.update(
        run,
        model.details.get(run.id),
        model.expanded.has(run.id),
        model.notes.get(run.id),
        model.stacks.get(run.id)
      );
      rows.push(row.node);
    }
    for (const id of [...this._rows.keys()]) {
      if (!model.run(id)) {
        this._rows.delete(id);
      }
    }
    if (
      rows.length !== this._list.children.length ||
      rows.some((r, i) => this._list.children[i] !== r)
    ) {
      this._list.replaceChildren(...rows);
    }
  }

  private _summary = h('span', { class: 'nblaunch-help nblaunch-runs-summary' });
  private _error = h('p', { class: 'nblaunch-field-error', role: 'alert', hidden: true });
  private _list = h('div', { class: 'nblaunch-run-list' });
  private _rows = new Map<string, RunRow>();
}

class RunRow {
  readonly node: HTMLElement;

  constructor(
    private readonly _id: string,
    private readonly _model: RunsModel,
    private readonly _openLog: OpenLog
  ) {
    this._toggle = h('button', {
      type: 'button',
      class: 'nblaunch-run-toggle',
      'aria-expanded': 'false',
      title: 'Show the ranks of this run'
    });
    this._toggle.addEventListener('click', () => void this._model.toggle(this._id));
    this._stop = button('Stop', () => void this._model.stop(this._id), {
      class: 'jp-mod-warn nblaunch-run-stop',
      title: 'Stop this run: every rank is stopped, and the cell that runs it raises an error'
    });
    this._stacksButton = button('Stacks', () => void this._model.showStacks(this._id), {
      class: 'nblaunch-run-stacks',
      title:
        'Show where every rank is now (its Python stack and the collective it waits in); the run goes on'
    });
    const hide = button('Hide', () => this._model.hideStacks(this._id), {
      class: 'nblaunch-stacks-hide'
    });
    this._stacks = h(
      'div',
      { class: 'nblaunch-run-stacks-box', hidden: true },
      this._stacksText,
      hide
    );
    this.node = h(
      'div',
      { class: 'nblaunch-run', 'data-run-id': _id },
      h('div', { class: 'nblaunch-run-head' }, this._toggle, this._stacksButton, this._stop),
      this._cause,
      this._note,
      this._stacks,
      this._detail
    );
  }

  update(
    run: IRunSummary,
    detail: IRunDetail | undefined,
    expanded: boolean,
    note?: string,
    stacks?: string
  ): void {
    this.node.dataset.state = run.state;
    this._toggle.setAttribute('aria-expanded', String(expanded));
    const what = runMeta(run);
    setChildren(
      this._toggle,
      h('span', { class: 'nblaunch-run-arrow' }, expanded ? '▾' : '▸'),
      h('span', { class: `nblaunch-run-state nblaunch-state-${run.state}` }, run.state),
      h('span', { class: 'nblaunch-run-origin', title: run.id }, runOrigin(run)),
      h('span', { class: 'nblaunch-run-meta' }, what),
      h('span', { class: 'nblaunch-run-elapsed' }, formatElapsed(run.elapsed_s))
    );
    this._stop.hidden = !run.live;
    this._stop.disabled = !run.can_stop;
    if (run.live && !run.can_stop) {
      this._stop.title = `The ${run.engine} engine takes no Stop from the panel: interrupt its kernel (■)`;
    }
    this._stacksButton.hidden = !run.live || !run.can_stop; // asked through the same channel as Stop
    this._stacks.hidden = stacks === undefined || !run.live;
    if (this._stacksText.textContent !== (stacks ?? '')) {
      this._stacksText.textContent = stacks ?? '';
    }
    this._cause.textContent = run.root_cause ?? '';
    this._cause.hidden = !run.root_cause;
    this._note.textContent = note ?? '';
    this._note.hidden = !note;
    this._detail.hidden = !expanded || !detail;
    if (expanded && detail) {
      this._drawDetail(detail);
    }
  }

  private _drawDetail(detail: IRunDetail): void {
    const gpu = hasGpuColumns(detail.ranks);
    const heads = [
      'rank',
      'pid',
      'state',
      'CPU',
      'RSS',
      ...(gpu ? ['GPU', 'GPU mem', 'GPU util'] : []),
      ''
    ];
    const headKey = heads.join('|');
    if (this._headKey !== headKey) {
      this._headKey = headKey;
      this._rankRows.clear();
      this._body.replaceChildren();
      this._table.replaceChildren(
        h('thead', {}, h('tr', {}, ...heads.map(name => h('th', { scope: 'col' }, name)))),
        this._body
      );
    }
    const rows = detail.ranks.map(rank => {
      const texts = rankCells(rank, gpu);
      let row = this._rankRows.get(rank.rank);
      if (!row) {
        const logs = button('Logs', () => this._openLog(this._id, rank.rank), {
          class: 'nblaunch-rank-logs',
          title: `Open rank ${rank.rank}'s log in a tab`
        });
        const cells = texts.map(() => h('td'));
        row = {
          node: h('tr', { 'data-rank': String(rank.rank) }, ...cells, h('td', {}, logs)),
          cells
        };
        this._rankRows.set(rank.rank, row);
      }
      texts.forEach((text, i) => {
        if (row.cells[i].textContent !== text) {
          row.cells[i].textContent = text;
        }
      });
      return row.node;
    });
    if (
      rows.length !== this._body.children.length ||
      rows.some((r, i) => this._body.children[i] !== r)
    ) {
      this._body.replaceChildren(...rows);
    }
    const figures = detail.report
      ? ` · start-up ${detail.report.startup_s?.toFixed(2) ?? '–'} s, wall ${detail.report.wall_s?.toFixed(2) ?? '–'} s`
      : '';
    this._logDir.replaceChildren('logs: ', h('code', {}, detail.log_dir), figures);
    if (!this._detail.children.length) {
      this._detail.append(this._table, this._logDir);
    }
  }

  private _toggle: HTMLButtonElement;
  private _stop: HTMLButtonElement;
  private _stacksButton: HTMLButtonElement;
  private _stacks: HTMLElement;
  private _stacksText = h('pre', { class: 'nblaunch-stacks-text' });
  private _cause = h('div', { class: 'nblaunch-run-cause', hidden: true });
  private _note = h('div', { class: 'nblaunch-run-note', role: 'status', hidden: true });
  private _detail = h('div', { class: 'nblaunch-run-detail', hidden: true });
  private _table = h('table', { class: 'nblaunch-ranks' });
  private _body = h('tbody');
  private _logDir = h('div', { class: 'nblaunch-help nblaunch-run-logdir' });
  private _headKey = '';
  private _rankRows = new Map<
    number,
    { node: HTMLTableRowElement; cells: HTMLTableCellElement[] }
  >();
}

function rankCells(rank: IRankInfo, gpu: boolean): string[] {
  const cpu =
    rank.cpu_percent === undefined || rank.cpu_percent === null ? '–' : `${rank.cpu_percent}%`;
  const cells = [String(rank.rank), rank.pid ? String(rank.pid) : '–', rankStateText(rank), cpu];
  cells.push(formatBytes(rank.rss_bytes));
  if (gpu) {
    cells.push(rank.gpu_index !== undefined ? String(rank.gpu_index) : (rank.gpu ?? '–'));
    cells.push(formatBytes(rank.gpu_memory_bytes));
    const util = rank.gpu_util_percent;
    cells.push(util === undefined || util === null ? '–' : `${util}%`);
  }
  return cells;
}

function setChildren(node: HTMLElement, ...children: HTMLElement[]): void {
  // Same text as before: leave the DOM alone (no flicker, no lost hover).
  const key = children.map(c => `${c.className}:${c.textContent}`).join('\u0000');
  if (node.dataset.key !== key) {
    node.dataset.key = key;
    node.replaceChildren(...children);
  }
}
