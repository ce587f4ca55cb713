/**
 * A "Ranks" section in JupyterLab's debugger sidebar: which ranks are stopped, and which one the call
 * stack, the variables and the step/continue buttons are for.
 *
 * JupyterLab's debugger shows one thread at a time, the one that stopped last, and has no thread picker: with
 * two ranks at a breakpoint, the first one's frames are gone from the panel when the second stops. The kernel
 * names each rank's thread "rank N" (kernelside/debugger/routes.py); this section lists the stopped ones and,
 * when one is chosen, makes it the debugger's current thread (its frames, its variables; Continue and the
 * steps go to it); "Continue all" releases every stopped rank. It shows only while a rank is stopped, so plain
 * notebooks never see it.
 *
 * Example: rank 0 and rank 1 stop at a breakpoint on line 3; the section reads "2 ranks stopped" with a
 * selector on "rank 1" (the last to stop); choosing "rank 0" shows rank 0's frames and variables.
 */

import { IDebugger } from '@jupyterlab/debugger';
import { Widget } from '@lumino/widgets';

import { h } from './dom';

/** The kernel's name for a rank's main thread ("rank 3"), or for another of its threads ("rank 3: loader"). */
const RANK_THREAD = /^rank \d+(: .*)?$/;

/** Where the sidebar's private method that loads the current thread's frames and variables is, if it is. */
type FramesLoader = { _getAllFrames?: () => Promise<void> };

export class DebuggerRanks extends Widget {
  constructor(private readonly _service: IDebugger) {
    super();
    this.id = 'nblaunch-debugger-ranks';
    this.title.label = 'Ranks';
    this.title.caption =
      'The stopped ranks of a %%distributed cell: choose the one to inspect and step';
    this.addClass('nblaunch-debugger-ranks');
    this._select.addEventListener('change', () => void this.inspect(Number(this._select.value)));
    this._all.addEventListener('click', () => void this.continueAll());
    this.node.append(
      this._status,
      h(
        'div',
        { class: 'nblaunch-debugger-ranks-row' },
        h('label', {}, 'Rank ', this._select),
        this._all
      )
    );
    _service.eventMessage.connect((_, event) => void this._onEvent(event));
    _service.sessionChanged.connect(() => {
      this._stopped.clear();
      this._render();
    });
    this._render();
  }

  /** The panel's thread ids of the stopped ranks, in rank order. */
  get stopped(): number[] {
    return [...this._stopped.keys()].sort(
      (a, b) => rankOf(this._names.get(a)) - rankOf(this._names.get(b))
    );
  }

  /** Make rank thread `threadId` the debugger's current thread: its frames and variables, its steps. */
  async inspect(threadId: number): Promise<void> {
    const session = this._service.session;
    if (!session || !this._stopped.has(threadId)) {
      return;
    }
    this._choose(threadId);
    this._render();
    const loader = this._service as unknown as FramesLoader;
    if (typeof loader._getAllFrames === 'function') {
      await loader._getAllFrames.call(this._service); // frames, then the variables of the top one
    } else {
      const reply = await session.sendRequest('stackTrace', { threadId });
      this._service.model.callstack.frames = reply.body.stackFrames;
    }
  }

  /** Every stopped rank runs on (the panel's Continue releases the rank shown only). */
  async continueAll(): Promise<void> {
    const session = this._service.session;
    if (!session) {
      return;
    }
    const threads = this.stopped;
    this._stopped.clear();
    this._current = null;
    this._service.model.stoppedThreads = new Set();
    this._service.model.callstack.frames = [];
    this._render();
    await Promise.all(threads.map(threadId => session.sendRequest('continue', { threadId })));
  }

  /** The debugger's current thread becomes `threadId`: Continue, Next, Step in/out act on it. */
  private _choose(threadId: number): void {
    this._current = threadId;
    this._service.model.stoppedThreads = new ChosenThread(threadId, id => void this._released(id));
  }

  /** The debugger let rank thread `id` run on (Continue): a rank still stopped is shown in its place. */
  private async _released(id: number): Promise<void> {
    this._stopped.delete(id);
    const next = this.stopped[0];
    if (this._current === id && next !== undefined) {
      await this.inspect(next);
    }
    this._render();
  }

  private async _onEvent(event: IDebugger.ISession.Event): Promise<void> {
    const body = (event.body ?? {}) as { threadId?: number; reason?: string };
    if (event.event === 'stopped' && typeof body.threadId === 'number') {
      await this._learnNames();
      if (RANK_THREAD.test(this._names.get(body.threadId) ?? '')) {
        this._stopped.set(body.threadId, true);
        // JupyterLab shows the thread that stopped last: so does the selector, and Continue goes to it
        this._choose(body.threadId);
      }
      this._render();
    } else if (event.event === 'continued' && typeof body.threadId === 'number') {
      this._stopped.delete(body.threadId);
      const current = this._current;
      if (current !== null && current !== body.threadId && this._stopped.has(current)) {
        await this.inspect(current); // JupyterLab cleared the panel for another rank's run: show this one again
      }
      this._render();
    } else if (event.event === 'thread' && body.reason === 'exited') {
      this._stopped.delete(body.threadId ?? -1);
      this._render();
    }
  }

  /** The threads' names, from the kernel (the ranks' threads are "rank N"). */
  private async _learnNames(): Promise<void> {
    const session = this._service.session;
    if (!session) {
      return;
    }
    try {
      const reply = await session.sendRequest('threads', {});
      for (const t of reply.body.threads) {
        this._names.set(t.id, t.name);
      }
    } catch {
      // no answer this time: the names already known stand
    }
  }

  private _render(): void {
    const stopped = this.stopped;
    this.setHidden(stopped.length === 0);
    this._status.textContent =
      stopped.length === 1 ? '1 rank stopped' : `${stopped.length} ranks stopped`;
    this._select.replaceChildren(
      ...stopped.map(id =>
        h(
          'option',
          { value: String(id), selected: id === this._current },
          this._names.get(id) ?? `thread ${id}`
        )
      )
    );
  }

  private _stopped = new Map<number, true>();
  private _names = new Map<number, string>();
  private _current: number | null = null;
  private _status = h('div', { class: 'nblaunch-debugger-ranks-status', role: 'status' });
  private _select = h('select', {
    class: 'nblaunch-debugger-rank',
    'aria-label': 'Rank to inspect'
  });
  private _all = h(
    'button',
    {
      class: 'jp-Button jp-mod-styled nblaunch-debugger-continue-all',
      type: 'button',
      title: "Continue every stopped rank (the panel's Continue releases the rank shown only)"
    },
    'Continue all'
  );
}

/**
 * The debugger's stopped threads while a rank is its current one. JupyterLab 4.6's `DebuggerService.continue()`
 * takes the current thread out of `stoppedThreads` before it reads the current thread for its request, so with
 * one thread in the set its `continue` goes to thread 1 (the kernel's own main thread), never to a rank. This set
 * lets go of a thread just after (once the request has been made with the right thread) and says which one.
 */
class ChosenThread extends Set<number> {
  constructor(
    threadId: number,
    private readonly _onReleased: (threadId: number) => void
  ) {
    super([threadId]);
  }

  delete(threadId: number): boolean {
    if (!this.has(threadId)) {
      return false;
    }
    queueMicrotask(() => {
      super.delete(threadId);
      this._onReleased(threadId);
    });
    return true;
  }
}

function rankOf(name: string | undefined): number {
  const found = /^rank (\d+)/.exec(name ?? '');
  return found ? Number(found[1]) : Number.MAX_SAFE_INTEGER;
}
