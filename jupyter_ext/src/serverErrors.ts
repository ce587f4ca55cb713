/**
 * What a failed request to the nblaunch server extension means for the user.
 * Kept free of JupyterLab imports so it is unit-tested on its own.
 */

/** The command that enables the server extension, shown when its routes are missing. */
export const ENABLE_COMMAND = 'jupyter server extension enable jupyter_ext';

export const EXTENSION_MISSING_MESSAGE =
  'The nblaunch server extension is not enabled: run ' +
  `\`${ENABLE_COMMAND}\` and restart JupyterLab.`;

/** An answer other than 2xx from /nblaunch/…, with per-field messages when the server gave them. */
export class PanelServerError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly fields: Record<string, string> = {},
    readonly detail: Record<string, unknown> = {},
    readonly extensionMissing = false
  ) {
    super(message);
    this.name = 'PanelServerError';
  }
}

/**
 * Turn a failed response into a PanelServerError.
 *
 * Example: errorFromResponse(404, '<html>…') has the "not enabled: run …" message.
 */
export function errorFromResponse(status: number, bodyText: string): PanelServerError {
  let body: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(bodyText);
    if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) {
      body = parsed as Record<string, unknown>;
    }
  } catch {
    // Not JSON: a proxy's or tornado's HTML page; the status says enough.
  }
  // Our handlers always answer errors with "fields"; a 404 without it means no route matched.
  if (status === 404 && !('fields' in body)) {
    return new PanelServerError(EXTENSION_MISSING_MESSAGE, status, {}, {}, true);
  }
  const { message, fields, ...detail } = body;
  return new PanelServerError(
    typeof message === 'string' && message ? message : `The nblaunch server answered ${status}.`,
    status,
    (fields as Record<string, string>) ?? {},
    detail
  );
}
