/**
 * Import from / export to an Accelerate config file. Paths are relative to the
 * Jupyter server's root; an empty import path means Accelerate's default config.
 */

import { button, h } from './dom';

export interface IAccelerateActions {
  importFrom(path: string): Promise<void>;
  /** Returns what to say beside Export: the file written and its command, or why not. */
  exportTo(path: string): Promise<string>;
}

export const DEFAULT_EXPORT_PATH = 'accelerate_config.yaml';

export function createAccelerateSection(actions: IAccelerateActions): HTMLElement {
  const importPath = h('input', {
    id: 'nblaunch-import-path',
    type: 'text',
    class: 'nblaunch-input',
    placeholder: "empty: Accelerate's default config",
    spellcheck: 'false'
  });
  const exportPath = h('input', {
    id: 'nblaunch-export-path',
    type: 'text',
    class: 'nblaunch-input',
    spellcheck: 'false'
  });
  exportPath.value = DEFAULT_EXPORT_PATH;
  const onEnter = (input: HTMLInputElement, run: () => void) =>
    input.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        event.preventDefault();
        run();
      }
    });
  const runImport = () => void actions.importFrom(importPath.value.trim());
  const exported = h('div', { class: 'nblaunch-export-status', role: 'status' });
  const runExport = async () => {
    exported.textContent = await actions.exportTo(exportPath.value.trim());
  };
  onEnter(importPath, runImport);
  onEnter(exportPath, () => void runExport());
  return h(
    'details',
    { class: 'nblaunch-section nblaunch-collapsible nblaunch-accelerate' },
    h('summary', { class: 'nblaunch-section-title' }, 'Accelerate config'),
    h(
      'div',
      { class: 'nblaunch-field' },
      h('label', { for: 'nblaunch-import-path', class: 'nblaunch-label' }, 'Import from'),
      h('div', { class: 'nblaunch-inline' }, importPath, button('Import', runImport)),
      h(
        'div',
        { class: 'nblaunch-help' },
        'Fills the form with the overlapping keys; Save to keep them.'
      )
    ),
    h(
      'div',
      { class: 'nblaunch-field' },
      h('label', { for: 'nblaunch-export-path', class: 'nblaunch-label' }, 'Export to'),
      h(
        'div',
        { class: 'nblaunch-inline' },
        exportPath,
        button('Export', () => void runExport())
      ),
      h(
        'div',
        { class: 'nblaunch-help' },
        'Writes a file for accelerate launch --config_file, from the values in the form.'
      ),
      exported
    )
  );
}
