import {
  logTabTitle,
  makeDashboardModel,
  runName,
  sparkPath,
  stopButton
} from '../src/dashboardModel';
import { IRunDetail } from '../src/types';

/** 2025-01-01 15:23:01 in the local time zone, as the server's `started` (wall seconds). */
const STARTED = new Date(2025, 0, 1, 15, 23, 1).getTime() / 1000;

function detail(extra: Partial<IRunDetail> = {}): IRunDetail {
  return {
    id: 'run-20250101-152301-ab12cd34',
    state: 'running',
    live: true,
    can_stop: true,
    started: STARTED,
    elapsed_s: 42,
    notebook: 'work/train.ipynb',
    notebook_path: '/srv/work/train.ipynb',
    cell: 7,
    flags: '-n 2 --timeout 60',
    kernel_id: 'abcdef0123',
    kernel_pid: 42,
    engine: 'local',
    world_size: 2,
    backend: 'gloo',
    start_method: 'fork',
    root_cause: null,
    log_dir: '/tmp/nblaunch-0/run-20250101-152301-ab12cd34',
    report: null,
    ranks: [
      {
        rank: 0,
        pid: 101,
        state: 'running',
        exit: null,
        log: 'rank0.log',
        cpu_percent: 97.4,
        rss_bytes: 300 << 20
      },
      {
        rank: 1,
        pid: 102,
        state: 'running',
        exit: null,
        log: 'rank1.log',
        cpu_percent: null,
        rss_bytes: 200 << 20
      }
    ],
    history: {
      t: [STARTED, STARTED + 1, STARTED + 2],
      ranks: {
        '0': {
          cpu_percent: [null, 50, 97.4],
          rss_bytes: [100 << 20, 200 << 20, 300 << 20],
          gpu_memory_bytes: [null, null, null],
          gpu_util_percent: [null, null, null]
        }
      }
    },
    ...extra
  };
}

describe('makeDashboardModel', () => {
  it('names the run by its notebook and start time, and its log tabs by run and rank', () => {
    const model = makeDashboardModel(detail());
    expect(model.name).toBe('train 15:23:01');
    expect(logTabTitle(detail(), 1)).toBe('train 15:23:01 · rank 1');
    expect(runName(detail({ notebook: null, kernel_id: null }))).toBe('run 15:23:01');
  });

  it('shows notebook, cell, start time, engine, flags and outcome', () => {
    const model = makeDashboardModel(
      detail({ state: 'failed', live: false, root_cause: 'rank 1 failed: ValueError' })
    );
    const facts = Object.fromEntries(model.facts.map(f => [f.label, f.value]));
    expect(facts.Notebook).toBe('work/train.ipynb');
    expect(facts.Cell).toBe('[7]');
    expect(facts.Started).toBe('2025-01-01 15:23:01');
    expect(facts.Engine).toBe('local · 2 ranks · gloo');
    expect(facts.Flags).toBe('-n 2 --timeout 60');
    expect(facts.Elapsed).toBe('00:42');
    expect(model.cell).toBe(7);
    expect(model.outcome).toBe('rank 1 failed: ValueError');
    expect(model.live).toBe(false);
  });

  it('charts CPU and memory per rank over the run, without GPU columns when no rank has a GPU', () => {
    const model = makeDashboardModel(detail());
    expect(model.gpu).toBe(false);
    expect(model.columns).toEqual(['CPU', 'Memory']);
    const [cpu, memory] = model.ranks[0].charts;
    expect(cpu.now).toBe('97%');
    expect(cpu.samples).toBe(2);
    expect(cpu.path.startsWith('M60.0,')).toBe(true); // the first sample had no CPU rate: the line starts at the second
    expect(memory.now).toBe('300 MiB');
    expect(memory.peak).toBe('300 MiB');
    expect(memory.low).toBe('100 MiB');
    expect(memory.path.split(/[ML]/).filter(Boolean)).toHaveLength(3);
    // a rank the server has no history for yet: its current figure, no line
    expect(model.ranks[1].charts[0].now).toBe('–');
    expect(model.ranks[1].charts[1].path).toBe('');
    expect(model.ranks[1].pid).toBe('102');
  });

  it('shows an ended rank by its last sampled figures', () => {
    const ranks = detail().ranks.map(r => ({
      ...r,
      state: 'stopped',
      cpu_percent: undefined,
      rss_bytes: undefined
    }));
    const model = makeDashboardModel(detail({ live: false, state: 'stopped', ranks }));
    expect(model.ranks[0].charts.map(c => c.now)).toEqual(['97% last', '300 MiB last']);
    expect(model.ranks[1].charts.map(c => c.now)).toEqual(['–', '–']);
  });

  it('adds device, GPU memory and GPU utilisation where a rank has a GPU', () => {
    const ranks = detail().ranks.map(r => ({
      ...r,
      gpu_index: r.rank,
      gpu_memory_bytes: 1 << 30,
      gpu_util_percent: 55
    }));
    const model = makeDashboardModel(detail({ ranks }));
    expect(model.columns).toEqual(['CPU', 'Memory', 'GPU memory', 'GPU util']);
    expect(model.ranks[1].device).toBe('1');
    expect(model.ranks[1].charts.map(c => c.now)).toEqual(['–', '200 MiB', '1.0 GiB', '55%']);
  });

  it("names each rank's node for a world past one machine, and no node column on one machine", () => {
    expect(makeDashboardModel(detail()).nodes).toBe(false);
    const ranks = [
      { ...detail().ranks[0], node: '127.0.0.1 (6f1c2a9b)', pid_start: 8812 },
      // a rank on another machine: no figures here (it reports its own; none came yet)
      {
        rank: 1,
        pid: 4242,
        state: 'idle',
        exit: null,
        log: 'rank1.log',
        node: '10.0.0.7 (93ad01fe)'
      }
    ];
    const model = makeDashboardModel(detail({ ranks, history: undefined }));
    expect(model.nodes).toBe(true);
    expect(model.ranks.map(r => r.node)).toEqual(['127.0.0.1 (6f1c2a9b)', '10.0.0.7 (93ad01fe)']);
    expect(model.ranks[0].nodeTitle).toContain("the kernel's machine");
    expect(model.ranks[1].nodeTitle).toContain('reports its own CPU and memory');
    expect(makeDashboardModel(detail()).ranks[0].nodeTitle).toBe('');
    expect(model.ranks[1].charts.map(c => c.now)).toEqual(['–', '–']);
  });

  it('keeps a run without history or a cell readable', () => {
    const model = makeDashboardModel(
      detail({
        history: undefined,
        cell: null,
        flags: null,
        report: { startup_s: 0.5, wall_s: 2, exit: [] }
      })
    );
    const facts = Object.fromEntries(model.facts.map(f => [f.label, f.value]));
    expect(facts.Cell).toBe('–');
    expect(facts.Flags).toBe('–');
    expect(facts.Timings).toBe('start-up 0.50 s, wall 2.00 s');
    expect(model.ranks[0].charts.every(c => c.path === '')).toBe(true);
  });
});

describe('sparkPath', () => {
  it('scales values into the box with 0 at the bottom and breaks the line at a gap', () => {
    expect(sparkPath([0, 1, 2, 3], [0, 50, null, 100], 100, 0, 30, 10)).toBe(
      'M0.0,10.0 L10.0,5.0 M30.0,0.0'
    );
  });

  it('places samples by time, not by index', () => {
    expect(sparkPath([0, 1, 4], [10, 10, 10], 10, 0, 40, 10)).toBe('M0.0,0.0 L10.0,0.0 L40.0,0.0');
  });

  it('spans bottom to top, so a small rise of a large value shows', () => {
    expect(sparkPath([0, 1], [200, 210], 210, 200, 10, 10)).toBe('M0.0,10.0 L10.0,0.0');
  });

  it('draws nothing with fewer than two samples', () => {
    expect(sparkPath([0], [5], 10)).toBe('');
  });
});

describe('stopButton', () => {
  it('asks once before Stop, saying it stops every rank and what becomes of the cell', () => {
    const run = stopButton({ state: 'running', world_size: 4 }).stopQuestion;
    expect(run.title).toBe('Stop this run?');
    expect(run.body).toContain('This stops all 4 ranks of the run');
    expect(run.body).toContain('raises LaunchStoppedError');
    expect(run.accept).toBe('Stop every rank');
    const cell = stopButton({ session: true, state: 'running', ranks: [{}, {}] }).stopQuestion;
    expect(cell.body).toContain('stops the cell on both ranks');
    expect(cell.body).toContain('The live session goes on');
    const session = stopButton({ session: true, state: 'idle', world_size: 1 }).stopQuestion;
    expect(session.title).toBe('End the live session?');
    expect(session.body).toContain('This stops its one rank of the session');
  });

  it("says what Stop does: the run; a live session's running cell; between cells, the session", () => {
    expect(stopButton({ state: 'running' }).stopLabel).toBe('Stop');
    const cell = stopButton({ session: true, state: 'running' });
    expect(cell.stopLabel).toBe('Stop cell');
    expect(cell.stopTitle).toContain('every rank comes back to idle with its state');
    const session = stopButton({ session: true, state: 'idle' });
    expect(session.stopLabel).toBe('End session');
    expect(session.stopTitle).toContain('state they hold is gone');
    expect(makeDashboardModel(detail({ session: true, state: 'idle' })).stopLabel).toBe(
      'End session'
    );
  });
});
