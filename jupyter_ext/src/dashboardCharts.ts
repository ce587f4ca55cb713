/**
 * The dashboard's charts, made from one run's detail (the server's samples of each rank's CPU, memory
 * and GPU) and curves (series.jsonl: metrics and progress counts): one chart per figure with a line
 * per rank, each rank's steps per second with the slowest rank named when ranks differ by more than
 * STRAGGLER_MARGIN, and one chart per training metric (the cell's curves, from the same points).
 *
 * Example:
 *   const charts = makeDashboardCharts(detail);
 *   charts.straggler?.text;   // 'rank 2 is the slowest: 8.2 steps/s, 61% below the median of 21 steps/s'
 */

import { ChartUnit, ILineInput, ITimeChart, makeTimeChart, Point } from './timeChart';
import { IRunCurves, IRunDetail, RankFigure } from './types';

/** Ranks whose steps per second are within this share of the median are not told apart. */
export const STRAGGLER_MARGIN = 0.1;
/** Steps per second are measured over the last this many seconds of each rank's counts. */
export const PACE_WINDOW_S = 10;

export interface IRankPace {
  rank: number;
  /** Steps per second over the last PACE_WINDOW_S, or null (fewer than two counts). */
  rate: number | null;
  steps: number;
  /** The bar counted (its description), '' when it has none. */
  desc: string;
}

export interface IStraggler {
  rank: number;
  /** How much slower than the median of the ranks, as a share (0.61: 61 % below). */
  slowerBy: number;
  text: string;
}

export interface IDashboardCharts {
  resources: ITimeChart[];
  pace: IRankPace[];
  paceChart: ITimeChart | null;
  straggler: IStraggler | null;
  /** What the pace section says when there is no straggler ('ranks within 10 % …', 'no progress bars yet'). */
  paceText: string;
  metrics: ITimeChart[];
}

const FIGURES: { figure: RankFigure; title: string; unit: ChartUnit; gpu: boolean }[] = [
  { figure: 'cpu_percent', title: 'CPU per rank', unit: 'percent', gpu: false },
  { figure: 'rss_bytes', title: 'Memory per rank (resident)', unit: 'bytes', gpu: false },
  { figure: 'gpu_util_percent', title: 'GPU utilisation per rank', unit: 'percent', gpu: true },
  { figure: 'gpu_memory_bytes', title: 'GPU memory per rank', unit: 'bytes', gpu: true }
];
const NOT_METRICS = new Set(['step', 'rank', 'wall', 'from_rank', 'epoch']);

export function makeDashboardCharts(
  detail: IRunDetail & { curves?: IRunCurves }
): IDashboardCharts {
  const start = detail.started ?? detail.history?.t[0] ?? 0;
  const times = detail.history?.t ?? [];
  const ranks = Object.keys(detail.history?.ranks ?? {}).sort((a, b) => Number(a) - Number(b));
  const gpu = ranks.some(r =>
    (detail.history?.ranks[r].gpu_memory_bytes ?? []).some(v => v !== null)
  );
  const resources = FIGURES.filter(f => gpu || !f.gpu).map(f =>
    makeTimeChart(
      f.title,
      f.unit,
      ranks.map(r => ({
        label: `rank ${r}`,
        points: times.map((t, i): Point => [
          t - start,
          detail.history?.ranks[r][f.figure][i] ?? null
        ])
      })),
      'time'
    )
  );
  const counts = rankCounts(detail.curves);
  const pace = counts.map(c => ({
    rank: c.rank,
    rate: rateOf(c.points),
    steps: c.points.length ? (c.points[c.points.length - 1][1] ?? 0) : 0,
    desc: c.desc
  }));
  const straggler = findStraggler(pace);
  const paceChart = counts.length
    ? makeTimeChart(
        'Steps per second per rank',
        'per_second',
        counts.map(c => ({ label: `rank ${c.rank}`, points: rateSeries(c.points, start) })),
        'time'
      )
    : null;
  return {
    resources,
    pace,
    paceChart,
    straggler,
    paceText: paceText(pace, straggler),
    metrics: metricCharts(detail.curves)
  };
}

/** The slowest rank, if it is more than STRAGGLER_MARGIN below the median of every rank's rate. */
export function findStraggler(pace: IRankPace[]): IStraggler | null {
  const known = pace.filter((p): p is IRankPace & { rate: number } => p.rate !== null);
  if (known.length < 2) {
    return null;
  }
  const rates = known.map(p => p.rate).sort((a, b) => a - b);
  const mid = rates.length / 2;
  const median = rates.length % 2 ? rates[Math.floor(mid)] : (rates[mid - 1] + rates[mid]) / 2;
  const slowest = known.reduce((a, b) => (b.rate < a.rate ? b : a));
  if (median <= 0 || slowest.rate >= median * (1 - STRAGGLER_MARGIN)) {
    return null;
  }
  const slowerBy = 1 - slowest.rate / median;
  return {
    rank: slowest.rank,
    slowerBy,
    text:
      `rank ${slowest.rank} is the slowest: ${rateText(slowest.rate)}, ` +
      `${Math.round(slowerBy * 100)}% below the median of ${rateText(median)}`
  };
}

function paceText(pace: IRankPace[], straggler: IStraggler | null): string {
  if (straggler) {
    return straggler.text;
  }
  const known = pace.filter(p => p.rate !== null);
  if (!pace.length) {
    return "No progress bars yet: each rank's steps per second come from its progress() or tqdm bars.";
  }
  if (known.length < 2) {
    return 'Steps per second need two counts from at least two ranks.';
  }
  return `Every rank within ${Math.round(STRAGGLER_MARGIN * 100)}% of the median pace.`;
}

function rateText(rate: number): string {
  return `${Number(rate.toPrecision(rate >= 10 ? 3 : 2))} steps/s`;
}

/**
 * Each rank's step count over time: the bar description most counted across ranks (a training loop's
 * inner bar), its bars one after another (an epoch's bar closes and the next starts at 0: counts add up).
 */
function rankCounts(curves?: IRunCurves): { rank: number; desc: string; points: Point[] }[] {
  if (!curves?.bars.length) {
    return [];
  }
  const weight = new Map<string, number>();
  for (const bar of curves.bars) {
    weight.set(bar.desc, (weight.get(bar.desc) ?? 0) + bar.pace.length);
  }
  const desc = [...weight.entries()].reduce((a, b) => (b[1] > a[1] ? b : a))[0];
  const byRank = new Map<number, Point[]>();
  for (const bar of curves.bars.filter(b => b.desc === desc)) {
    const points = byRank.get(bar.rank) ?? [];
    const before = points.length ? (points[points.length - 1][1] ?? 0) : 0;
    points.push(...bar.pace.map(([t, n]): Point => [t, before + n]));
    byRank.set(bar.rank, points);
  }
  return [...byRank.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([rank, points]) => ({ rank, desc, points: points.sort((a, b) => a[0] - b[0]) }));
}

function rateOf(points: Point[]): number | null {
  if (points.length < 2) {
    return null;
  }
  const [tEnd, nEnd] = points[points.length - 1];
  const first = points.find(p => p[0] >= tEnd - PACE_WINDOW_S) ?? points[0];
  const dt = tEnd - first[0];
  return dt > 0 ? ((nEnd ?? 0) - (first[1] ?? 0)) / dt : null;
}

/** Steps per second at each count, over the 2 s before it. */
function rateSeries(points: Point[], start: number): Point[] {
  const out: Point[] = [];
  let j = 0;
  for (let i = 1; i < points.length; i++) {
    while (j < i - 1 && points[i][0] - points[j + 1][0] >= 2) {
      j++;
    }
    const dt = points[i][0] - points[j][0];
    if (dt > 0) {
      out.push([points[i][0] - start, ((points[i][1] ?? 0) - (points[j][1] ?? 0)) / dt]);
    }
  }
  return out;
}

/** One chart per metric name, a line per rank (as the cell draws them), over steps. */
function metricCharts(curves?: IRunCurves): ITimeChart[] {
  const byName = new Map<string, Map<string, Point[]>>();
  (curves?.metrics ?? []).forEach((point, i) => {
    const x = typeof point.step === 'number' ? point.step : i;
    const line = typeof point.rank === 'number' ? `rank ${point.rank}` : '';
    for (const [name, value] of Object.entries(point)) {
      if (NOT_METRICS.has(name) || (typeof value !== 'number' && value !== null)) {
        continue;
      }
      const lines = byName.get(name) ?? new Map<string, Point[]>();
      byName.set(name, lines);
      const points = lines.get(line) ?? [];
      lines.set(line, points);
      points.push([x, value as number | null]);
    }
  });
  return [...byName.entries()]
    .filter(([, lines]) => [...lines.values()].some(points => points.length > 1))
    .map(([name, lines]) =>
      makeTimeChart(
        name,
        'number',
        [...lines.entries()].map(([label, points]): ILineInput => ({
          label: label || name,
          points
        })),
        'step'
      )
    );
}
