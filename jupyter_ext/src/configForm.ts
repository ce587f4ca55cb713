/**
 * The form: one section per schema group, one editor per field, all drawn from the
 * schema the server sent. A group this file does not know still shows, titled by its name.
 */

import { h } from './dom';
import { createFieldEditor, IFieldEditor } from './fieldEditors';
import { ConfigModel, IFieldGroup, isMapping } from './model';

const GROUP_TITLES: Record<string, string> = {
  processes: 'Processes',
  precision: 'Mixed precision',
  output: 'Output and progress',
  run: 'Run',
  machines: 'Multiple machines',
  advanced: 'Advanced'
};

const MULTI_MACHINE_NOTE =
  'Launching on several machines needs a multi-machine engine, which nblaunch does not ' +
  'have yet; these values are kept in the file but not used.';

export class ConfigForm {
  readonly node = h('div', { class: 'nblaunch-form' });

  constructor(private readonly _model: ConfigModel) {}

  /** Rebuild every editor from the model (after a load, revert or import). */
  render(): void {
    this._editors = [];
    this.node.replaceChildren(...this._model.groups().map(group => this._section(group)));
    this.refresh();
  }

  /** Bring dirty marks and error messages up to date. */
  refresh(): void {
    for (const editor of this._editors) {
      editor.refresh();
    }
  }

  private _section(group: IFieldGroup): HTMLElement {
    const titleId = `nblaunch-group-${group.group}`;
    const section = h(
      'section',
      { class: 'nblaunch-section', 'aria-labelledby': titleId, 'data-group': group.group },
      h(
        'h3',
        { id: titleId, class: 'nblaunch-section-title' },
        GROUP_TITLES[group.group] ?? group.group
      )
    );
    const multiMachine = this._model.info?.features.multi_machine ?? false;
    const disabled = group.group === 'machines' && !multiMachine;
    const body = h('fieldset', { class: 'nblaunch-group-fields', disabled });
    if (disabled) {
      section.append(h('p', { class: 'nblaunch-note' }, MULTI_MACHINE_NOTE));
    }
    for (const field of group.fields) {
      const editor = createFieldEditor(this._model, field);
      this._editors.push(editor);
      if (group.group === 'advanced' && isMapping(field)) {
        // Accelerate's sub-configs are long and rarely touched: collapsed until asked for.
        const details = h(
          'details',
          { class: 'nblaunch-collapsible', 'data-field': field.name },
          h('summary', {}, field.name)
        );
        details.open = Object.keys((this._model.value(field.name) as object) ?? {}).length > 0;
        details.append(editor.node);
        body.append(details);
      } else {
        body.append(editor.node);
      }
    }
    section.append(body);
    return section;
  }

  private _editors: IFieldEditor[] = [];
}
