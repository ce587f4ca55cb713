/** "Insert %%distributed cell": adds the ready cell(s) below the active notebook's current cell. */

import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { cellsToInsert } from './cellTemplate';

/** Insert the cells; returns false (and tells the user) when no notebook is open. */
export function insertDistributedCell(tracker: INotebookTracker): boolean {
  const panel = tracker.currentWidget;
  if (!panel || !panel.model) {
    Notification.warning(
      'Open a notebook first: the %%distributed cell goes into the active notebook.',
      {
        autoClose: 5000
      }
    );
    return false;
  }
  const notebook = panel.content;
  const existing = Array.from(panel.model.cells, cell => cell.sharedModel.getSource());
  for (const source of cellsToInsert(existing)) {
    NotebookActions.insertBelow(notebook);
    notebook.activeCell?.model.sharedModel.setSource(source);
  }
  notebook.mode = 'command';
  notebook.activate();
  return true;
}
