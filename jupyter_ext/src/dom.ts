/** A tiny element builder for the panel's views. */

export type Child = Node | string | null | undefined | false;

/**
 * Create an element with attributes and children.
 *
 * Example: h('button', { class: 'jp-Button', type: 'button' }, 'Save')
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string | boolean | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === true) {
      element.setAttribute(name, '');
    } else if (typeof value === 'string') {
      element.setAttribute(name, value);
    }
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      element.append(child);
    }
  }
  return element;
}

/** A JupyterLab-styled button that calls onClick. */
export function button(
  label: string,
  onClick: () => void,
  attributes: Record<string, string | boolean | undefined> = {}
): HTMLButtonElement {
  const classes = ['jp-Button', 'nblaunch-button', attributes.class ?? ''].join(' ').trim();
  const element = h('button', { type: 'button', ...attributes, class: classes }, label);
  element.addEventListener('click', onClick);
  return element;
}
