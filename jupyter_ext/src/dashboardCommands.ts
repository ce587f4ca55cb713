/**
 * Opening a run's dashboard: the "nblaunch:open-run-dashboard" command (args: run; without one it
 * asks which run, for the command palette), used by the sidebar's runs list and by the run-name
 * link of a cell's status line; and "Cell [N]" in a dashboard, which shows that cell in its notebook.
 *
 * Example: app.commands.execute('nblaunch:open-run-dashboard', { run: 'run-20250101-120000-ab12cd34' })
 */

import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  InputDialog,
  MainAreaWidget,
  showDialog,
  WidgetTracker
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import { runName } from './dashboardModel';
import {
  createDashboardWidget,
  DASHBOARD_PREFIX,
  dashboardWidgetId,
  IDashboardActions
} from './dashboardView';
import { listenToLinks } from './linkClicks';
import { RUN_ID } from './logCommands';
import { formatElapsed, RunsModel } from './runsModel';
import { openOnce, TabArea } from './shellArea';

/** What the run-name link of a cell's status line carries. */
const RUN_LINK = 'a.nblaunch-run-link[data-nblaunch-run]';

/** Register the command; a run's dashboard already open is shown again rather than opened twice. */
export function addOpenDashboardCommand(
  app: JupyterFrontEnd,
  id: string,
  area: TabArea,
  runs: RunsModel,
  icon: LabIcon,
  notebooks: INotebookTracker,
  actions: Omit<IDashboardActions, 'openCell'>,
  restorer: ILayoutRestorer | null
): void {
  // Open dashboards come back after a page reload, as the lab's own tabs do.
  const tracker = new WidgetTracker<MainAreaWidget>({ namespace: 'nblaunch-dashboard' });
  const dashboardActions: IDashboardActions = {
    ...actions,
    openCell: (notebook, cell) => void showCell(app, notebooks, notebook, cell)
  };
  app.commands.addCommand(id, {
    label: args => (args.run ? 'Open the run dashboard' : 'nblaunch: Open run dashboard…'),
    caption: "A run's ranks, their resources over time, logs, stacks and Stop, in a tab",
    execute: async args => {
      const run = args.run ? String(args.run) : await pickRun(runs);
      if (!run || !RUN_ID.test(run)) {
        return;
      }
      const widget = openOnce(app, area, dashboardWidgetId(run), () =>
        createDashboardWidget(run, runs, dashboardActions, icon)
      );
      if (widget) {
        void tracker.add(widget);
      }
    }
  });
  void restorer?.restore(tracker, {
    command: id,
    args: widget => ({ run: widget.id.replace(DASHBOARD_PREFIX, '') }),
    name: widget => widget.id
  });
  listenToLinks(
    RUN_LINK,
    link => void app.commands.execute(id, { run: link.dataset.nblaunchRun ?? '' })
  );
}

/** Ask which run (newest first), for the palette; '' when cancelled or when there is none. */
async function pickRun(runs: RunsModel): Promise<string> {
  await runs.refresh();
  if (!runs.runs.length) {
    await showDialog({
      title: 'No runs yet',
      body: 'A %%distributed cell or notebook_launcher() call shows up here once it starts.',
      buttons: [Dialog.okButton()]
    });
    return '';
  }
  const labels = runs.runs.map(
    run =>
      `${runName(run)} · ${run.cell ? `cell [${run.cell}] · ` : ''}${run.state} · ${formatElapsed(run.elapsed_s)}`
  );
  const answer = await InputDialog.getItem({
    title: 'Open run dashboard',
    label: 'Run',
    items: labels,
    current: 0
  });
  const index = answer.button.accept && answer.value !== null ? labels.indexOf(answer.value) : -1;
  return index >= 0 ? runs.runs[index].id : '';
}

/**
 * Show cell [count] of the notebook at path (relative to the server's root), opening it if needed. A
 * notebook open in this page is used as it is; otherwise the document manager opens it: a tab in
 * JupyterLab, a page of its own in Notebook 7 (which cannot show the cell from here, and says so).
 */
async function showCell(
  app: JupyterFrontEnd,
  notebooks: INotebookTracker,
  path: string,
  count: number
): Promise<void> {
  const open = notebooks.find(panel => panel.context.path === path);
  const widget = open ?? (await app.commands.execute('docmanager:open', { path }));
  if (!(widget instanceof NotebookPanel)) {
    await showDialog({
      title: `Cell [${count}] of ${path}`,
      body: `${path} opened in a page of its own (if the browser let it): look for cell [${count}] there.`,
      buttons: [Dialog.okButton()]
    });
    return;
  }
  await widget.context.ready;
  app.shell.activateById(widget.id);
  const notebook = widget.content;
  type CodeState = { executionCount?: number | null; executionState?: string };
  const code = notebook.widgets.map(cell =>
    cell.model.type === 'code' ? (cell.model as unknown as CodeState) : {}
  );
  // A cell that runs has no count in the notebook until it ends ([*]): then the run's cell is the one running.
  let index = code.findIndex(model => model.executionCount === count);
  if (index < 0) {
    index = code.findIndex(model => model.executionState === 'running');
  }
  if (index < 0) {
    return; // re-run or cleared since: the notebook is shown, the count no longer names a cell
  }
  notebook.activeCellIndex = index;
  await notebook.scrollToCell(notebook.widgets[index], 'center');
}
