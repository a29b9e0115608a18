// Calls to the server: the API key (kept for this tab, or on this browser when asked), the
// error envelope, and the event stream of a streamed reply.

const KEY = 'firstword-api-key';

/** The key the page sends: this tab's, else the remembered one; '' when none. */
export function apiKey() {
  return sessionStorage.getItem(KEY) ?? localStorage.getItem(KEY) ?? '';
}

/** Uses `key` from now on: for this tab only, or also remembered on this browser. */
export function setApiKey(key, remember) {
  sessionStorage.setItem(KEY, key);
  if (remember) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

/** A refused call: its HTTP status and the server's error envelope. */
export class ApiError extends Error {
  constructor(status, envelope) {
    const error = envelope?.error ?? {};
    super(error.message ?? `HTTP ${status}`);
    this.status = status;
    this.code = error.code ?? null;
    this.type = error.type ?? null;
  }
}

/** Called with the error of every 401, so the page can ask for a key. */
let unauthorized = () => {};
export function onUnauthorized(handler) {
  unauthorized = handler;
}

/**
 * Sends a request with the key (a JSON `body`, or a multipart `form`); returns the response, or
 * throws an {@link ApiError}.
 */
export async function call(path, { body, form, signal } = {}) {
  const headers = {};
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method: body === undefined && form === undefined ? 'GET' : 'POST', headers, signal };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  } else if (form !== undefined) {
    init.body = form;
  }
  const response = await fetch(path, init);
  if (!response.ok) {
    let envelope = null;
    try {
      envelope = await response.json();
    } catch {
      // Not the envelope: the status says enough.
    }
    const error = new ApiError(response.status, envelope);
    if (response.status === 401) unauthorized(error);
    throw error;
  }
  return response;
}

/** A GET or POST whose answer is JSON. */
export async function json(path, options) {
  return (await call(path, options)).json();
}

/** The `data:` payloads of an event stream, parsed, until `[DONE]`; an error event throws. */
export async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).trimStart())
        .join('\n');
      if (!data) continue;
      if (data === '[DONE]') return;
      const payload = JSON.parse(data);
      if (payload.error) throw new ApiError(200, payload);
      yield payload;
    }
  }
}
