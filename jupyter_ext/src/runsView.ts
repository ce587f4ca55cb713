/**
 * The sidebar's "Runs" list: every launch of this user, newest first, compact enough for the
 * sidebar's default width (about 250 px): its state, notebook, cell number and start time, what
 * ran and for how long, and its root cause; long texts end in an ellipsis and show whole on hover.
 * A click opens the run's dashboard tab (dashboardView.ts), where its ranks, logs, Stop and
 * Stacks are; a run that can be stopped has its Stop here too, which asks once as the dashboard's
 * does (stopDialog.ts) and tells the server it was pressed in the sidebar.
 *
 * Rows are kept per run and only their text is updated on each poll, so a row under the pointer
 * is never replaced between press and release.
 */

import { runName, startClock, stopButton } from './dashboardModel';
import { button, h } from './dom';
import { formatElapsed, runMeta, runOrigin, RunsModel } from './runsModel';
import { askToStop } from './stopDialog';
import { IRunSummary } from './types';

export type OpenDashboard = (runId: string) => void;

export class RunsSection {
  readonly node = h(
    'section',
    { class: 'nblaunch-section nblaunch-runs', 'aria-labelledby': 'nblaunch-runs-title' },
    h('h3', { id: 'nblaunch-runs-title', class: 'nblaunch-section-title' }, 'Runs')
  );

  constructor(
    private readonly _model: RunsModel,
    private readonly _open: OpenDashboard,
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
      ? `${count} run${count === 1 ? '' : 's'}, ${live} live`
      : 'No runs yet: a %%distributed cell or notebook_launcher() call shows up here.';
    const rows = model.runs.map(run => {
      let row = this._rows.get(run.id);
      if (!row) {
        row = new RunRow(run.id, this._open, this._model);
        this._rows.set(run.id, row);
      }
      row.update(run, model.notes.get(run.id));
      return row.node;
    });
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
  private _list = h('ul', { class: 'nblaunch-run-list' });
  private _rows = new Map<string, RunRow>();
}

/** One run: a button (the whole row) that opens its dashboard, and under it Stop while it can be stopped. */
class RunRow {
  readonly node: HTMLLIElement;

  constructor(
    private readonly _id: string,
    open: OpenDashboard,
    private readonly _model: RunsModel
  ) {
    this._button = h(
      'button',
      { type: 'button', class: 'nblaunch-run-open' },
      h('span', { class: 'nblaunch-run-line' }, this._state, this._origin, this._elapsed),
      h('span', { class: 'nblaunch-run-line' }, this._when),
      h('span', { class: 'nblaunch-run-line' }, this._meta),
      this._cause
    );
    this._button.addEventListener('click', () => open(_id));
    this._stop = button('Stop', () => void this._askAndStop(), {
      class: 'jp-mod-warn nblaunch-run-stop'
    });
    this._actions = h(
      'span',
      { class: 'nblaunch-run-actions', hidden: true },
      this._note,
      this._stop
    );
    this.node = h('li', { class: 'nblaunch-run', 'data-run-id': _id }, this._button, this._actions);
  }

  update(run: IRunSummary, note: string | undefined): void {
    this._run = run;
    this.node.dataset.state = run.state;
    const origin = runOrigin(run);
    const when = `${run.cell ? `cell [${run.cell}] · ` : ''}started ${startClock(run)}`;
    const meta = runMeta(run);
    set(this._state, run.state);
    this._state.className = `nblaunch-run-state nblaunch-state-${run.state}`;
    set(this._origin, origin, run.notebook_path ?? origin);
    set(this._elapsed, formatElapsed(run.elapsed_s));
    set(this._when, when, `${run.id}, ${when}`);
    set(this._meta, meta, meta);
    const cause = run.root_cause || run.note || '';
    set(this._cause, cause, cause);
    this._cause.hidden = !cause;
    this._button.title = `Open the dashboard of ${runName(run)} (${run.state})`;
    const stop = stopButton(run);
    const stopping = note?.startsWith('Stopping') ?? false;
    set(this._stop, stop.stopLabel, stop.stopTitle);
    this._stop.disabled = !run.can_stop || stopping;
    set(this._note, note ?? '', note ?? '');
    this._actions.hidden = !(run.live && (run.can_stop || note));
  }

  /** Stop asks once, as the dashboard's does; Cancel leaves the run alone. */
  private async _askAndStop(): Promise<void> {
    if (this._run && (await askToStop(stopButton(this._run).stopQuestion))) {
      await this._model.stop(this._id, 'sidebar');
    }
  }

  private _run: IRunSummary | null = null;
  private _button: HTMLButtonElement;
  private _stop: HTMLButtonElement;
  private _actions: HTMLSpanElement;
  private _note = h('span', { class: 'nblaunch-run-note nblaunch-ellipsis' });
  private _state = h('span', { class: 'nblaunch-run-state' });
  private _origin = h('span', { class: 'nblaunch-run-origin nblaunch-ellipsis' });
  private _elapsed = h('span', { class: 'nblaunch-run-elapsed' });
  private _when = h('span', { class: 'nblaunch-run-when nblaunch-ellipsis' });
  private _meta = h('span', { class: 'nblaunch-run-meta nblaunch-ellipsis' });
  private _cause = h('span', { class: 'nblaunch-run-cause nblaunch-ellipsis', hidden: true });
}

function set(node: HTMLElement, text: string, title?: string): void {
  if (node.textContent !== text) {
    node.textContent = text; // the same text: the DOM is left alone (no flicker, no lost hover)
  }
  if (title !== undefined && node.title !== title) {
    node.title = title;
  }
}
