/**
 * The one place the panel calls the server: JSON to and from /nblaunch/…, with
 * jupyter_server's auth and XSRF handled by ServerConnection.
 *
 * Example: const config = await requestAPI<IConfigResponse>('config');
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { errorFromResponse, PanelServerError } from './serverErrors';

export async function requestAPI<T>(
  endPoint: string,
  init: { method?: string; body?: unknown } = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'nblaunch', endPoint);
  const request: RequestInit = { method: init.method ?? 'GET' };
  if (init.body !== undefined) {
    request.body = JSON.stringify(init.body);
    request.headers = { 'Content-Type': 'application/json' };
  }
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, request, settings);
  } catch (error) {
    throw new PanelServerError(`Cannot reach the Jupyter server: ${String(error)}`, 0);
  }
  const text = await response.text();
  if (!response.ok) {
    throw errorFromResponse(response.status, text);
  }
  return JSON.parse(text) as T;
}
