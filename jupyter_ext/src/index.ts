/** Wires nblaunch's panel and commands into JupyterLab. */

import {
  ILabShell,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IDebugger, IDebuggerSidebar } from '@jupyterlab/debugger';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { EXPORT_CELL_SOURCE } from './cellTemplate';
import { addOpenDashboardCommand } from './dashboardCommands';
import { DebuggerRanks } from './debuggerRanks';
import { logTabTitle } from './dashboardModel';
import { launchIcon } from './icon';
import { insertDistributedCell } from './insertCell';
import { addOpenLogCommand, listenToLogLinks } from './logCommands';
import { LaunchPanel, PANEL_ID } from './panel';
import { IRunViewArea, TabArea } from './shellArea';

export const CommandIDs = {
  insertCell: 'nblaunch:insert-distributed-cell',
  insertExport: 'nblaunch:insert-export-cell',
  openPanel: 'nblaunch:open-panel',
  openLog: 'nblaunch:open-log',
  openDashboard: 'nblaunch:open-run-dashboard'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nblaunch:panel',
  description:
    'A side panel that edits the launch config of %%distributed and notebook_launcher() and lists every run; a dashboard tab per run with its ranks over time, logs, stacks and Stop.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer, IRunViewArea],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    viewArea: TabArea | null
  ) => {
    // main-area tabs where the Lab-only plugin below runs; Notebook 7's right side panel elsewhere
    const area = viewArea ?? 'right';
    const panel = new LaunchPanel(
      launchIcon,
      () => app.commands.execute(CommandIDs.insertCell),
      () => app.commands.execute(CommandIDs.insertExport),
      run => void app.commands.execute(CommandIDs.openDashboard, { run })
    );
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, PANEL_ID);

    app.commands.addCommand(CommandIDs.insertCell, {
      label: 'Insert %%distributed cell',
      caption:
        'Insert a %%distributed cell (and %load_ext kernelside if needed) below the current cell',
      execute: () => {
        if (insertDistributedCell(tracker) && tracker.currentWidget) {
          app.shell.activateById(tracker.currentWidget.id);
        }
      }
    });
    app.commands.addCommand(CommandIDs.insertExport, {
      label: 'Insert %distributed_export cell',
      caption:
        'Insert a cell that exports the last %%distributed cell as a script for torchrun / accelerate launch',
      execute: () => {
        if (insertDistributedCell(tracker, EXPORT_CELL_SOURCE) && tracker.currentWidget) {
          app.shell.activateById(tracker.currentWidget.id);
        }
      }
    });
    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Open Distributed launch panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    addOpenLogCommand(app, CommandIDs.openLog, area, (run, rank) => {
      const summary = panel.runs.run(run);
      return summary ? logTabTitle(summary, rank) : `${run} · rank ${rank}`;
    });
    addOpenDashboardCommand(
      app,
      CommandIDs.openDashboard,
      area,
      panel.runs,
      launchIcon,
      tracker,
      {
        watchChanged: () => panel.watchRuns()
      },
      area === 'main' ? restorer : null // a side panel's dashboard is not brought back on reload
    );
    // a cell's log link opens the run's dashboard at that rank's log (its pane has the rank switcher)
    listenToLogLinks(
      (run, rank) => void app.commands.execute(CommandIDs.openDashboard, { run, rank })
    );
    // A cell that runs may start a launch: watch the run folders until it is done.
    NotebookActions.executionScheduled.connect((_, { cell }) => {
      panel.runs.cellStarted(cell.model.id);
      panel.watchRuns();
    });
    NotebookActions.executed.connect((_, { cell }) => panel.runs.cellFinished(cell.model.id));
    for (const command of Object.values(CommandIDs).filter(c => c !== CommandIDs.openLog)) {
      palette?.addItem({ command, category: 'nblaunch' });
    }
    void panel.load();
  }
};

/** JupyterLab only (it requires ILabShell): run dashboards and rank logs open as main-area tabs. */
const labTabs: JupyterFrontEndPlugin<TabArea> = {
  id: 'nblaunch:lab-tabs',
  description: 'Opens run dashboards and rank logs as main-area tabs (JupyterLab only).',
  autoStart: true,
  requires: [ILabShell],
  provides: IRunViewArea,
  activate: (): TabArea => 'main'
};

/** The debugger sidebar's "Ranks" section (see debuggerRanks.ts); nothing where there is no debugger. */
const debuggerRanks: JupyterFrontEndPlugin<void> = {
  id: 'nblaunch:debugger-ranks',
  description:
    'A Ranks section in the debugger sidebar: the stopped ranks of a %%distributed cell, and which one the call stack, variables and steps are for.',
  autoStart: true,
  optional: [IDebugger, IDebuggerSidebar],
  activate: (
    _app: JupyterFrontEnd,
    service: IDebugger | null,
    sidebar: IDebugger.ISidebar | null
  ) => {
    if (service && sidebar) {
      sidebar.insertWidget(0, new DebuggerRanks(service));
    }
  }
};

export default [labTabs, plugin, debuggerRanks];
