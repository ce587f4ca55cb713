import { LogFollower, searchLines, stampText } from '../src/logFollower';
import { ILogChunk } from '../src/types';

function server(parts: Array<Partial<ILogChunk>>) {
  let i = 0;
  return async (): Promise<ILogChunk> => ({
    id: 'r',
    rank: 1,
    log: 'rank1.log',
    live: true,
    text: '',
    start: 0,
    end: 0,
    size: 0,
    ...parts[Math.min(i++, parts.length - 1)]
  });
}

describe('LogFollower lines', () => {
  it('stamps lines with when they arrived; lines there before the tab opened have no stamp', async () => {
    let now = 1000;
    const log = new LogFollower(
      server([
        { text: 'old 1\nold 2\n', end: 12 },
        { text: 'new 3\n', start: 12, end: 18 }
      ]),
      500,
      1_000_000,
      () => now
    );
    await log.poll();
    now = 5000;
    await log.poll();
    expect(log.kernelTimes).toBe(false); // a run without times: when each line reached the tab
    expect(log.lines).toEqual([
      { at: null, text: 'old 1\n' },
      { at: null, text: 'old 2\n' },
      { at: 5000, text: 'new 3\n' }
    ]);
  });

  it('joins a line written in two pieces, keeping the stamp of its start', async () => {
    let now = 1;
    const log = new LogFollower(
      server([
        { text: '', end: 0 },
        { text: 'step 1 lo', end: 9 },
        { text: 'ss 0.5\nstep 2\n', start: 9, end: 23 }
      ]),
      500,
      1_000_000,
      () => now++
    );
    await log.poll();
    await log.poll();
    await log.poll();
    expect(log.lines).toEqual([
      { at: 1, text: 'step 1 loss 0.5\n' },
      { at: 2, text: 'step 2\n' }
    ]);
  });

  it("stamps every line, old ones too, with the kernel's time when the run kept times", async () => {
    const log = new LogFollower(
      server([
        { text: 'old 1\nold 2\nhalf', end: 16, times: [100, 101, 102] },
        { text: ' done\nnew\n', start: 16, end: 26, times: [103.5, null] }
      ]),
      500,
      1_000_000,
      () => 999_000
    );
    await log.poll();
    await log.poll();
    expect(log.kernelTimes).toBe(true);
    expect(log.lines).toEqual([
      { at: 100_000, text: 'old 1\n' },
      { at: 101_000, text: 'old 2\n' },
      { at: 103_500, text: 'half done\n' }, // the time it was complete
      { at: 999_000, text: 'new\n' } // no time for it: when it reached the tab
    ]);
  });

  it('finds the lines that contain a query, whatever its case', () => {
    const lines = [
      { at: null, text: 'step 1\n' },
      { at: null, text: 'Loss 0.5\n' },
      { at: null, text: 'loss 0.4\n' }
    ];
    expect(searchLines(lines, 'LOSS').map(f => f.index)).toEqual([1, 2]);
    expect(searchLines(lines, '')).toHaveLength(3);
    expect(stampText(null)).toBe('');
    expect(stampText(new Date(2025, 0, 1, 9, 5, 3).getTime())).toBe('09:05:03');
  });
});
