/**
 * What a run's dashboard tab shows, made in one place from the server's JSON (GET
 * /nblaunch/runs/{id}) by makeDashboardModel(): the run's facts, and per rank its pid, state and
 * one chart per figure (CPU, memory and, where a rank has a GPU, its memory and utilisation) over
 * the run. The view (dashboardView.ts) only draws this; no DOM here, so it is unit-tested alone.
 *
 * Example:
 *   const model = makeDashboardModel(await backend.detail(id));
 *   model.ranks[1].charts[0];   // { figure: 'cpu_percent', label: 'CPU', now: '97%', path: 'M0,3 L…', … }
 */

import {
  formatBytes,
  formatElapsed,
  hasGpuColumns,
  rankStateText,
  runMeta,
  runOrigin
} from './runsModel';
import { IRankInfo, IRunDetail, IRunSummary, RankFigure } from './types';

/** A chart's drawing box, in SVG user units (the view scales it to its cell). */
export const SPARK_WIDTH = 120;
export const SPARK_HEIGHT = 28;

/** One figure of one rank over the run. */
export interface IChartModel {
  figure: RankFigure;
  label: string;
  /** The value now as text ('97%', '277 MiB'); without one (an ended rank) the last sampled ('277 MiB last'), else '–'. */
  now: string;
  /** The highest and lowest values over the run, as text, for the chart's hover text. */
  peak: string;
  low: string;
  /** An SVG path in a SPARK_WIDTH × SPARK_HEIGHT box; '' with fewer than two samples. Gaps stay gaps. */
  path: string;
  /** How many samples the chart has. */
  samples: number;
}

export interface IRankModel {
  rank: number;
  pid: string;
  /** Where a rank of a world past one machine runs ('10.0.0.2 (6f1c2a9b)'), or '' on this machine. */
  node: string;
  /** Where its figures come from, said on its node ('' on one machine). */
  nodeTitle: string;
  state: string;
  /** The GPU the rank computes on ('0', 'cuda:1'), or '' without one. */
  device: string;
  charts: IChartModel[];
}

export interface IDashboardModel {
  id: string;
  /** A short name a user tells runs apart by: 'train 15:23:01' (its notebook and start time). */
  name: string;
  state: string;
  live: boolean;
  canStop: boolean;
  /** The Stop button's label and hover text: a live session's Stop stops its running cell, or ends it. */
  stopLabel: string;
  stopTitle: string;
  /** What Stop asks before it stops anything (it stops every rank). */
  stopQuestion: IStopQuestion;
  /** The notebook's path as the server's file browser names it, or null (a script, an unknown kernel). */
  notebook: string | null;
  cell: number | null;
  /** Label/value pairs in the order the header shows them. */
  facts: { label: string; value: string }[];
  /** Why it failed or was stopped, or ''. */
  outcome: string;
  /** Whether any rank has a GPU: only then are the GPU columns drawn. */
  gpu: boolean;
  /** Whether any rank says its node (a Ray world): only then is the node column drawn. */
  nodes: boolean;
  /** The charts' column titles, in the order every rank's charts come. */
  columns: string[];
  ranks: IRankModel[];
}

const FIGURES: {
  figure: RankFigure;
  label: string;
  gpu: boolean;
  format: (v: number) => string;
}[] = [
  { figure: 'cpu_percent', label: 'CPU', gpu: false, format: percent },
  { figure: 'rss_bytes', label: 'Memory', gpu: false, format: formatBytes },
  { figure: 'gpu_memory_bytes', label: 'GPU memory', gpu: true, format: formatBytes },
  { figure: 'gpu_util_percent', label: 'GPU util', gpu: true, format: percent }
];

/** The dashboard of one run, from the server's answer for it. */
export function makeDashboardModel(detail: IRunDetail): IDashboardModel {
  const gpu = hasGpuColumns(detail.ranks);
  const figures = FIGURES.filter(f => gpu || !f.gpu);
  const times = detail.history?.t ?? [];
  const ranks = detail.ranks.map(rank => {
    const series = detail.history?.ranks[String(rank.rank)];
    return {
      rank: rank.rank,
      pid: rank.pid ? String(rank.pid) : '–',
      node: rank.node ?? '',
      nodeTitle: nodeTitle(rank),
      state: rankStateText(rank),
      device: deviceOf(rank),
      charts: figures.map(f => chartOf(f, rank, times, series?.[f.figure] ?? []))
    };
  });
  const facts = [
    { label: 'Notebook', value: runOrigin(detail) },
    { label: 'Cell', value: detail.cell ? `[${detail.cell}]` : '–' },
    { label: 'Started', value: startedText(detail.started) },
    { label: 'Elapsed', value: formatElapsed(detail.elapsed_s) },
    { label: 'Engine', value: runMeta(detail) || '–' },
    { label: 'Start method', value: detail.start_method ?? '–' },
    { label: 'Flags', value: detail.flags ? detail.flags : detail.cell ? '(none)' : '–' }
  ];
  if (detail.report) {
    const { startup_s, wall_s } = detail.report;
    facts.push({
      label: 'Timings',
      value: `start-up ${startup_s?.toFixed(2) ?? '–'} s, wall ${wall_s?.toFixed(2) ?? '–'} s`
    });
  }
  facts.push({ label: 'Logs', value: detail.log_dir });
  return {
    id: detail.id,
    name: runName(detail),
    state: detail.state,
    live: detail.live,
    canStop: detail.can_stop,
    ...stopButton(detail),
    notebook: detail.notebook,
    cell: detail.cell ?? null,
    facts,
    outcome: detail.root_cause || detail.note || '',
    gpu,
    nodes: detail.ranks.some(rank => Boolean(rank.node)),
    columns: figures.map(f => f.label),
    ranks
  };
}

/** 'train 15:23:01': the notebook's name and the start time, as the cell's status line names the run. */
export function runName(run: IRunSummary): string {
  const path = run.notebook ?? '';
  const stem =
    path
      .split('/')
      .pop()
      ?.replace(/\.ipynb$/, '') || 'run';
  return run.started ? `${stem} ${clock(run.started)}` : run.id;
}

/** '15:23:01': when the run started, local time ('–' when unknown). */
export function startClock(run: IRunSummary): string {
  return run.started ? clock(run.started) : '–';
}

/** The title of a rank's log tab: 'train 15:23:01 · rank 1'. */
export function logTabTitle(run: IRunSummary, rank: number): string {
  return `${runName(run)} · rank ${rank}`;
}

/**
 * An SVG path through values over times, scaled into width × height with `bottom` at the bottom
 * and `top` at the top; a null value breaks the line (the figure was not known then).
 */
export function sparkPath(
  times: number[],
  values: (number | null)[],
  top: number,
  bottom = 0,
  width = SPARK_WIDTH,
  height = SPARK_HEIGHT
): string {
  const count = Math.min(times.length, values.length);
  if (count < 2 || top <= bottom) {
    return '';
  }
  const t0 = times[0];
  const span = times[count - 1] - t0 || 1;
  let path = '';
  let pen = false;
  for (let i = 0; i < count; i++) {
    const value = values[i];
    if (value === null || value === undefined || !Number.isFinite(value)) {
      pen = false;
      continue;
    }
    const x = ((times[i] - t0) / span) * width;
    const y =
      height - ((Math.min(Math.max(value, bottom), top) - bottom) / (top - bottom)) * height;
    path += `${pen ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)} `;
    pen = true;
  }
  return path.trim();
}

function chartOf(
  f: (typeof FIGURES)[number],
  rank: IRankInfo,
  times: number[],
  values: (number | null)[]
): IChartModel {
  const known = values.filter((v): v is number => v !== null && Number.isFinite(v));
  const current = rank[f.figure];
  const peak = known.length ? Math.max(...known) : null;
  const low = known.length ? Math.min(...known) : 0;
  // Percentages keep a 0–100 scale (a busy rank reads as a full chart). Bytes span their own range
  // (memory that creeps up 2 % is what a leak looks like), with a margin; a flat line sits mid-height.
  let [bottom, top] = [0, Math.max(100, peak ?? 0)];
  if (!f.figure.endsWith('_percent')) {
    const margin = ((peak ?? 0) - low) * 0.1 || Math.max(low * 0.05, 1);
    [bottom, top] = [Math.max(0, low - margin), (peak ?? 0) + margin];
  }
  return {
    figure: f.figure,
    label: f.label,
    now: current !== undefined && current !== null ? f.format(current) : lastText(f.format, values),
    peak: peak === null ? '–' : f.format(peak),
    low: known.length ? f.format(low) : '–',
    path: sparkPath(times, values, top, bottom),
    samples: known.length
  };
}

function lastText(format: (v: number) => string, values: (number | null)[]): string {
  for (let i = values.length - 1; i >= 0; i--) {
    const value = values[i];
    if (value !== null && Number.isFinite(value)) {
      return `${format(value)} last`;
    }
  }
  return '–';
}

function deviceOf(rank: IRankInfo): string {
  if (rank.gpu_index !== undefined) {
    return String(rank.gpu_index);
  }
  return rank.gpu ?? '';
}

function percent(value: number): string {
  return `${Math.round(value)}%`;
}

function clock(seconds: number): string {
  const d = new Date(seconds * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()]
    .map(n => String(n).padStart(2, '0'))
    .join(':');
}

function startedText(seconds: number | null): string {
  if (!seconds) {
    return '–';
  }
  const d = new Date(seconds * 1000);
  const day = [d.getFullYear(), d.getMonth() + 1, d.getDate()]
    .map(n => String(n).padStart(2, '0'))
    .join('-');
  return `${day} ${clock(seconds)}`;
}

/** What Stop does, asked once before it is sent: a title, what it will do, and the button that does it. */
export interface IStopQuestion {
  title: string;
  body: string;
  accept: string;
}

/** What Stop does to this run, in the words of its button and of the question it asks first: a live
 * session's Stop stops the running cell (every rank keeps its state) and, between cells, ends the session. */
export function stopButton(detail: {
  session?: boolean;
  state: string;
  world_size?: number | null;
  ranks?: unknown[];
}): {
  stopLabel: string;
  stopTitle: string;
  stopQuestion: IStopQuestion;
} {
  const n = detail.world_size ?? detail.ranks?.length ?? 0;
  const every =
    n > 2 ? `all ${n} ranks` : n === 2 ? 'both ranks' : n === 1 ? 'its one rank' : 'every rank';
  if (!detail.session) {
    return {
      stopLabel: 'Stop',
      stopTitle: 'Stop this run: every rank is stopped, and the cell that runs it raises an error',
      stopQuestion: {
        title: 'Stop this run?',
        body:
          `This stops ${every} of the run (SIGTERM now, SIGKILL a second later). ` +
          'What they have not saved is lost, and the cell that runs it raises LaunchStoppedError.',
        accept: 'Stop every rank'
      }
    };
  }
  if (detail.state === 'running') {
    return {
      stopLabel: 'Stop cell',
      stopTitle:
        'Stop the running cell, as ■ does: every rank comes back to idle with its state, and the cell raises an error',
      stopQuestion: {
        title: 'Stop the running cell?',
        body:
          `This stops the cell on ${every}, as ■ does: each comes back to idle with the state it holds, ` +
          'and the cell raises an error. The live session goes on.',
        accept: 'Stop the cell'
      }
    };
  }
  return {
    stopLabel: 'End session',
    stopTitle: 'End this live session: every rank is stopped and the state they hold is gone',
    stopQuestion: {
      title: 'End the live session?',
      body:
        `This stops ${every} of the session: the state they hold (models, variables) is gone. ` +
        'The next %%distributed cell runs one-shot.',
      accept: 'End the session'
    }
  };
}

/** A Ray rank's node, said in its title: on the kernel's machine (read from /proc) or elsewhere (its own reports). */
function nodeTitle(rank: IRankInfo): string {
  if (!rank.node) {
    return '';
  }
  return rank.pid_start === null || rank.pid_start === undefined
    ? `${rank.node}: another machine than the kernel's; this rank reports its own CPU and memory about once a second`
    : `${rank.node}: the kernel's machine; its CPU and memory are read from this machine's /proc`;
}
