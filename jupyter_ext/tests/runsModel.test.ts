import { LogFollower } from '../src/logFollower';
import {
  CELL_GRACE_MS,
  formatBytes,
  formatElapsed,
  hasGpuColumns,
  IRunsBackend,
  rankStateText,
  runMeta,
  runOrigin,
  RunsModel,
  RunsPoller,
  stacksText
} from '../src/runsModel';
import { ILogChunk, IRunDetail, IRunSummary, IStacksResponse } from '../src/types';

function summary(id: string, extra: Partial<IRunSummary> = {}): IRunSummary {
  return {
    id,
    state: 'running',
    live: true,
    can_stop: true,
    started: 1,
    elapsed_s: 3,
    notebook: 'demo.ipynb',
    notebook_path: '/srv/demo.ipynb',
    kernel_id: 'abcdef0123',
    kernel_pid: 42,
    engine: 'local',
    world_size: 2,
    backend: 'gloo',
    start_method: 'fork',
    root_cause: null,
    ...extra
  };
}

/** The server's side of the API, in memory: what the model asks it is recorded. */
class InMemoryServer implements IRunsBackend {
  runs: IRunSummary[] = [];
  calls: string[] = [];
  stopAnswer: Error | null = null;
  stacksAnswer: IStacksResponse | Error = { id: '', ranks: [] };

  async list(): Promise<IRunSummary[]> {
    this.calls.push('list');
    return this.runs.map(r => ({ ...r }));
  }

  async detail(id: string): Promise<IRunDetail> {
    this.calls.push(`detail ${id}`);
    const run = this.runs.find(r => r.id === id);
    if (!run) {
      throw new Error(`no run ${id}`);
    }
    return {
      ...run,
      log_dir: `/tmp/nblaunch-0/${id}`,
      report: null,
      ranks: [0, 1].map(rank => ({
        rank,
        pid: 100 + rank,
        state: 'running',
        exit: null,
        log: `rank${rank}.log`,
        rss_bytes: 2 ** 28
      }))
    };
  }

  async stacks(id: string): Promise<IStacksResponse> {
    this.calls.push(`stacks ${id}`);
    if (this.stacksAnswer instanceof Error) {
      throw this.stacksAnswer;
    }
    return this.stacksAnswer;
  }

  async stop(id: string, place: string) {
    this.calls.push(`stop ${id} from ${place}`);
    if (this.stopAnswer) {
      throw this.stopAnswer;
    }
    this.runs = this.runs.map(r => (r.id === id ? { ...r, state: 'stopped', live: false } : r));
    return { id, stopping: true, message: 'stopping' };
  }
}

describe('RunsModel', () => {
  it('lists runs as the server sends them and fetches the ranks of a run a dashboard shows', async () => {
    const server = new InMemoryServer();
    server.runs = [
      summary('run-20250101-000002-b'),
      summary('run-20250101-000001-a', { live: false })
    ];
    const model = new RunsModel(server);
    await model.refresh();
    expect(model.runs.map(r => r.id)).toEqual(['run-20250101-000002-b', 'run-20250101-000001-a']);
    await model.watch('run-20250101-000002-b');
    expect(model.details.get('run-20250101-000002-b')?.ranks.map(r => r.rss_bytes)).toEqual([
      2 ** 28,
      2 ** 28
    ]);
    server.calls = [];
    await model.refresh();
    expect(server.calls).toEqual(['list', 'detail run-20250101-000002-b']); // only the watched run
    model.unwatch('run-20250101-000002-b'); // its dashboard closed
    server.calls = [];
    await model.refresh();
    expect(server.calls).toEqual(['list']);
  });

  it('polls while a run is live and not once nothing is running', async () => {
    let now = 0;
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a', { state: 'done', live: false })];
    const model = new RunsModel(server, () => now);
    await model.refresh();
    expect(model.shouldPoll()).toBe(false);
    server.runs = [summary('run-20250101-000002-b'), ...server.runs];
    await model.refresh();
    expect(model.shouldPoll()).toBe(true);
    model.cellStarted('cell-1');
    server.runs = server.runs.map(r => ({ ...r, live: false, state: 'done' }));
    await model.refresh();
    expect(model.shouldPoll()).toBe(true); // the cell still runs: its launch may come next
    model.cellFinished('cell-1');
    now += CELL_GRACE_MS - 1;
    expect(model.shouldPoll()).toBe(true);
    now += 2;
    expect(model.shouldPoll()).toBe(false);
    model.cellFinished('markdown-cell'); // finished without having started: no new grace period
    expect(model.shouldPoll()).toBe(false);
  });

  it('keeps the refusal reason of a Stop the server turned down', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    server.stopAnswer = new Error(
      'run-20250101-000001-a has already ended (done): nothing to stop'
    );
    const model = new RunsModel(server);
    await model.refresh();
    await model.stop('run-20250101-000001-a', 'dashboard');
    expect(model.notes.get('run-20250101-000001-a')).toBe(
      'Not stopped: run-20250101-000001-a has already ended (done): nothing to stop'
    );
  });

  it('refreshes after Stop so the run shows as stopped', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    const model = new RunsModel(server);
    await model.refresh();
    await model.stop('run-20250101-000001-a', 'dashboard');
    expect(server.calls).toEqual(['list', 'stop run-20250101-000001-a from dashboard', 'list']);
    expect(model.run('run-20250101-000001-a')?.state).toBe('stopped');
    expect(model.anyLive).toBe(false);
    expect(model.notes.has('run-20250101-000001-a')).toBe(false); // "Stopping…" is gone once it has
  });

  it('shows "Stopping…" while the run is still live after the request', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    server.stop = async id => ({ id, stopping: true, message: 'stopping' }); // still live at the next list
    const model = new RunsModel(server);
    await model.refresh();
    await model.stop('run-20250101-000001-a', 'dashboard');
    expect(model.notes.get('run-20250101-000001-a')).toBe('Stopping…');
  });

  it('clears a live session\'s "Stopping…" once its stopped cell is back to idle', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a', { session: true, state: 'running' })];
    server.stop = async id => ({ id, stopping: true, message: 'stopping the running cell' });
    const model = new RunsModel(server);
    await model.refresh();
    await model.stop('run-20250101-000001-a', 'dashboard');
    expect(model.notes.get('run-20250101-000001-a')).toBe('Stopping…'); // the cell still runs
    server.runs = [summary('run-20250101-000001-a', { session: true, state: 'idle' })];
    await model.refresh();
    expect(model.run('run-20250101-000001-a')?.live).toBe(true); // the session goes on
    expect(model.notes.has('run-20250101-000001-a')).toBe(false);
  });

  it('forgets a watched run whose folder is gone and reports a failed list', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    const model = new RunsModel(server);
    await model.refresh();
    await model.watch('run-20250101-000001-a');
    server.runs = [];
    await model.refresh();
    expect(model.watched.size).toBe(0);
    server.list = async () => {
      throw new Error('The nblaunch server extension is not enabled');
    };
    await model.refresh();
    expect(model.error).toBe('The nblaunch server extension is not enabled');
  });
});

describe('RunsModel refreshes', () => {
  it('run one at a time, so the answer shown is never older than the last request', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    const model = new RunsModel(server);
    let release: () => void = () => undefined;
    const slow = new Promise<void>(resolve => (release = resolve));
    const list = server.list.bind(server);
    let first = true;
    server.list = async () => {
      const answer = await list(); // what the server says now...
      if (first) {
        first = false;
        await slow; // ...arrives late
      }
      return answer;
    };
    const a = model.refresh();
    server.runs = [summary('run-20250101-000001-a', { state: 'stopped', live: false })];
    const b = model.refresh();
    const c = model.refresh(); // coalesced with b
    release();
    await Promise.all([a, b, c]);
    expect(model.run('run-20250101-000001-a')?.state).toBe('stopped');
    expect(server.calls).toEqual(['list', 'list']);
  });
});

describe('RunsPoller', () => {
  function manualTimers() {
    const pending: Array<() => void> = [];
    return {
      pending,
      timers: { set: (fn: () => void) => pending.push(fn), clear: () => pending.splice(0) }
    };
  }

  it('refreshes every tick while a run is live and stops once none is', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    const model = new RunsModel(server);
    const { pending, timers } = manualTimers();
    const poller = new RunsPoller(model, timers, 1000);
    await poller.start();
    expect(pending.length).toBe(1);
    server.runs = [summary('run-20250101-000001-a', { live: false, state: 'done' })];
    await pending.shift()?.();
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(pending.length).toBe(0); // nothing live: no next tick
    expect(poller.polling).toBe(false);
    expect(server.calls.filter(c => c === 'list').length).toBe(2);
  });

  it('does not re-arm after stop() even if a refresh was in flight', async () => {
    const server = new InMemoryServer();
    server.runs = [summary('run-20250101-000001-a')];
    const model = new RunsModel(server);
    const { pending, timers } = manualTimers();
    const poller = new RunsPoller(model, timers, 1000);
    const started = poller.start();
    poller.stop();
    await started;
    expect(pending.length).toBe(0);
  });
});

describe('LogFollower', () => {
  function chunks(parts: Array<Partial<ILogChunk>>) {
    const asked: Array<{ tail?: number; offset?: number }> = [];
    let i = 0;
    const fetch = async (query: { tail?: number; offset?: number }): Promise<ILogChunk> => {
      asked.push(query);
      const part = parts[Math.min(i++, parts.length - 1)];
      return {
        id: 'r',
        rank: 0,
        log: 'rank0.log',
        live: true,
        text: '',
        start: 0,
        end: 0,
        size: 0,
        ...part
      };
    };
    return { asked, fetch };
  }

  it('asks for the last lines first, then follows from where the last answer ended', async () => {
    const { asked, fetch } = chunks([
      { text: 'line 8\nline 9\n', start: 120, end: 134 },
      { text: 'line 10\n', start: 134, end: 142 },
      { text: '', start: 142, end: 142, live: false }
    ]);
    const log = new LogFollower(fetch, 2);
    await log.poll();
    expect(log.hiddenBytes).toBe(120);
    await log.poll();
    expect(await log.poll()).toBe(false);
    expect(asked).toEqual([{ tail: 2 }, { offset: 134 }, { offset: 142 }]);
    expect(log.text).toBe('line 8\nline 9\nline 10\n');
    expect(log.live).toBe(false);
  });

  it('drops whole lines from the top past its size limit and counts them as hidden', async () => {
    const { fetch } = chunks([
      { text: 'aaaa\nbbbb\n', start: 0, end: 10 },
      { text: 'cccc\n', start: 10, end: 15 }
    ]);
    const log = new LogFollower(fetch, 500, 12);
    await log.poll();
    await log.poll();
    expect(log.text).toBe('bbbb\ncccc\n');
    expect(log.hiddenBytes).toBe(5);
  });
});

describe('formatting', () => {
  it('formats elapsed time, bytes, rank states and where a run came from', () => {
    expect(formatElapsed(62.9)).toBe('01:02');
    expect(formatElapsed(3723)).toBe('1:02:03');
    expect(formatElapsed(null)).toBe('–');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1.5 * 2 ** 30)).toBe('1.5 GiB');
    expect(formatBytes(300 * 2 ** 20)).toBe('300 MiB');
    expect(
      rankStateText({ rank: 1, pid: 3, state: 'failed', exit: 'killed by SIGKILL', log: null })
    ).toBe('failed: killed by SIGKILL');
    expect(runOrigin(summary('x', { notebook: null }))).toBe('kernel abcdef01');
    expect(runMeta(summary('x'))).toBe('local · 2 ranks · gloo');
    expect(runMeta(summary('x', { engine: 'local (live)', session: true, cells_run: 1 }))).toBe(
      'local (live) · 2 ranks · gloo · live session, 1 cell run'
    );
    expect(runMeta(summary('x', { session: true, cells_run: 12, restarts: 2 }))).toBe(
      'local · 2 ranks · gloo · live session, 12 cells run, 2 restarts'
    );
  });

  it('shows GPU columns only when a rank has GPU figures', () => {
    const rank = { rank: 0, pid: 1, state: 'running', exit: null, log: 'rank0.log' };
    expect(hasGpuColumns([rank, { ...rank, gpu: null }])).toBe(false);
    expect(hasGpuColumns([rank, { ...rank, gpu_index: 1, gpu_memory_bytes: 2 ** 30 }])).toBe(true);
  });
});

describe('Stacks', () => {
  const answer: IStacksResponse = {
    id: 'run-20250101-000001-a',
    taken: new Date(2025, 0, 1, 18, 5, 12).getTime() / 1000,
    ranks: [
      {
        rank: 0,
        answered: true,
        where: 'cell In[3], line 4 in <module>',
        collective: null,
        source: 'time.sleep(0.1)',
        calling: 'sleep',
        frames: [
          {
            file: '<%%distributed cell In[3]>',
            line: 4,
            function: '<module>',
            where: 'cell In[3], line 4 in <module>',
            user: true
          }
        ]
      },
      {
        rank: 1,
        answered: true,
        where: 'train.py:9 in step',
        collective: 'barrier',
        frames: [
          { file: 'train.py', line: 9, function: 'step', where: 'train.py:9 in step', user: true },
          {
            file: '/x/torch/distributed/distributed_c10d.py',
            line: 5300,
            function: 'barrier',
            where: 'c10d:5300 in barrier',
            user: false
          }
        ]
      },
      {
        rank: 2,
        answered: false,
        reason: 'rank 2 did not answer within 0.5 s (its process is stopped)'
      }
    ]
  };

  it('shows each rank with its place, its collective and its frames, and why a rank gave none', async () => {
    const server = new InMemoryServer();
    server.stacksAnswer = answer;
    const model = new RunsModel(server);
    await model.showStacks('run-20250101-000001-a');
    const text = model.stacks.get('run-20250101-000001-a') ?? '';
    expect(text).toBe(stacksText(answer));
    expect(text.startsWith('Taken at 18:05:12, every rank at once; the run went on.\n\n')).toBe(
      true
    );
    expect(text).toContain('rank 1: train.py:9 in step, waiting in torch.distributed.barrier()');
    expect(text).toContain('  inside:\n    · c10d:5300 in barrier');
    expect(text).toContain('rank 2: rank 2 did not answer within 0.5 s (its process is stopped)');
    // each rank once: its place with the C function it calls and the line's text, the frame not repeated
    expect(text).toContain(
      'rank 0: cell In[3], line 4 in <module>, calling sleep()\n    time.sleep(0.1)\n\nrank 1'
    );
    expect(text.match(/cell In\[3\], line 4/g)).toHaveLength(1);
    model.hideStacks('run-20250101-000001-a');
    expect(model.stacks.has('run-20250101-000001-a')).toBe(false);
  });

  it("keeps the server's refusal as the run's note", async () => {
    const server = new InMemoryServer();
    server.stacksAnswer = new Error(
      'run-20250101-000001-a is not running (done): no stacks to show'
    );
    const model = new RunsModel(server);
    await model.showStacks('run-20250101-000001-a');
    expect(model.stacks.has('run-20250101-000001-a')).toBe(false);
    expect(model.notes.get('run-20250101-000001-a')).toBe(
      'No stacks: run-20250101-000001-a is not running (done): no stacks to show'
    );
  });
});
