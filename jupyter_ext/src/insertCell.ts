/** The panel's "Insert … cell" actions: add ready cell(s) below the active notebook's current cell. */

import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { cellsToInsert, DISTRIBUTED_CELL_SOURCE } from './cellTemplate';

/** Insert the cells; returns false (and tells the user) when no notebook is open. */
export function insertDistributedCell(
  tracker: INotebookTracker,
  source: string = DISTRIBUTED_CELL_SOURCE
): boolean {
  const panel = tracker.currentWidget;
  if (!panel || !panel.model) {
    Notification.warning('Open a notebook first: the cell goes into the active notebook.', {
      autoClose: 5000
    });
    return false;
  }
  const notebook = panel.content;
  const existing = Array.from(panel.model.cells, cell => cell.sharedModel.getSource());
  for (const cell of cellsToInsert(existing, source)) {
    NotebookActions.insertBelow(notebook);
    notebook.activeCell?.model.sharedModel.setSource(cell);
  }
  notebook.mode = 'command';
  notebook.activate();
  return true;
}
