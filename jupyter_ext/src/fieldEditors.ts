/**
 * One editor per schema field, chosen by the field's type: a select for choices, a
 * checkbox for booleans, name/value rows for mappings, a text box otherwise. Each editor
 * writes to the model on input and shows the field's dirty mark and error message.
 */

import { h, button } from './dom';
import { ConfigModel, isMapping } from './model';
import { IFieldSchema } from './types';

/** A field's row in the form, and how to bring its marks up to date with the model. */
export interface IFieldEditor {
  node: HTMLElement;
  refresh(): void;
}

export function createFieldEditor(model: ConfigModel, field: IFieldSchema): IFieldEditor {
  const id = `nblaunch-field-${field.name}`;
  const helpId = `${id}-help`;
  const errorId = `${id}-error`;
  const control = isMapping(field)
    ? createMappingEditor(model, field, id)
    : createInput(model, field, id, `${helpId} ${errorId}`);
  const dirtyMark = h('span', { class: 'nblaunch-dirty-mark', title: 'unsaved change' }, '●');
  const label = h(
    'label',
    { for: id, class: 'nblaunch-label' },
    h('code', {}, field.name),
    dirtyMark
  );
  const error = h('div', { id: errorId, class: 'nblaunch-field-error', role: 'alert' });
  const help = h('div', { id: helpId, class: 'nblaunch-help' }, field.help);
  const node = h(
    'div',
    { class: 'nblaunch-field', 'data-field': field.name },
    label,
    control.node,
    help,
    error
  );
  if (field.type === 'bool') {
    node.classList.add('nblaunch-field-bool');
  }
  return {
    node,
    refresh() {
      const message = model.errorFor(field.name);
      node.classList.toggle('nblaunch-mod-dirty', model.isDirty(field.name));
      node.classList.toggle('nblaunch-mod-invalid', message !== null);
      error.textContent = message ?? '';
      control.setInvalid(message !== null);
    }
  };
}

interface IControl {
  node: HTMLElement;
  setInvalid(invalid: boolean): void;
}

function createInput(
  model: ConfigModel,
  field: IFieldSchema,
  id: string,
  describedBy: string
): IControl {
  const common = { id, name: field.name, 'aria-describedby': describedBy };
  let input: HTMLInputElement | HTMLSelectElement;
  if (field.choices) {
    const select = h('select', { ...common, class: 'nblaunch-input' });
    if (field.nullable) {
      select.append(h('option', { value: '' }, '(default)'));
    }
    for (const choice of field.choices) {
      select.append(h('option', { value: choice }, choice));
    }
    select.value = model.text(field.name);
    select.addEventListener('change', () =>
      model.setValue(field.name, select.value === '' && field.nullable ? null : select.value)
    );
    input = select;
  } else if (field.type === 'bool') {
    const checkbox = h('input', { ...common, type: 'checkbox', class: 'nblaunch-checkbox' });
    checkbox.checked = model.value(field.name) === true;
    checkbox.addEventListener('change', () => model.setValue(field.name, checkbox.checked));
    input = checkbox;
  } else {
    const numeric = field.type === 'int' || field.type === 'float';
    const box = h('input', {
      ...common,
      type: 'text',
      class: 'nblaunch-input',
      inputmode: numeric ? (field.type === 'int' ? 'numeric' : 'decimal') : undefined,
      placeholder: field.nullable ? 'empty: automatic' : undefined,
      spellcheck: 'false'
    });
    box.value = model.text(field.name);
    box.addEventListener('input', () => model.setText(field.name, box.value));
    input = box;
  }
  return {
    node: input,
    setInvalid: invalid => input.setAttribute('aria-invalid', String(invalid))
  };
}

function createMappingEditor(model: ConfigModel, field: IFieldSchema, id: string): IControl {
  const node = h('div', { id, class: 'nblaunch-mapping', role: 'group', 'aria-label': field.name });
  const render = (focusLastRow = false) => {
    node.replaceChildren();
    const rows = model.rows(field.name);
    rows.forEach((row, index) => {
      const key = h('input', {
        type: 'text',
        class: 'nblaunch-input nblaunch-mapping-key',
        placeholder: 'name',
        'aria-label': `${field.name} name ${index + 1}`,
        spellcheck: 'false'
      });
      const value = h('input', {
        type: 'text',
        class: 'nblaunch-input nblaunch-mapping-value',
        placeholder: 'value',
        'aria-label': `${field.name} value ${index + 1}`,
        spellcheck: 'false'
      });
      key.value = row.key;
      value.value = row.value;
      const update = () => {
        const next = model.rows(field.name);
        next[index] = { key: key.value, value: value.value };
        model.setRows(field.name, next);
      };
      key.addEventListener('input', update);
      value.addEventListener('input', update);
      const remove = button(
        '×',
        () => {
          const next = model.rows(field.name);
          next.splice(index, 1);
          model.setRows(field.name, next);
          render();
        },
        { 'aria-label': `remove ${field.name} row ${index + 1}`, class: 'nblaunch-mapping-remove' }
      );
      node.append(h('div', { class: 'nblaunch-mapping-row' }, key, value, remove));
      if (focusLastRow && index === rows.length - 1) {
        requestAnimationFrame(() => key.focus());
      }
    });
    node.append(
      button(
        'Add',
        () => {
          model.setRows(field.name, [...model.rows(field.name), { key: '', value: '' }]);
          render(true);
        },
        { class: 'nblaunch-mapping-add', 'aria-label': `add a ${field.name} entry` }
      )
    );
  };
  render();
  return {
    node,
    setInvalid: invalid => node.classList.toggle('nblaunch-mod-invalid', invalid)
  };
}
