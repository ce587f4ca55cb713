/**
 * A run's dashboard, a main-area tab: its facts (notebook, a link to its cell, start time, engine,
 * flags, outcome), Stop and Stacks, charts with axes over the run (dashboardChartsView.ts: every
 * rank's resources and steps per second, the slowest rank named, the training curves), and per rank its pid, state, device and a small chart per
 * figure over the run, with a button that opens the rank's log tab. It draws
 * makeDashboardModel()'s answer for the run's detail in the shared RunsModel, which polls while
 * the run is live.
 *
 * Rows and buttons are kept between polls and only their text and paths change, so a button under
 * the pointer is never replaced between press and release.
 */

import { MainAreaWidget } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import {
  IChartModel,
  IRankModel,
  IDashboardModel,
  makeDashboardModel,
  SPARK_HEIGHT,
  SPARK_WIDTH
} from './dashboardModel';
import { makeDashboardCharts } from './dashboardCharts';
import { DashboardChartsView } from './dashboardChartsView';
import { button, h } from './dom';
import { LogPane } from './logView';
import { RunsModel } from './runsModel';
import { askToStop } from './stopDialog';

/** What the dashboard asks of the lab around it. */
export interface IDashboardActions {
  /** Show that cell of that notebook (opening the notebook if it is not open). */
  openCell(notebook: string, cell: number): void;
  /** A dashboard opened or closed: poll the runs while one is open (or the sidebar is shown). */
  watchChanged(): void;
}

/** The tab's DOM id for one run, so opening it again shows the open tab. */
export function dashboardWidgetId(runId: string): string {
  return `${DASHBOARD_PREFIX}${runId}`;
}

export const DASHBOARD_PREFIX = 'nblaunch-dashboard-';

const SVG = 'http://www.w3.org/2000/svg';

class DashboardContent extends Widget {
  constructor(
    readonly runId: string,
    private readonly _runs: RunsModel,
    private readonly _actions: IDashboardActions
  ) {
    super();
    this.addClass('nblaunch-dashboard');
    this._stop = button('Stop', () => void this._askAndStop(), {
      class: 'jp-mod-warn nblaunch-dash-stop',
      title: 'Stop this run: every rank is stopped, and the cell that runs it raises an error'
    });
    this._stacksButton = button('Stacks', () => void this._runs.showStacks(runId), {
      class: 'nblaunch-dash-stacks',
      title:
        'Show where every rank is now (its Python stack and the collective it waits in); the run goes on'
    });
    const hide = button('Hide stacks', () => this._runs.hideStacks(runId), {
      class: 'nblaunch-stacks-hide'
    });
    this._stacks = h(
      'section',
      { class: 'nblaunch-dash-stacks-box', hidden: true },
      h('div', { class: 'nblaunch-actions' }, h('h3', {}, 'Stacks'), hide),
      this._stacksText
    );
    this.node.append(
      h('header', { class: 'nblaunch-dash-head' }, this._name, this._state),
      this._outcome,
      h('div', { class: 'nblaunch-actions' }, this._stop, this._stacksButton, this._note),
      this._facts,
      this._charts.node,
      h('h3', { class: 'nblaunch-dash-subtitle' }, 'Ranks'),
      this._table,
      h(
        'p',
        { class: 'nblaunch-help nblaunch-dash-chart-help' },
        "The charts above and the figures here are sampled about once a second while the run is watched (a rank on another machine reports its own); steps per second come from each rank's progress bars. Hover a chart for every rank's value at that time."
      ),
      this._stacks,
      h('h3', { class: 'nblaunch-dash-subtitle' }, 'Log'),
      this._log.node
    );
    this._unsubscribe = _runs.onChange(() => this.render());
    this.render();
  }

  protected onAfterAttach(): void {
    void this._runs.watch(this.runId);
    this._actions.watchChanged();
    this._log.start();
  }

  protected onBeforeDetach(): void {
    this._log.stop();
  }

  /** Show rank ``rank``'s log in the pane below the table (the table's Log buttons, a cell's log link). */
  showLog(rank: number): void {
    this._log.setRank(rank);
    this._log.node.scrollIntoView({ block: 'nearest' });
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._unsubscribe();
    this._log.stop();
    this._charts.dispose();
    this._runs.unwatch(this.runId);
    this._actions.watchChanged();
    super.dispose();
  }

  render(): void {
    const detail = this._runs.details.get(this.runId);
    const note = this._runs.notes.get(this.runId);
    this._note.textContent = note ?? '';
    this._note.hidden = !note;
    if (!detail) {
      this._name.textContent = this.runId;
      return;
    }
    const summary = this._runs.run(this.runId);
    const model = makeDashboardModel(summary ? { ...detail, ...summary } : detail);
    this._charts.update(makeDashboardCharts(detail));
    this._model = model;
    this.onModel?.(model);
    this.node.dataset.state = model.state;
    setText(this._name, model.name);
    this._name.title = model.id;
    setText(this._state, model.state);
    this._state.className = `nblaunch-run-state nblaunch-state-${model.state}`;
    setText(this._outcome, model.outcome);
    this._outcome.hidden = !model.outcome;
    this._stop.hidden = !model.live;
    this._stop.disabled = !model.canStop;
    setText(this._stop, model.stopLabel);
    this._stop.title = model.stopTitle;
    this._stacksButton.hidden = !model.canStop;
    const stacks = this._runs.stacks.get(this.runId);
    this._stacks.hidden = stacks === undefined || !model.live;
    setText(this._stacksText, stacks ?? '');
    this._drawFacts(model);
    this._drawRanks(model);
    this._log.setRanks(model.ranks.length);
  }

  /** Stop asks once, saying what it will do (it stops every rank); Cancel leaves the run alone. */
  private async _askAndStop(): Promise<void> {
    const question = this._model?.stopQuestion;
    if (!question) {
      return;
    }
    if (await askToStop(question)) {
      await this._runs.stop(this.runId, 'dashboard');
    }
  }

  /** Called with every model drawn (the tab's title follows the run's name). */
  onModel: ((model: IDashboardModel) => void) | null = null;

  private _drawFacts(model: IDashboardModel): void {
    const key = JSON.stringify([model.facts, model.notebook, model.cell]);
    if (this._factsKey === key) {
      return;
    }
    this._factsKey = key;
    const items = model.facts.flatMap(({ label, value }) => {
      let shown: Node = document.createTextNode(value);
      if (label === 'Cell' && model.notebook && model.cell) {
        const notebook = model.notebook;
        const cell = model.cell;
        const link = h(
          'button',
          {
            type: 'button',
            class: 'nblaunch-link nblaunch-dash-cell',
            title: `Show cell [${cell}] in ${notebook}`
          },
          value
        );
        link.addEventListener('click', () => this._actions.openCell(notebook, cell));
        shown = link;
      }
      return [h('dt', {}, label), h('dd', { title: value }, shown)];
    });
    this._facts.replaceChildren(...items);
  }

  private _drawRanks(model: IDashboardModel): void {
    const heads = [
      'rank',
      'pid',
      ...(model.nodes ? ['node'] : []),
      'state',
      ...(model.gpu ? ['GPU'] : []),
      ...model.columns,
      ''
    ];
    const headKey = heads.join('|');
    if (this._headKey !== headKey) {
      this._headKey = headKey;
      this._rows.clear();
      this._body.replaceChildren();
      this._table.replaceChildren(
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            ...heads.map(name =>
              h(
                'th',
                { scope: 'col', class: name === 'pid' ? 'nblaunch-dash-pid' : undefined },
                name
              )
            )
          )
        ),
        this._body
      );
    }
    const rows = model.ranks.map(rank => {
      let row = this._rows.get(rank.rank);
      if (!row) {
        row = new RankRow(rank.charts.length, model.gpu, model.nodes, () =>
          this.showLog(rank.rank)
        );
        this._rows.set(rank.rank, row);
      }
      row.update(rank, rank.charts);
      return row.node;
    });
    if (
      rows.length !== this._body.children.length ||
      rows.some((r, i) => this._body.children[i] !== r)
    ) {
      this._body.replaceChildren(...rows);
    }
  }

  private _name = h('h2', { class: 'nblaunch-dash-name' });
  private _state = h('span', { class: 'nblaunch-run-state' });
  private _outcome = h('p', { class: 'nblaunch-run-cause nblaunch-dash-outcome', hidden: true });
  private _note = h('span', { class: 'nblaunch-run-note', role: 'status', hidden: true });
  private _facts = h('dl', { class: 'nblaunch-dash-facts' });
  private _charts = new DashboardChartsView();
  private _log = new LogPane(this.runId, 0);
  private _table = h('table', { class: 'nblaunch-ranks nblaunch-dash-ranks' });
  private _body = h('tbody');
  private _stop: HTMLButtonElement;
  private _stacksButton: HTMLButtonElement;
  private _stacks: HTMLElement;
  private _stacksText = h('pre', { class: 'nblaunch-stacks-text' });
  private _factsKey = '';
  private _model: IDashboardModel | null = null;
  private _headKey = '';
  private _rows = new Map<number, RankRow>();
  private _unsubscribe: () => void;
}

/** One rank's row: its texts, one chart per figure (value over a sparkline), and its Log button. */
class RankRow {
  readonly node: HTMLTableRowElement;

  constructor(charts: number, gpu: boolean, nodes: boolean, openLog: () => void) {
    this._gpu = gpu;
    this._nodes = nodes;
    this._texts = Array.from({ length: 3 + Number(gpu) + Number(nodes) }, (_, i) =>
      h('td', { class: i === 1 ? 'nblaunch-dash-pid' : undefined })
    );
    this._charts = Array.from({ length: charts }, () => new Spark());
    const log = button('Log', openLog, {
      class: 'nblaunch-rank-logs',
      title: "Show this rank's log in the pane below"
    });
    this.node = h(
      'tr',
      {},
      ...this._texts,
      ...this._charts.map(c => h('td', { class: 'nblaunch-dash-chart' }, c.node)),
      h('td', {}, log)
    );
  }

  update(rank: IRankModel, charts: IChartModel[]): void {
    this.node.dataset.rank = String(rank.rank);
    const texts = [
      String(rank.rank),
      rank.pid,
      ...(this._nodes ? [rank.node || 'this machine'] : []),
      rank.state,
      ...(this._gpu ? [rank.device || '–'] : [])
    ];
    this._texts.forEach((cell, i) => setText(cell, texts[i]));
    if (this._nodes && this._texts[2].title !== rank.nodeTitle) {
      this._texts[2].title = rank.nodeTitle;
    }
    charts.forEach((chart, i) => this._charts[i]?.update(chart));
  }

  private _texts: HTMLTableCellElement[];
  private _charts: Spark[];
  private _gpu: boolean;
  private _nodes: boolean;
}

/** A figure's current value above its line over the run. */
class Spark {
  readonly node = h('div', { class: 'nblaunch-spark' });

  constructor() {
    this._svg.setAttribute('viewBox', `0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`);
    this._svg.setAttribute('preserveAspectRatio', 'none');
    this._svg.setAttribute('class', 'nblaunch-spark-line');
    this._svg.setAttribute('aria-hidden', 'true');
    this._path.setAttribute('vector-effect', 'non-scaling-stroke');
    this._svg.append(this._path);
    this.node.append(this._value, this._svg);
  }

  update(chart: IChartModel): void {
    this.node.dataset.figure = chart.figure;
    this.node.dataset.samples = String(chart.samples);
    setText(this._value, chart.now);
    this.node.title = `${chart.label} over the run: now ${chart.now}, lowest ${chart.low}, peak ${chart.peak} (${chart.samples} samples)`;
    if (this._path.getAttribute('d') !== chart.path) {
      this._path.setAttribute('d', chart.path);
    }
  }

  private _value = h('span', { class: 'nblaunch-spark-value' });
  private _svg = document.createElementNS(SVG, 'svg');
  private _path = document.createElementNS(SVG, 'path');
}

function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text; // the same text: the DOM is left alone (no flicker, no lost selection)
  }
}

/** Show rank ``rank``'s log in a dashboard tab's log pane (a cell's log link lands there). */
export function showRankLog(widget: Widget, rank: number): void {
  const content = (widget as MainAreaWidget).content;
  if (content instanceof DashboardContent) {
    content.showLog(rank);
  }
}

/** A new dashboard tab for ``runId``; the caller adds it to the shell. */
export function createDashboardWidget(
  runId: string,
  runs: RunsModel,
  actions: IDashboardActions,
  icon: LabIcon
): MainAreaWidget<DashboardContent> {
  const content = new DashboardContent(runId, runs, actions);
  const widget = new MainAreaWidget({ content });
  widget.id = dashboardWidgetId(runId);
  widget.title.icon = icon;
  widget.title.label = runId;
  widget.title.caption = `Run ${runId}`;
  widget.title.closable = true;
  content.onModel = model => {
    widget.title.label = model.name;
    widget.title.caption = `${model.name}: ${model.state} (${model.id})`;
  };
  return widget;
}
