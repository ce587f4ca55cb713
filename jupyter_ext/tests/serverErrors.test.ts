import { errorFromResponse, EXTENSION_MISSING_MESSAGE } from '../src/serverErrors';

describe('errorFromResponse', () => {
  it('turns a 404 without our JSON into the "not enabled: run …" message', () => {
    const error = errorFromResponse(404, '<html><title>404: Not Found</title></html>');
    expect(error.extensionMissing).toBe(true);
    expect(error.message).toBe(EXTENSION_MISSING_MESSAGE);
    expect(error.message).toMatch(/not enabled: run `jupyter server extension enable jupyter_ext`/);
  });

  it("keeps the extension's own 404 (a missing Accelerate config) as it is", () => {
    const error = errorFromResponse(
      404,
      JSON.stringify({ message: 'no Accelerate config', fields: {} })
    );
    expect(error.extensionMissing).toBe(false);
    expect(error.message).toBe('no Accelerate config');
  });

  it('carries per-field messages and extra detail of a rejected save', () => {
    const body = { message: 'invalid', fields: { backend: 'bad' }, error: { line: 3 } };
    const error = errorFromResponse(400, JSON.stringify(body));
    expect(error.status).toBe(400);
    expect(error.fields).toEqual({ backend: 'bad' });
    expect(error.detail).toEqual({ error: { line: 3 } });
  });

  it('says which status came back when the body is not JSON', () => {
    expect(errorFromResponse(502, 'Bad Gateway').message).toBe('The nblaunch server answered 502.');
  });
});
