/**
 * The model of one chart with real axes, for the Runs dashboard: lines over a shared x axis (seconds
 * since the run started, or training steps), a value axis in the figure's unit with round ticks, and
 * the readout at any x (every line's value there). No DOM here: timeChartView.ts draws it, jest tests it.
 *
 * Example:
 *   const chart = makeTimeChart('CPU', 'percent', [{ label: 'rank 0', points: [[0, 5], [10, 97]] }], 'time');
 *   chart.y.ticks.map(t => t.label);  // ['0%', '20%', '40%', '60%', '80%', '100%']
 *   chart.x.ticks.map(t => t.label);  // ['0:00', '0:02', …, '0:10']
 */

/** How a chart's values read: percentages (0–100 at least), bytes (KiB, MiB, GiB), a rate, or plain numbers. */
export type ChartUnit = 'percent' | 'bytes' | 'per_second' | 'number';
/** What the x axis counts: seconds since the run's start ('0:30'), or steps. */
export type ChartAxis = 'time' | 'step';

export type Point = [number, number | null];

export interface ILineInput {
  label: string;
  points: Point[];
}

export interface ITick {
  at: number;
  label: string;
}

export interface ILine extends ILineInput {
  color: string;
}

export interface ITimeChart {
  title: string;
  unit: ChartUnit;
  axis: ChartAxis;
  x: { min: number; max: number; ticks: ITick[]; label: string };
  y: { min: number; max: number; ticks: ITick[] };
  lines: ILine[];
  /** The value of a y tick or readout in this chart's unit ('97%', '1.5 GiB'). */
  format: (value: number) => string;
}

export const LINE_COLORS = [
  '#4c78a8',
  '#f58518',
  '#54a24b',
  '#e45756',
  '#b279a2',
  '#72b7b2',
  '#9d755d',
  '#d67195'
];

const TICKS = 5;
/** The CPU axis' tops, in percent: the chart takes the first one over its busiest sample. */
const PERCENT_TOPS = [10, 25, 50, 100];
const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** A chart of `lines` (points [x, y or null]) with axes that fit every point. */
export function makeTimeChart(
  title: string,
  unit: ChartUnit,
  lines: ILineInput[],
  axis: ChartAxis
): ITimeChart {
  const xs = lines.flatMap(l => l.points.map(p => p[0]));
  const ys = lines.flatMap(l => l.points.map(p => p[1])).filter(isNumber);
  const xMin = xs.length ? Math.min(...xs) : 0;
  // The axis ends at the newest sample (a run 0:05 old reads 0:00-0:05, its lines across the whole
  // plot); only a single sample gets a span of its own, so that it is drawn at all.
  const xNewest = xs.length ? Math.max(...xs) : xMin;
  const xMax = xNewest > xMin ? xNewest : xMin + 1;
  const yHigh = ys.length ? Math.max(...ys) : 0;
  const yLow = ys.length ? Math.min(...ys) : 0;
  const format = formatterOf(unit);
  let y: { min: number; max: number; ticks: ITick[] };
  if (unit === 'percent') {
    // The first of 10, 25, 50 and 100 % that holds the busiest sample, so a quiet run's lines are not flat and
    // the axis steps up gradually rather than jumping from 10 % to 100 % when one rank passes 10 %; a rank
    // using more than one core (over 100 %) gets nice ticks above it.
    const top = PERCENT_TOPS.find(t => yHigh <= t) ?? yHigh;
    y = valueAxis(0, top, 1, format);
  } else if (unit === 'bytes') {
    const u = byteUnitOf(yHigh);
    const step = 1024 ** u; // every tick in one unit: 0 MiB, 100 MiB, … (not 0 B)
    y = valueAxis(
      0,
      Math.max(yHigh, 1),
      step,
      v => `${Number((v / step).toPrecision(4))} ${BYTE_UNITS[u]}`
    );
  } else {
    y = valueAxis(Math.min(0, yLow), Math.max(yHigh, yLow + 1e-9, 1e-9), 1, format);
  }
  const xTicks =
    axis === 'time' ? timeTicks(xMin, xMax) : niceTicks(xMin, xMax, TICKS).map(at => stepTick(at));
  return {
    title,
    unit,
    axis,
    x: {
      min: xMin,
      max: xMax,
      ticks: xTicks,
      label: axis === 'time' ? 'time since start' : 'step'
    },
    y,
    lines: lines.map((line, i) => ({ ...line, color: LINE_COLORS[i % LINE_COLORS.length] })),
    format
  };
}

/** Round numbers from lo to at least hi, about `count` of them (1, 2, 2.5 or 5 times a power of ten). */
export function niceTicks(lo: number, hi: number, count: number): number[] {
  if (!(hi > lo)) {
    return [lo];
  }
  const raw = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map(m => m * power).find(s => s >= raw) ?? 10 * power;
  const first = Math.floor(lo / step + 1e-9) * step;
  const ticks: number[] = [];
  for (let v = first; v < hi + step - 1e-9 * step; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

/** Ticks of elapsed time at round intervals (1, 2, 5, 10, 15, 30 s; 1, 2, 5, 10, 15, 30 min; hours). */
export function timeTicks(start: number, end: number): ITick[] {
  const span = Math.max(end - start, 1);
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400];
  const step = steps.find(s => span / s <= TICKS + 1) ?? 14400;
  const ticks: ITick[] = [];
  // at round times since the start (x is seconds since the run began): 0:40, 0:45, … not offsets from the first sample
  for (let at = Math.ceil(start / step - 1e-9) * step; at <= end + 1e-9; at += step) {
    ticks.push({ at, label: formatClock(at) });
  }
  return ticks;
}

/** '0:05', '1:30', '1:02:03': seconds as a clock reads elapsed time. */
export function formatClock(seconds: number): string {
  const s = Math.round(seconds);
  const [h, m, r] = [Math.floor(s / 3600), Math.floor((s % 3600) / 60), s % 60];
  const mm = h ? String(m).padStart(2, '0') : String(m);
  return `${h ? `${h}:` : ''}${mm}:${String(r).padStart(2, '0')}`;
}

/** The value of `line` at x (the nearest point's, within half the gap to its neighbours), or null. */
export function valueAt(line: ILineInput, x: number): number | null {
  let best: Point | null = null;
  for (const p of line.points) {
    if (best === null || Math.abs(p[0] - x) < Math.abs(best[0] - x)) {
      best = p;
    }
  }
  return best ? best[1] : null;
}

/** The x of the point nearest `x` over every line (the readout snaps to a sample). */
export function nearestX(chart: ITimeChart, x: number): number | null {
  let best: number | null = null;
  for (const line of chart.lines) {
    for (const [px] of line.points) {
      if (best === null || Math.abs(px - x) < Math.abs(best - x)) {
        best = px;
      }
    }
  }
  return best;
}

function valueAxis(
  lo: number,
  hi: number,
  scale: number,
  format: (v: number) => string
): { min: number; max: number; ticks: ITick[] } {
  const ticks = niceTicks(lo / scale, hi / scale, TICKS).map(v => v * scale);
  return {
    min: Math.min(ticks[0], lo),
    max: Math.max(ticks[ticks.length - 1], hi),
    ticks: ticks.map(at => ({ at, label: format(at) }))
  };
}

function byteUnitOf(value: number): number {
  let unit = 0;
  while (unit < BYTE_UNITS.length - 1 && value >= 1024 ** (unit + 1)) {
    unit++;
  }
  return unit;
}

function formatterOf(unit: ChartUnit): (v: number) => string {
  switch (unit) {
    case 'percent':
      return v => `${Math.round(v)}%`;
    case 'bytes':
      return v => {
        const u = byteUnitOf(Math.abs(v));
        const n = v / 1024 ** u;
        return `${Number.isInteger(n) ? n : n.toFixed(n >= 10 ? 0 : 1)} ${BYTE_UNITS[u]}`;
      };
    case 'per_second':
      return v => `${shortNumber(v)}/s`;
    default:
      return shortNumber;
  }
}

function shortNumber(v: number): string {
  if (v === 0) {
    return '0';
  }
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-3) {
    return v.toExponential(1);
  }
  return String(Number(v.toPrecision(3)));
}

function stepTick(at: number): ITick {
  return { at, label: shortNumber(at) };
}

function isNumber(v: number | null): v is number {
  return v !== null && Number.isFinite(v);
}
