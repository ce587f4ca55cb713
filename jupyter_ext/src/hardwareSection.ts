/**
 * The "Hardware" section: what the server detected (CPUs, RAM, torch, CUDA, GPUs), with
 * one checkbox per GPU that sets gpu_ids.
 */

import { h } from './dom';
import { ConfigModel } from './model';
import { IHardware } from './types';

export class HardwareSection {
  readonly node = h(
    'section',
    { class: 'nblaunch-section nblaunch-hardware', 'aria-labelledby': 'nblaunch-hardware-title' },
    h('h3', { id: 'nblaunch-hardware-title', class: 'nblaunch-section-title' }, 'Hardware'),
    h('p', { class: 'nblaunch-help' }, 'Detecting hardware…')
  );

  constructor(private readonly _model: ConfigModel) {}

  /** Show detected hardware, or why it could not be detected. */
  show(hardware: IHardware | null, problem?: string): void {
    this._hardware = hardware;
    const title = this.node.firstElementChild as HTMLElement;
    this.node.replaceChildren(title);
    if (!hardware) {
      this.node.append(h('p', { class: 'nblaunch-field-error' }, problem ?? 'Hardware unknown.'));
      return;
    }
    const facts = [
      `${hardware.cpu_count ?? '?'} CPU cores`,
      hardware.ram_bytes ? `${gib(hardware.ram_bytes)} RAM` : null,
      hardware.torch_version ? `torch ${hardware.torch_version}` : 'torch not found',
      hardware.cuda_version ? `CUDA ${hardware.cuda_version}` : 'no CUDA build'
    ].filter(Boolean);
    this.node.append(h('p', { class: 'nblaunch-hardware-facts' }, facts.join(' · ')));
    if (hardware.error) {
      this.node.append(h('p', { class: 'nblaunch-help' }, `Probe: ${hardware.error}`));
    }
    if (hardware.gpus.length === 0) {
      this.node.append(
        h(
          'p',
          { class: 'nblaunch-help' },
          'No CUDA GPUs: workers run on CPU with the gloo backend.'
        )
      );
      return;
    }
    const list = h(
      'fieldset',
      { class: 'nblaunch-gpus' },
      h('legend', {}, 'GPUs to use (gpu_ids)')
    );
    this._checkboxes = hardware.gpus.map(gpu => {
      const id = `nblaunch-gpu-${gpu.index}`;
      const box = h('input', { type: 'checkbox', id, 'data-gpu': String(gpu.index) });
      box.addEventListener('change', () =>
        this._model.setGpuSelected(gpu.index, box.checked, this._indices())
      );
      list.append(
        h(
          'div',
          { class: 'nblaunch-gpu' },
          box,
          h('label', { for: id }, `GPU ${gpu.index}: ${gpu.name} (${gib(gpu.memory_bytes)})`)
        )
      );
      return box;
    });
    this.node.append(list);
    this.refresh();
  }

  /** Tick the GPUs that gpu_ids selects. */
  refresh(): void {
    const chosen = this._model.gpuSelection(this._indices());
    for (const box of this._checkboxes) {
      box.checked = chosen.has(Number(box.dataset.gpu));
    }
  }

  private _indices(): number[] {
    return this._hardware?.gpus.map(gpu => gpu.index) ?? [];
  }

  private _hardware: IHardware | null = null;
  private _checkboxes: HTMLInputElement[] = [];
}

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
}
