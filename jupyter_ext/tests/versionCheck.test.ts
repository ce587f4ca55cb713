import { readFileSync } from 'fs';
import { join } from 'path';

import { EXTENSION_VERSION, IServerVersions, versionMismatchMessage } from '../src/versionCheck';

const server = (nblaunch: string, labextension: string | null): IServerVersions => ({
  nblaunch,
  labextension,
  run_format: 1,
  upgrade: 'pip install -U nblaunch'
});

describe('versionMismatchMessage', () => {
  it("knows its own version: package.json's", () => {
    const pkg = JSON.parse(readFileSync(join(__dirname, '..', '..', 'package.json'), 'utf8'));
    expect(EXTENSION_VERSION).toBe(pkg.version);
  });

  it('says nothing when the server extension is the same version', () => {
    expect(versionMismatchMessage('0.1.0', server('0.1.0', '0.1.0'))).toBeNull();
  });

  it('tells to upgrade the server when it is another version than the served extension', () => {
    const message = versionMismatchMessage('0.2.0', server('0.1.0', '0.2.0'));
    expect(message).toContain('extension in this page is 0.2.0 but its server extension is 0.1.0');
    expect(message).toContain(
      'run `pip install -U nblaunch` in the environment that runs `jupyter lab`'
    );
  });

  it('tells to reload when the server serves a newer extension than the page loaded', () => {
    expect(versionMismatchMessage('0.1.0', server('0.2.0', '0.2.0'))).toBe(
      "This page loaded nblaunch's extension 0.1.0, but the server now runs nblaunch 0.2.0: reload the page."
    );
  });

  it('names a server extension too old to have a version route', () => {
    expect(versionMismatchMessage('0.1.0', null)).toContain(
      "nblaunch's server extension is older than this page's extension (0.1.0)"
    );
  });
});
