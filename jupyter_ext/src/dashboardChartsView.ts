/**
 * The dashboard's charts section: the pace line (the slowest rank named, or why it cannot be), the
 * resource charts (CPU, memory and, with a GPU, its utilisation and memory: a line per rank), each
 * rank's steps per second, and the training curves. It draws makeDashboardCharts()'s answer; charts
 * are kept between polls (only their lines change), so a hover readout survives a refresh.
 */

import { IDashboardCharts } from './dashboardCharts';
import { h } from './dom';
import { ITimeChart } from './timeChart';
import { TimeChartView } from './timeChartView';

export class DashboardChartsView {
  readonly node = h('section', { class: 'nblaunch-dash-charts' });

  constructor() {
    this.node.append(
      this._pace,
      h('h3', { class: 'nblaunch-dash-subtitle' }, 'Ranks over time'),
      this._resources,
      this._metricsTitle,
      this._metrics
    );
  }

  update(charts: IDashboardCharts): void {
    this._pace.textContent = charts.paceText;
    this._pace.dataset.straggler = charts.straggler ? String(charts.straggler.rank) : '';
    this._pace.classList.toggle('nblaunch-dash-straggler', charts.straggler !== null);
    const resources = charts.paceChart ? [...charts.resources, charts.paceChart] : charts.resources;
    draw(this._resources, this._resourceViews, resources);
    this._metricsTitle.hidden = charts.metrics.length === 0;
    draw(this._metrics, this._metricViews, charts.metrics);
  }

  dispose(): void {
    for (const view of [...this._resourceViews.values(), ...this._metricViews.values()]) {
      view.dispose();
    }
  }

  private _pace = h('p', { class: 'nblaunch-dash-pace', role: 'status' });
  private _resources = h('div', { class: 'nblaunch-chart-grid' });
  private _metricsTitle = h(
    'h3',
    { class: 'nblaunch-dash-subtitle', hidden: true },
    'Training curves'
  );
  private _metrics = h('div', { class: 'nblaunch-chart-grid' });
  private _resourceViews = new Map<string, TimeChartView>();
  private _metricViews = new Map<string, TimeChartView>();
}

/** One view per chart title, in the charts' order; views of charts no longer there are removed. */
function draw(parent: HTMLElement, views: Map<string, TimeChartView>, charts: ITimeChart[]): void {
  const shown = new Set(charts.map(c => c.title));
  for (const [title, view] of views) {
    if (!shown.has(title)) {
      view.dispose();
      view.node.remove();
      views.delete(title);
    }
  }
  charts.forEach((chart, i) => {
    let view = views.get(chart.title);
    if (!view) {
      view = new TimeChartView();
      views.set(chart.title, view);
    }
    if (parent.children[i] !== view.node) {
      parent.insertBefore(view.node, parent.children[i] ?? null);
    }
    view.update(chart);
  });
}
