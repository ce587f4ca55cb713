/** Wires nblaunch's panel and commands into JupyterLab. */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { launchIcon } from './icon';
import { insertDistributedCell } from './insertCell';
import { LaunchPanel, PANEL_ID } from './panel';

export const CommandIDs = {
  insertCell: 'nblaunch:insert-distributed-cell',
  openPanel: 'nblaunch:open-panel'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'nblaunch:panel',
  description:
    'A side panel that edits the launch config of %%distributed and notebook_launcher().',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new LaunchPanel(launchIcon, () => app.commands.execute(CommandIDs.insertCell));
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
    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Open Distributed launch panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    for (const command of Object.values(CommandIDs)) {
      palette?.addItem({ command, category: 'nblaunch' });
    }
    void panel.load();
  }
};

export default plugin;
