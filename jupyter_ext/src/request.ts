/**
 * The one place the panel calls the server: JSON to and from /nblaunch/…, with
 * jupyter_server's auth and XSRF handled by ServerConnection.
 *
 * Example: const config = await requestAPI<IConfigResponse>('config');
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { IRunsBackend } from './runsModel';
import { errorFromResponse, PanelServerError } from './serverErrors';
import {
  ILogChunk,
  IRunCurves,
  IRunDetail,
  IRunSummary,
  IStacksResponse,
  IStopResponse
} from './types';

export async function requestAPI<T>(
  endPoint: string,
  init: { method?: string; body?: unknown; params?: Record<string, string | number> } = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  let url = URLExt.join(settings.baseUrl, 'nblaunch', endPoint);
  if (init.params) {
    const query = Object.entries(init.params).map(([k, v]) => [k, String(v)]);
    url += `?${new URLSearchParams(query).toString()}`;
  }
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

/** The Runs view's calls: GET /nblaunch/runs, GET /nblaunch/runs/{id} (with its /series), POST /nblaunch/runs/{id}/stop,
 * POST /nblaunch/runs/{id}/stacks (a POST: it signals the ranks, so it carries the XSRF token). */
export const serverRunsBackend: IRunsBackend = {
  list: () => requestAPI<IRunSummary[]>('runs'),
  detail: async id => {
    const run = `runs/${encodeURIComponent(id)}`;
    const [detail, curves] = await Promise.all([
      requestAPI<IRunDetail>(run),
      requestAPI<IRunCurves>(`${run}/series`)
    ]);
    return { ...detail, curves };
  },
  stop: (id, place) =>
    requestAPI<IStopResponse>(`runs/${encodeURIComponent(id)}/stop`, {
      method: 'POST',
      body: { from: place }
    }),
  stacks: id =>
    requestAPI<IStacksResponse>(`runs/${encodeURIComponent(id)}/stacks`, { method: 'POST' })
};

/** GET /nblaunch/runs/{id}/ranks/{rank}/log with ?tail=N or ?offset=B. */
export function fetchLog(
  id: string,
  rank: number,
  query: { tail?: number; offset?: number }
): Promise<ILogChunk> {
  const params: Record<string, number> = {};
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined) {
      params[key] = value;
    }
  }
  return requestAPI<ILogChunk>(`runs/${encodeURIComponent(id)}/ranks/${rank}/log`, { params });
}
