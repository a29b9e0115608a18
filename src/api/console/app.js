// The console page: wires the settings, the conversation, voice mode, the charts, the cache
// view and the API key prompt together.

import { apiKey, call, json, onUnauthorized, setApiKey } from './api.js';
import { barChart, parseHistogram } from './charts.js';
import { Conversation, EXAMPLE_TOOLS } from './chat.js';
import { browserRecognition, canRecord, ServerRecognition, Speaker, Voice } from './voice.js';
import { ago, bytes, cacheInWords, ms } from './words.js';

const $ = (id) => document.getElementById(id);

/** A number field's value, or null when empty; throws when it is not a number. */
function number(id, integer = false) {
  const field = $(id);
  const text = field.value.trim();
  field.removeAttribute('aria-invalid');
  if (text === '') return null;
  const value = Number(text);
  if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    field.setAttribute('aria-invalid', 'true');
    throw new Error(`${field.labels[0]?.textContent ?? id}: not a number`);
  }
  return value;
}

/** What the settings say; throws (and marks the field) when a value is not valid. */
function settings() {
  const toolsField = $('tools');
  toolsField.removeAttribute('aria-invalid');
  let tools = [];
  if (toolsField.value.trim()) {
    try {
      tools = JSON.parse(toolsField.value);
    } catch (error) {
      toolsField.setAttribute('aria-invalid', 'true');
      throw new Error(`tools: not valid JSON (${error.message})`);
    }
    if (!Array.isArray(tools)) {
      toolsField.setAttribute('aria-invalid', 'true');
      throw new Error('tools: a JSON list is expected');
    }
  }
  return {
    system: $('system').value,
    tools,
    toolChoice: $('tool-choice').value,
    parallel: $('parallel').checked,
    temperature: number('temperature'),
    top_p: number('top-p'),
    max_tokens: number('max-tokens', true),
    seed: number('seed', true),
  };
}

function showError(error) {
  const box = $('error');
  if (!error) {
    box.hidden = true;
    box.textContent = '';
    return;
  }
  box.textContent = error.status ? `${error.status}: ${error.message}` : error.message;
  box.hidden = false;
}

// --- The API key ---------------------------------------------------------------------------

function askForKey(message) {
  $('key-message').textContent = message;
  $('key-input').value = '';
  $('key-remember').checked = localStorage.getItem('firstword-api-key') !== null;
  if (!$('key-dialog').open) $('key-dialog').showModal();
  $('key-input').focus();
}

onUnauthorized((error) => {
  const lead = apiKey() ? 'The server refused this key' : 'This server needs an API key';
  askForKey(`${lead}: ${error.message} (${error.status}).`);
});

function saveKey() {
  const key = $('key-input').value.trim();
  if (!key) return;
  setApiKey(key, $('key-remember').checked);
  $('key-dialog').close();
  showError(null);
  connect();
}

$('key-save').addEventListener('click', saveKey);
$('key-input').addEventListener('keydown', (event) => {
  if (event.key === 'Enter') {
    event.preventDefault();
    saveKey();
  }
});
$('key-cancel').addEventListener('click', () => $('key-dialog').close());
$('key-button').addEventListener('click', () => askForKey('The key is sent as "Authorization: Bearer KEY" with every call.'));

// --- The server ----------------------------------------------------------------------------

/** Waits for the model, then shows its name and the cache. */
async function connect() {
  try {
    const health = await fetch('/health');
    if (health.status === 503) {
      $('health').textContent = 'loading the model…';
      setTimeout(connect, 1000);
      return;
    }
    const models = await json('/v1/models');
    const model = models.data[0];
    $('model').textContent = `${model.id} · ${model.meta?.n_ctx ?? '?'} tokens of context · tool calls: ${model.meta?.tool_format ?? '?'}`;
    $('health').textContent = 'ready';
    offerServerRecognition(model.meta?.input_media ?? []);
    refreshCache();
  } catch (error) {
    $('health').textContent = 'not connected';
    if (error.status !== 401) showError(error);
  }
}

function table(headings, rows) {
  const t = document.createElement('table');
  const head = t.createTHead().insertRow();
  for (const heading of headings) {
    const th = document.createElement('th');
    th.textContent = heading;
    head.append(th);
  }
  const body = t.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const cell of row) tr.insertCell().textContent = cell;
  }
  return t;
}

function entriesTable(entries) {
  if (entries.length === 0) return Object.assign(document.createElement('p'), { textContent: 'no entries' });
  return table(
    ['kind', 'tokens', 'size', 'last used'],
    entries.map((e) => [e.kind, String(e.tokens), bytes(e.bytes), ago(e.last_used)]),
  );
}

function line(text) {
  return Object.assign(document.createElement('p'), { textContent: text });
}

/** `GET /cache` and the `/metrics` TTFT histogram. */
async function refreshCache() {
  let cache;
  try {
    cache = await json('/cache');
  } catch (error) {
    $('cache').textContent = `cache: ${error.message}`;
    return;
  }
  const view = $('cache');
  const ram = [
    line(`Live sequence: ${cache.live_tokens} tokens`),
    line(
      `RAM store: ${bytes(cache.used_bytes)} of ${bytes(cache.budget_bytes)}, ${cache.entries.length} entries` +
        (cache.checkpoint_every ? ` (a checkpoint every ${cache.checkpoint_every} tokens)` : ''),
    ),
    entriesTable(cache.entries),
  ];
  ram[2].classList.add('ram-entries');
  if (cache.disk) {
    const disk = cache.disk;
    ram.push(
      line(
        `Disk cache: ${bytes(disk.used_bytes)} of ${bytes(disk.budget_bytes)} in ${disk.dir}, ${bytes(disk.bytes_written)} written since start` +
          (disk.off ? ` — off: ${disk.off}` : '') +
          (disk.read_only ? ` — read only: ${disk.read_only}` : ''),
      ),
      entriesTable(disk.entries),
    );
  } else {
    ram.push(line('Disk cache: off'));
  }
  view.replaceChildren(...ram);
  try {
    const metrics = await (await call('/metrics')).text();
    const { buckets, count, sum } = parseHistogram(metrics, 'firstword_ttft_seconds');
    const label = (le) => (le === Infinity ? '>30s' : le < 1 ? `${Math.round(le * 1000)}` : `${le}s`);
    barChart(
      $('histogram'),
      buckets.map((b) => ({ label: label(b.le), value: b.count, title: `≤ ${label(b.le)}${b.le < 1 ? ' ms' : ''}: ${b.count} requests` })),
      { empty: 'no requests yet' },
    );
    $('histogram-summary').textContent = count ? `${count} requests, mean ${ms((sum / count) * 1000)} (buckets in ms up to 1 s)` : '';
  } catch (error) {
    $('histogram-summary').textContent = `metrics: ${error.message}`;
  }
}

$('cache-refresh').addEventListener('click', refreshCache);

// --- The conversation ----------------------------------------------------------------------

function drawTurns() {
  barChart(
    $('ttft-chart'),
    conversation.turns.map((turn, i) => {
      const cache = turn.timings?.cache;
      return {
        label: String(i + 1),
        value: turn.ttftMs ?? 0,
        kind: `src-${cache?.source ?? 'none'}`,
        title: `turn ${i + 1}: ${ms(turn.ttftMs)}, ${cache ? cacheInWords(cache) : ''}`,
      };
    }),
    { empty: 'no turns yet', format: (v) => ms(v) },
  );
}

const conversation = new Conversation({
  list: $('messages'),
  settings,
  onTurn: () => {
    drawTurns();
    refreshCache();
  },
  onBusy: (busy) => {
    $('send').disabled = busy;
    $('stop').disabled = !busy;
  },
  onError: showError,
});

const speaker = new Speaker();
const voice = new Voice({
  conversation,
  speaker,
  status: (text) => {
    $('voice-status').textContent = text;
  },
  onListening: (on) => {
    $('voice').setAttribute('aria-pressed', String(on));
    $('voice').textContent = on ? 'Voice: listening (click to stop)' : 'Voice';
  },
});

function sendTyped() {
  const input = $('input');
  const text = input.value.trim();
  if (!text || conversation.busy) return;
  showError(null);
  let sent;
  try {
    sent = conversation.send(text);
  } catch (error) {
    showError(error);
    return;
  }
  input.value = '';
  sent.then((turn) => {
    // A turn refused before any output is taken back: its text returns to the box.
    if (turn.takenBack && !input.value) input.value = text;
  });
}

$('composer').addEventListener('submit', (event) => {
  event.preventDefault();
  sendTyped();
});
$('input').addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendTyped();
  }
});
document.addEventListener('keydown', (event) => {
  if (event.key === 'Escape' && conversation.busy) {
    conversation.stop();
    speaker.silence();
  }
});
$('stop').addEventListener('click', () => {
  conversation.stop();
  speaker.silence();
});
$('new').addEventListener('click', () => {
  speaker.silence();
  conversation.clear();
  drawTurns();
  showError(null);
  $('input').focus();
});
$('example-tools').addEventListener('click', () => {
  $('tools').value = JSON.stringify(EXAMPLE_TOOLS, null, 2);
});

const PRIVACY = {
  browser:
    "Voice mode uses the browser's speech recognition: Chrome and Edge send the microphone's audio to Google's or Microsoft's servers to transcribe it.",
  server: 'Voice mode is transcribed by this server (/v1/audio/transcriptions): the microphone\'s audio goes to it only.',
};

/** Uses the recogniser `choice` names ('server' or 'browser') and says where the audio goes. */
function useRecogniser(choice) {
  voice.use(choice === 'server' ? ServerRecognition : browserRecognition());
  $('voice-privacy').textContent = PRIVACY[choice];
  $('voice').disabled = !voice.supported;
  if (voice.supported && !voice.on) $('voice-status').textContent = '';
}

/** When the model takes audio, offers (and picks) the server as the recogniser: nothing leaves it. */
function offerServerRecognition(inputMedia) {
  if (!inputMedia.includes('audio') || !canRecord()) return;
  $('recogniser').hidden = false;
  $('recogniser-label').hidden = false;
  $('recogniser').value = 'server';
  useRecogniser('server');
}

$('recogniser').addEventListener('change', () => useRecogniser($('recogniser').value));
$('voice').addEventListener('click', () => {
  if (voice.supported) voice.toggle();
});
if (!voice.supported) {
  $('voice').disabled = true;
  $('voice-status').textContent = 'This browser has no speech recognition: voice mode is off (typing works).';
}

drawTurns();
connect();
