/**
 * Draws a timeChart.ts model as an SVG sized to its box: value ticks with units on the left, time (or
 * step) ticks below, one line per series, the legend above the plot (HTML, so it never covers a tick)
 * and a readout line under it: every line's value at the hovered sample, or the latest one otherwise.
 *
 * Example:
 *   const view = new TimeChartView();
 *   parent.append(view.node);
 *   view.update(makeTimeChart('CPU per rank', 'percent', lines, 'time'));
 */

import { h } from './dom';
import { formatClock, ITimeChart, nearestX, valueAt } from './timeChart';

const SVG = 'http://www.w3.org/2000/svg';
export const CHART_HEIGHT = 150;
const LEFT = 58; // room for a y tick label such as '1023 MiB'
const RIGHT = 12;
const TOP = 8;
const BOTTOM = 22;

export class TimeChartView {
  readonly node = h('figure', { class: 'nblaunch-chart' });

  constructor() {
    this._svg.setAttribute('class', 'nblaunch-chart-plot');
    this._svg.setAttribute('height', String(CHART_HEIGHT));
    this._svg.setAttribute('role', 'img');
    this.node.append(
      h('figcaption', { class: 'nblaunch-chart-head' }, this._title, this._legend),
      this._svg,
      this._readout
    );
    this._svg.addEventListener('mousemove', e => this._hover(e));
    this._svg.addEventListener('mouseleave', () => this._hover(null));
    this._resize = new ResizeObserver(() => this._draw());
    this._resize.observe(this.node);
  }

  update(chart: ITimeChart): void {
    this._chart = chart;
    this.node.dataset.title = chart.title;
    this._title.textContent = chart.title;
    const legendKey = chart.lines.map(l => l.label + l.color).join('|');
    if (legendKey !== this._legendKey) {
      this._legendKey = legendKey;
      this._legend.replaceChildren(
        ...chart.lines.map(line =>
          h(
            'span',
            { class: 'nblaunch-chart-key' },
            h('span', { class: 'nblaunch-chart-swatch', style: `background:${line.color}` }),
            line.label
          )
        )
      );
    }
    this._draw();
  }

  dispose(): void {
    this._resize.disconnect();
  }

  private _draw(): void {
    const chart = this._chart;
    const width = this.node.clientWidth;
    if (!chart || width < 80) {
      return;
    }
    this._width = width;
    this._svg.setAttribute('width', String(width));
    this._svg.setAttribute('viewBox', `0 0 ${width} ${CHART_HEIGHT}`);
    const parts: Element[] = [];
    const { x, y } = chart;
    for (const tick of y.ticks) {
      const py = this._py(tick.at);
      parts.push(
        svg('line', { x1: LEFT, x2: width - RIGHT, y1: py, y2: py, class: 'nblaunch-chart-grid' })
      );
      parts.push(
        svg(
          'text',
          { x: LEFT - 6, y: py + 4, 'text-anchor': 'end', class: 'nblaunch-chart-tick' },
          tick.label
        )
      );
    }
    for (const tick of x.ticks) {
      const px = this._px(tick.at);
      parts.push(
        svg('line', {
          x1: px,
          x2: px,
          y1: CHART_HEIGHT - BOTTOM,
          y2: CHART_HEIGHT - BOTTOM + 4,
          class: 'nblaunch-chart-axis'
        })
      );
      parts.push(
        svg(
          'text',
          { x: px, y: CHART_HEIGHT - 6, 'text-anchor': 'middle', class: 'nblaunch-chart-tick' },
          tick.label
        )
      );
    }
    parts.push(
      svg('line', {
        x1: LEFT,
        x2: width - RIGHT,
        y1: CHART_HEIGHT - BOTTOM,
        y2: CHART_HEIGHT - BOTTOM,
        class: 'nblaunch-chart-axis'
      })
    );
    for (const line of chart.lines) {
      let d = '';
      let pen = false;
      for (const [px, py] of line.points) {
        if (py === null || !Number.isFinite(py)) {
          pen = false;
          continue;
        }
        d += `${pen ? 'L' : 'M'}${this._px(px).toFixed(1)},${this._py(py).toFixed(1)} `;
        pen = true;
      }
      parts.push(svg('path', { d: d.trim(), stroke: line.color, class: 'nblaunch-chart-line' }));
    }
    this._rule = svg('line', {
      y1: TOP,
      y2: CHART_HEIGHT - BOTTOM,
      class: 'nblaunch-chart-rule',
      visibility: 'hidden'
    });
    parts.push(this._rule);
    this._svg.replaceChildren(...parts);
    this._showReadout(this._hoverX);
  }

  private _hover(e: MouseEvent | null): void {
    const chart = this._chart;
    if (!chart || !e) {
      this._hoverX = null;
    } else {
      const box = this._svg.getBoundingClientRect();
      const fraction = (e.clientX - box.left - LEFT) / Math.max(1, this._width - LEFT - RIGHT);
      this._hoverX = nearestX(chart, chart.x.min + fraction * (chart.x.max - chart.x.min));
    }
    this._showReadout(this._hoverX);
  }

  private _showReadout(at: number | null): void {
    const chart = this._chart;
    if (!chart) {
      return;
    }
    const hovering = at !== null;
    this._rule?.setAttribute('visibility', hovering ? 'visible' : 'hidden');
    if (hovering) {
      this._rule?.setAttribute('x1', String(this._px(at)));
      this._rule?.setAttribute('x2', String(this._px(at)));
    }
    const where = hovering
      ? chart.axis === 'time'
        ? `at ${formatClock(at)}`
        : `step ${at}`
      : 'latest';
    const values = chart.lines.map(line => {
      const value = hovering ? valueAt(line, at) : lastValue(line.points);
      return `${line.label} ${value === null ? '–' : chart.format(value)}`;
    });
    this._readout.dataset.hovering = String(hovering);
    this._readout.textContent = `${where}: ${values.join(' · ') || 'no samples yet'}`;
  }

  private _px(value: number): number {
    const { min, max } = this._chart!.x;
    return LEFT + ((value - min) / (max - min || 1)) * (this._width - LEFT - RIGHT);
  }

  private _py(value: number): number {
    const { min, max } = this._chart!.y;
    return (
      CHART_HEIGHT - BOTTOM - ((value - min) / (max - min || 1)) * (CHART_HEIGHT - BOTTOM - TOP)
    );
  }

  private _chart: ITimeChart | null = null;
  private _width = 0;
  private _hoverX: number | null = null;
  private _legendKey = '';
  private _rule: Element | null = null;
  private _resize: ResizeObserver;
  private _svg = document.createElementNS(SVG, 'svg');
  private _title = h('span', { class: 'nblaunch-chart-title' });
  private _legend = h('span', { class: 'nblaunch-chart-legend' });
  private _readout = h('div', { class: 'nblaunch-chart-readout', role: 'status' });
}

function lastValue(points: [number, number | null][]): number | null {
  for (let i = points.length - 1; i >= 0; i--) {
    const v = points[i][1];
    if (v !== null && Number.isFinite(v)) {
      return v;
    }
  }
  return null;
}

function svg(name: string, attrs: Record<string, string | number>, text?: string): Element {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    el.textContent = text;
  }
  return el;
}
