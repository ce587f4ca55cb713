/**
 * Where a dashboard or a rank log opens. JupyterLab shows them as main-area tabs: that is Lab-only
 * behaviour, so it lives in a plugin of its own that requires ILabShell (index.ts: 'nblaunch:lab-tabs',
 * as JupyterLab's "Targeting multiple applications" guide has it), which provides IRunViewArea. Where
 * no plugin provides it (Notebook 7, whose shell keeps one document per page and ignores a second
 * main-area widget), they open in the right side panel, beside the notebook they came from.
 *
 * Example: openOnce(app, area ?? 'right', widgetId, () => createLogWidget(run, rank, title))
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import { Token } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

export type TabArea = 'main' | 'right';

/** The shell area the run views open in; provided by the Lab-only plugin ('main'). */
export const IRunViewArea = new Token<TabArea>(
  'nblaunch:IRunViewArea',
  'Where nblaunch opens run dashboards and rank logs: main-area tabs in JupyterLab.'
);

/** Show the widget with this id if it is open in its area; otherwise add what make() builds (returned), then show it. */
export function openOnce<T extends Widget>(
  app: JupyterFrontEnd,
  area: TabArea,
  widgetId: string,
  make: () => T
): T | null {
  const open = Array.from(app.shell.widgets(area)).some(w => w.id === widgetId);
  const added = open ? null : make();
  if (added) {
    app.shell.add(added, area, { rank: 1000 });
  }
  app.shell.activateById(widgetId);
  return added;
}
