/**
 * The labextension's side of the version check between nblaunch's three parts: what this page's
 * extension says when the server extension that answers it is another version (or too old to say).
 * Kept free of JupyterLab imports so it is unit-tested on its own.
 *
 * Example: versionMismatchMessage('0.2.0', { nblaunch: '0.1.0', ... }) tells what to upgrade.
 */

/** This labextension's version: package.json's (jupyter_ext/tests/versionCheck.test.ts fails if they differ). */
export const EXTENSION_VERSION = '0.1.0';

/** GET /nblaunch/version (jupyter_ext/version_check.py). */
export interface IServerVersions {
  nblaunch: string;
  run_format: number;
  /** the labextension this server serves, from its environment's share/jupyter/labextensions */
  labextension: string | null;
  upgrade: string;
}

/**
 * Why this page's extension and the server's differ, and what to run; null when they agree.
 * `server` is null for a server extension with no version route (one older than this check).
 */
export function versionMismatchMessage(
  ours: string,
  server: IServerVersions | null
): string | null {
  const upgrade = server?.upgrade ?? 'pip install -U nblaunch';
  if (server === null) {
    return (
      `nblaunch's server extension is older than this page's extension (${ours}): ` +
      `run \`${upgrade}\` in the environment that runs \`jupyter lab\`, then restart JupyterLab.`
    );
  }
  if (server.nblaunch === ours) {
    return null;
  }
  if (server.labextension === server.nblaunch) {
    return (
      `This page loaded nblaunch's extension ${ours}, but the server now runs nblaunch ` +
      `${server.nblaunch}: reload the page.`
    );
  }
  return (
    `nblaunch's extension in this page is ${ours} but its server extension is ${server.nblaunch}: ` +
    `run \`${upgrade}\` in the environment that runs \`jupyter lab\` and restart JupyterLab ` +
    '(`jupyter labextension list` and `jupyter server extension list` show which nblaunch each part is).'
  );
}
