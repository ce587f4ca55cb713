/**
 * Opening a rank's log: the "nblaunch:open-log" command (args: run, rank), used by the run
 * dashboard's Log buttons, and the log links of a cell's status line (kernelside/run_links.py).
 *
 * Example: app.commands.execute('nblaunch:open-log', { run: 'run-20250101-120000-ab12cd34', rank: 0 })
 */

import { JupyterFrontEnd } from '@jupyterlab/application';

import { listenToLinks } from './linkClicks';
import { createLogWidget, logWidgetId } from './logView';
import { openOnce, TabArea } from './shellArea';

/** What the log links of a cell's status line carry. */
const LOG_LINK = 'a.nblaunch-log-link[data-nblaunch-run][data-nblaunch-rank]';
export const RUN_ID = /^run-\d{8}-\d{6}-[A-Za-z0-9_]+$/;

/** Register the command; a log already open is shown again rather than opened twice. */
export function addOpenLogCommand(
  app: JupyterFrontEnd,
  id: string,
  area: TabArea,
  titleOf: (run: string, rank: number) => string
): void {
  app.commands.addCommand(id, {
    label: args => (args.run ? `Open the log of rank ${args.rank ?? 0}` : 'Open a rank log'),
    execute: args => {
      const run = String(args.run ?? '');
      const rank = Number(args.rank ?? 0);
      if (!RUN_ID.test(run) || !Number.isInteger(rank) || rank < 0) {
        return;
      }
      openOnce(app, area, logWidgetId(run, rank), () =>
        createLogWidget(run, rank, titleOf(run, rank))
      );
    }
  });
}

/** Open the log a status-line link names (see linkClicks.ts). */
export function listenToLogLinks(open: (run: string, rank: number) => void): void {
  listenToLinks(LOG_LINK, link =>
    open(link.dataset.nblaunchRun ?? '', Number(link.dataset.nblaunchRank))
  );
}
