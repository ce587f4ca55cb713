/**
 * Where a dashboard or a rank log opens. JupyterLab shows them as main-area tabs; Notebook 7's
 * shell keeps one document per page and ignores a second main-area widget, so there they open in
 * its right side panel (View › Right Sidebar), beside the notebook they came from.
 *
 * Example: app.shell.add(widget, tabArea(app)); app.shell.activateById(widget.id)
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

export type TabArea = 'main' | 'right';

/** 'main' in JupyterLab (and apps built like it), 'right' in Notebook 7. */
export function tabArea(app: Pick<JupyterFrontEnd, 'name'>): TabArea {
  return app.name === 'Jupyter Notebook' ? 'right' : 'main';
}

/** Show the widget with this id if it is open in its area; otherwise add what make() builds (returned), then show it. */
export function openOnce<T extends Widget>(
  app: JupyterFrontEnd,
  widgetId: string,
  make: () => T
): T | null {
  const area = tabArea(app);
  const open = Array.from(app.shell.widgets(area)).some(w => w.id === widgetId);
  const added = open ? null : make();
  if (added) {
    app.shell.add(added, area, { rank: 1000 });
  }
  app.shell.activateById(widgetId);
  return added;
}
