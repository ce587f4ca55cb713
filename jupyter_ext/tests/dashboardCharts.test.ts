import {
  findStraggler,
  IRankPace,
  makeDashboardCharts,
  STRAGGLER_MARGIN
} from '../src/dashboardCharts';
import { formatClock, makeTimeChart, niceTicks, timeTicks, valueAt } from '../src/timeChart';
import { IRunCurves, IRunDetail } from '../src/types';

const STARTED = 1_700_000_000;

function pace(rates: (number | null)[]): IRankPace[] {
  return rates.map((rate, rank) => ({ rank, rate, steps: 0, desc: 'train' }));
}

/** A bar counting `rate` steps a second for `seconds`, two counts a second, as series.jsonl holds it. */
function bar(rank: number, rate: number, seconds: number, desc = 'train', start = 0) {
  const counts: [number, number][] = [];
  for (let t = 0; t <= seconds; t += 0.5) {
    counts.push([STARTED + start + t, Math.floor(rate * t)]);
  }
  return { rank, bar: `${rank}-${desc}-${start}`, desc, total: null, unit: 'it', pace: counts };
}

function detail(curves: IRunCurves, gpu = false): IRunDetail & { curves: IRunCurves } {
  const t = [STARTED, STARTED + 1, STARTED + 2];
  const figures = (cpu: number) => ({
    cpu_percent: [null, cpu, cpu],
    rss_bytes: [300 << 20, 310 << 20, 320 << 20],
    gpu_memory_bytes: gpu ? [2 ** 30, 2 * 2 ** 30, 2 * 2 ** 30] : [null, null, null],
    gpu_util_percent: gpu ? [10, 90, 95] : [null, null, null]
  });
  return {
    id: 'run-20231114-221320-ab12cd34',
    state: 'running',
    live: true,
    can_stop: true,
    started: STARTED,
    elapsed_s: 2,
    notebook: 'train.ipynb',
    notebook_path: '/srv/train.ipynb',
    cell: 2,
    flags: '-n 2',
    kernel_id: 'k',
    kernel_pid: 1,
    engine: 'local',
    world_size: 2,
    backend: 'gloo',
    start_method: 'fork',
    root_cause: null,
    log_dir: '/tmp/x',
    report: null,
    ranks: [],
    history: { t, ranks: { '0': figures(97), '1': figures(4) } },
    curves
  } as IRunDetail & { curves: IRunCurves };
}

describe('the straggler rule', () => {
  it('names the slowest rank and by how much it is below the median', () => {
    const straggler = findStraggler(pace([10, 10.2, 4, 9.9]));
    expect(straggler?.rank).toBe(2);
    expect(straggler?.slowerBy).toBeCloseTo(1 - 4 / 9.95, 3);
    expect(straggler?.text).toBe(
      'rank 2 is the slowest: 4 steps/s, 60% below the median of 9.9 steps/s'
    );
  });

  it('names nobody when every rank is within the margin, or fewer than two ranks have a pace', () => {
    const within = 10 * (1 - STRAGGLER_MARGIN) + 0.01;
    expect(findStraggler(pace([10, 10, within]))).toBeNull();
    expect(findStraggler(pace([10, null, null]))).toBeNull();
    expect(findStraggler(pace([0, 0]))).toBeNull();
  });
});

describe('the dashboard charts', () => {
  it('measures each rank over its own bars, counts across epochs, and names the slow rank', () => {
    const curves: IRunCurves = {
      metrics: [],
      bars: [
        bar(0, 20, 10),
        bar(1, 20, 10),
        bar(2, 8, 10),
        bar(0, 20, 10, 'epoch'),
        bar(0, 20, 10, 'train', 10)
      ],
      full: false
    };
    const charts = makeDashboardCharts(detail(curves));
    expect(charts.pace.map(p => p.rank)).toEqual([0, 1, 2]);
    expect(charts.pace[0].steps).toBe(400); // two 'train' bars one after the other: 200 + 200
    expect(charts.straggler?.rank).toBe(2);
    expect(charts.paceText).toBe(
      'rank 2 is the slowest: 8 steps/s, 60% below the median of 20 steps/s'
    );
    expect(charts.paceChart?.lines.map(l => l.label)).toEqual(['rank 0', 'rank 1', 'rank 2']);
  });

  it('draws CPU and memory per rank on a time axis from the run start, GPU charts only with a GPU', () => {
    const empty: IRunCurves = { metrics: [], bars: [], full: false };
    const cpuOnly = makeDashboardCharts(detail(empty));
    expect(cpuOnly.resources.map(c => c.title)).toEqual([
      'CPU per rank',
      'Memory per rank (resident)'
    ]);
    expect(cpuOnly.paceChart).toBeNull();
    expect(cpuOnly.paceText).toMatch(/^No progress bars yet/);
    const [cpu, memory] = cpuOnly.resources;
    expect(cpu.lines[1].points).toEqual([
      [0, null],
      [1, 4],
      [2, 4]
    ]); // a rank at 4 % is a line, not empty
    expect(cpu.y.ticks.map(t => t.label)).toEqual(['0%', '20%', '40%', '60%', '80%', '100%']);
    expect(memory.y.ticks.map(t => t.label)).toEqual([
      '0 MiB',
      '100 MiB',
      '200 MiB',
      '300 MiB',
      '400 MiB'
    ]);
    expect(cpu.x.ticks[0].label).toBe('0:00');
    const gpu = makeDashboardCharts(detail(empty, true));
    expect(gpu.resources.map(c => c.title)).toContain('GPU memory per rank');
    expect(
      gpu.resources.find(c => c.unit === 'bytes' && c.title.startsWith('GPU'))?.y.ticks.slice(-1)[0]
        ?.label
    ).toBe('2 GiB');
  });

  it('charts each metric over steps, a line per rank when the points carry one', () => {
    const metrics: IRunCurves['metrics'] = [0, 1, 2].flatMap((step): IRunCurves['metrics'] => [
      { step, loss: 2 - step * 0.5, rank: 0, wall: STARTED + step, from_rank: 0 },
      { step, loss: 2.1 - step * 0.5, rank: 1, wall: STARTED + step, from_rank: 1 },
      { step, lr: 0.001, wall: STARTED + step, from_rank: 0 }
    ]);
    const charts = makeDashboardCharts(detail({ metrics, bars: [], full: false }));
    expect(charts.metrics.map(c => c.title)).toEqual(['loss', 'lr']);
    expect(charts.metrics[0].lines.map(l => l.label)).toEqual(['rank 0', 'rank 1']);
    expect(charts.metrics[0].axis).toBe('step');
    expect(charts.metrics[1].lines[0].label).toBe('lr');
  });
});

describe('axes', () => {
  it('puts round ticks across the range', () => {
    expect(niceTicks(0, 100, 5)).toEqual([0, 20, 40, 60, 80, 100]);
    expect(niceTicks(0, 0.37, 5)).toEqual([0, 0.1, 0.2, 0.3, 0.4]);
    expect(niceTicks(5, 5, 5)).toEqual([5]);
  });

  it('labels time as elapsed clock time at round intervals', () => {
    expect(timeTicks(0, 20).map(t => t.label)).toEqual(['0:00', '0:05', '0:10', '0:15', '0:20']);
    expect(timeTicks(100, 400).map(t => t.label)).toEqual(['2:00', '3:00', '4:00', '5:00', '6:00']);
    expect(timeTicks(42, 50).map(t => t.label)).toEqual(['0:42', '0:44', '0:46', '0:48', '0:50']);
    expect(formatClock(3723)).toBe('1:02:03');
  });

  it('ends the time axis at the newest sample, however young the run', () => {
    // a run 5 s old whose first sample came 2 s in: the axis is 0:02-0:05, not a 10 s span squashing the lines left
    const young = makeTimeChart(
      'CPU',
      'percent',
      [
        {
          label: 'rank 0',
          points: [
            [2, 50],
            [3, 60],
            [5, 40]
          ]
        }
      ],
      'time'
    );
    expect(young.x.min).toBe(2);
    expect(young.x.max).toBe(5);
    expect(young.x.ticks.map(t => t.label).slice(-1)[0]).toBe('0:05');
    expect(young.x.ticks.every(t => t.at <= 5)).toBe(true);
    const one = makeTimeChart('CPU', 'percent', [{ label: 'rank 0', points: [[3, 50]] }], 'time');
    expect(one.x.max).toBeGreaterThan(one.x.min); // a single sample is still drawn
  });

  it('reads every line at the hovered sample and keeps gaps as gaps', () => {
    const chart = makeTimeChart(
      'CPU',
      'percent',
      [
        {
          label: 'rank 0',
          points: [
            [0, 5],
            [1, null],
            [2, 97]
          ]
        }
      ],
      'time'
    );
    expect(valueAt(chart.lines[0], 1.9)).toBe(97);
    expect(valueAt(chart.lines[0], 1.1)).toBeNull();
    expect(chart.format(96.6)).toBe('97%');
    const quiet = makeTimeChart(
      'CPU',
      'percent',
      [
        {
          label: 'rank 0',
          points: [
            [0, 3],
            [1, 6]
          ]
        }
      ],
      'time'
    );
    expect(quiet.y.ticks.map(t => t.label)).toEqual(['0%', '2%', '4%', '6%', '8%', '10%']); // not a flat line
    const tops = [12, 30, 70, 100, 180].map(
      peak =>
        makeTimeChart(
          'CPU',
          'percent',
          [
            {
              label: 'rank 0',
              points: [
                [0, 1],
                [1, peak]
              ]
            }
          ],
          'time'
        ).y.max
    );
    expect(tops).toEqual([25, 50, 100, 100, 200]); // steps up gradually; over one core, past 100 %
  });
});
