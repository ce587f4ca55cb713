/**
 * The "Distributed launch" side panel: the compact Runs list (each opens its dashboard tab),
 * then the config: loads it and the hardware from the server, shows the form, and saves,
 * reverts, imports and exports on the user's request. Save, Revert and their messages sit in a
 * bar under the form that stays in view; a message goes once what it asks for is done.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { createAccelerateSection } from './accelerateSection';
import { ConfigForm } from './configForm';
import { button, h } from './dom';
import { HardwareSection } from './hardwareSection';
import { ConfigModel } from './model';
import { requestAPI, serverRunsBackend } from './request';
import { RunsModel, RunsPoller } from './runsModel';
import { OpenDashboard, RunsSection } from './runsView';
import { PanelServerError } from './serverErrors';
import { IConfigResponse, IExportResponse, IHardware, IImportResponse } from './types';
import { EXTENSION_VERSION, IServerVersions, versionMismatchMessage } from './versionCheck';

type Message = Parameters<Widget['processMessage']>[0];

/** The panel's DOM id, stable for tests and for `app.shell.activateById`. */
export const PANEL_ID = 'nblaunch-panel';

const FIX_FIRST = 'Fix the fields marked in red first.';

export class LaunchPanel extends Widget {
  readonly model = new ConfigModel();
  readonly runs = new RunsModel(serverRunsBackend);
  /** Refreshes the runs while one is live (or a cell was just started) and the panel or a dashboard is shown. */
  readonly poller = new RunsPoller(this.runs);

  constructor(
    icon: LabIcon,
    insertCell: () => void,
    insertExport: () => void,
    openDashboard: OpenDashboard
  ) {
    super();
    this._runsSection = new RunsSection(this.runs, openDashboard, () => void this.poller.start());
    this.id = PANEL_ID;
    this.addClass('nblaunch-panel');
    this.title.icon = icon;
    this.title.caption = 'Distributed launch';
    this._insertButton = button('Insert %%distributed cell', insertCell, {
      class: 'nblaunch-insert',
      title: 'Insert a %%distributed cell below the current cell of the active notebook'
    });
    this._exportButton = button('Insert %distributed_export cell', insertExport, {
      class: 'nblaunch-insert-export',
      title:
        'Insert a cell that writes the last %%distributed cell as a script, with its torchrun and accelerate launch commands'
    });
    this.node.append(
      h('h2', { class: 'nblaunch-title' }, 'Distributed launch'),
      h('div', { class: 'nblaunch-actions' }, this._insertButton, this._exportButton),
      this._runsSection.node,
      h(
        'section',
        { class: 'nblaunch-section nblaunch-config', 'aria-labelledby': 'nblaunch-config-title' },
        h('h3', { id: 'nblaunch-config-title', class: 'nblaunch-section-title' }, 'Launch config'),
        this._pathLine,
        this._versionNote,
        this._banner,
        this._body,
        h(
          'div',
          { class: 'nblaunch-save-bar' },
          h(
            'div',
            { class: 'nblaunch-actions' },
            this._saveButton,
            this._revertButton,
            this._dirtyNote
          ),
          this._status
        )
      )
    );
    this.node.addEventListener('keydown', event => {
      if ((event.ctrlKey || event.metaKey) && event.key === 's') {
        event.preventDefault();
        event.stopPropagation();
        void this.save();
      }
    });
    this.model.onChange(() => this._refresh());
  }

  /** Watch runs while the panel or a run's dashboard is shown; otherwise nothing polls. */
  watchRuns(): void {
    if (this.isVisible || this.runs.watched.size > 0) {
      void this.poller.start();
    } else {
      this.poller.stop();
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.poller.start();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    if (this.runs.watched.size === 0) {
      this.poller.stop(); // an open dashboard keeps the runs polled
    }
  }

  /** Fetch config and hardware; the form shows as soon as the config arrives. */
  async load(): Promise<void> {
    const hardware = this._loadHardware();
    try {
      this.model.load(await requestAPI<IConfigResponse>('config'));
      this._drawForm();
      this._say(this.model.info?.saved ? 'Saved.' : '', () => this.model.isDirty());
    } catch (error) {
      this._fail(error);
    }
    await Promise.all([hardware, this._checkVersions()]);
  }

  /** Say what to upgrade when the server extension is another nblaunch than this page's extension. */
  private async _checkVersions(): Promise<void> {
    if (!this.model.loaded) {
      return; // the server extension did not answer: _fail said why
    }
    let server: IServerVersions | null = null;
    try {
      server = await requestAPI<IServerVersions>('version');
    } catch (error) {
      if (!(error instanceof PanelServerError && error.extensionMissing)) {
        return; // the config answered, so the server is there; nothing to say about versions
      }
    }
    const message = versionMismatchMessage(EXTENSION_VERSION, server);
    this._versionNote.replaceChildren(...(message ? [h('p', {}, message)] : []));
    this._versionNote.hidden = !message;
  }

  async save(overwrite = false): Promise<void> {
    if (!this.model.loaded || this.model.hasErrors) {
      this._say(FIX_FIRST, () => !this.model.hasErrors);
      return;
    }
    this._say('Saving…');
    try {
      const response = await requestAPI<IConfigResponse>('config', {
        method: 'PUT',
        body: { values: this.model.payload(), overwrite }
      });
      this.model.load(response);
      this._drawForm();
      this._say(`Saved to ${response.display_path}.`, () => this.model.isDirty());
    } catch (error) {
      if (error instanceof PanelServerError && error.status === 409 && !overwrite) {
        this._showFileError(error.message);
        this._say('Not saved: the file on disk could not be read.');
      } else if (error instanceof PanelServerError && Object.keys(error.fields).length) {
        this.model.setServerErrors(error.fields);
        this._say(`Not saved: ${error.message}`, () => !this.model.hasErrors);
      } else {
        this._fail(error);
      }
    }
  }

  revert(): void {
    this.model.revert();
    this._drawForm();
    this._say('Reverted to the saved file.', () => this.model.isDirty());
  }

  async importFrom(path: string): Promise<void> {
    try {
      const response = await requestAPI<IImportResponse>('accelerate/import', {
        method: 'POST',
        body: path ? { path } : {}
      });
      this.model.applyImport(response.values);
      this._drawForm();
      const count = Object.keys(response.values).length;
      const notes = response.warnings.length ? ` (${response.warnings.join('; ')})` : '';
      this._say(
        `Imported ${count} settings from ${response.source}; Save to keep them.${notes}`,
        () => !this.model.isDirty()
      );
    } catch (error) {
      this._reportError(error);
    }
  }

  /** Write an Accelerate config file; returns the message the Accelerate section shows beside Export. */
  async exportTo(path: string): Promise<string> {
    if (this.model.hasErrors) {
      return FIX_FIRST;
    }
    try {
      const response = await requestAPI<IExportResponse>('accelerate/export', {
        method: 'POST',
        body: { path, values: this.model.payload() }
      });
      return `Wrote ${response.display_path}. Use it with: ${response.command}`;
    } catch (error) {
      return error instanceof Error ? error.message : String(error);
    }
  }

  private async _loadHardware(): Promise<void> {
    try {
      this._hardware.show(await requestAPI<IHardware>('hardware'));
    } catch (error) {
      const missing = error instanceof PanelServerError && error.extensionMissing;
      this._hardware.show(null, missing ? '' : `Hardware detection failed: ${String(error)}`);
    }
  }

  private _drawForm(): void {
    const info = this.model.info;
    if (!info) {
      return;
    }
    this._pathLine.replaceChildren(
      'Config file: ',
      h('code', { title: info.path }, info.display_path),
      info.exists ? '' : h('span', { class: 'nblaunch-nowrap' }, ' (created on first save)')
    );
    this._banner.replaceChildren();
    if (info.error) {
      const where = info.error.line ? ` (line ${info.error.line})` : '';
      this._showFileError(`${info.error.message}${where}`, info.error.key === null);
    }
    if (info.warnings.length) {
      this._banner.append(
        h('ul', { class: 'nblaunch-warnings' }, ...info.warnings.map(w => h('li', {}, w)))
      );
    }
    this._form.render();
    this._body.replaceChildren(
      this._hardware.node,
      this._form.node,
      createAccelerateSection({
        importFrom: path => this.importFrom(path),
        exportTo: path => this.exportTo(path)
      })
    );
    this._refresh();
  }

  private _showFileError(message: string, offerOverwrite = true): void {
    const box = h('div', { class: 'nblaunch-error-box', role: 'alert' }, h('p', {}, message));
    if (offerOverwrite) {
      box.append(button('Replace the file with this form', () => void this._confirmOverwrite()));
    }
    this._banner.prepend(box);
  }

  private async _confirmOverwrite(): Promise<void> {
    const result = await showDialog({
      title: 'Replace the config file?',
      body: `${this.model.info?.path} could not be read. Saving replaces its content with this form.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Replace' })]
    });
    if (result.button.accept) {
      await this.save(true);
    }
  }

  private _refresh(): void {
    const dirty = this.model.isDirty();
    this._form.refresh();
    this._hardware.refresh();
    this._saveButton.disabled = !this.model.loaded;
    this._revertButton.disabled = !dirty;
    this._dirtyNote.hidden = !dirty;
    this.title.className = dirty ? 'nblaunch-mod-dirty' : '';
    if (this._resolved?.()) {
      this._say('');
    }
  }

  private _fail(error: unknown): void {
    const missing = error instanceof PanelServerError && error.extensionMissing;
    this._banner.replaceChildren(
      h(
        'div',
        { class: 'nblaunch-error-box', role: 'alert' },
        h('p', {}, error instanceof Error ? error.message : String(error))
      )
    );
    if (missing) {
      this._body.replaceChildren();
    }
    if (!this.model.loaded) {
      this._pathLine.textContent = 'The launch config could not be loaded.';
    }
    this._say('');
  }

  private _reportError(error: unknown): void {
    this._say(error instanceof Error ? error.message : String(error));
  }

  /** Show message under Save/Revert until resolved() says what it asks for is done (checked on each change). */
  private _say(message: string, resolved: (() => boolean) | null = null): void {
    this._status.textContent = message;
    this._resolved = message ? resolved : null;
  }

  private _resolved: (() => boolean) | null = null;
  private _pathLine = h('div', { class: 'nblaunch-path' }, 'Loading the launch config…');
  private _saveButton = button('Save', () => void this.save(), {
    class: 'jp-mod-accept nblaunch-save',
    title: 'Save to the config file (Ctrl+S)'
  });
  private _revertButton = button('Revert', () => this.revert(), { class: 'nblaunch-revert' });
  private _dirtyNote = h(
    'span',
    { class: 'nblaunch-dirty-note', hidden: true },
    '● Unsaved changes'
  );
  private _insertButton: HTMLButtonElement;
  private _exportButton: HTMLButtonElement;
  private _status = h('div', { class: 'nblaunch-status', role: 'status', 'aria-live': 'polite' });
  private _banner = h('div', { class: 'nblaunch-banner' });
  private _versionNote = h('div', {
    class: 'nblaunch-error-box nblaunch-version-mismatch',
    role: 'alert',
    hidden: true
  });
  private _body = h('div', { class: 'nblaunch-body' });
  private _form = new ConfigForm(this.model);
  private _runsSection: RunsSection;
  private _hardware = new HardwareSection(this.model);
}
