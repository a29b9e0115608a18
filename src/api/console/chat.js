// The conversation: what is sent (system prompt, history, tools, sampling), each streamed
// reply with its figures, tool calls as cards that can be answered, and a reply cut short
// (stopped, or spoken over in voice mode).

import { call, events } from './api.js';
import { cacheInWords, turnFigures, ms } from './words.js';

/** The weather and timer tools, ready to try. */
export const EXAMPLE_TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The current weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
        required: ['city', 'unit'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'set_timer',
      description: 'Starts a timer',
      parameters: {
        type: 'object',
        properties: { minutes: { type: 'integer', minimum: 1 } },
        required: ['minutes'],
      },
    },
  },
];

/** A plausible result for a call, to answer it without typing one. */
export function cannedResult(name, args) {
  if (name === 'get_weather') {
    return { city: args.city ?? 'Paris', temperature: 18, unit: args.unit ?? 'celsius', condition: 'sunny' };
  }
  if (name === 'set_timer') return { ok: true, minutes: args.minutes ?? 1 };
  return { ok: true };
}

/** A call's arguments as an object, or null when they are not whole JSON (a call cut short). */
function parsedArguments(call) {
  try {
    const args = JSON.parse(call.function.arguments || '{}');
    return args !== null && typeof args === 'object' && !Array.isArray(args) ? args : null;
  } catch {
    return null;
  }
}

function element(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

/** One conversation, shown in `list`; `settings()` gives what the page's controls say. */
export class Conversation {
  constructor({ list, settings, onTurn, onBusy, onError }) {
    this.list = list;
    this.settings = settings;
    this.onTurn = onTurn;
    this.onBusy = onBusy;
    this.onError = onError;
    this.clear();
  }

  /** Forgets everything: a new conversation. */
  clear() {
    this.stop();
    /** The messages after the system prompt, as sent. */
    this.messages = [];
    /** Each finished reply: {ttftMs, timings, usage, voice}. */
    this.turns = [];
    /** The reply streaming now, if any. */
    this.current = null;
    this.list.replaceChildren();
  }

  /** Whether a reply is streaming. */
  get busy() {
    return this.current !== null;
  }

  /**
   * The request body for the conversation followed by `extra` messages; `afterTools`: the
   * reply to tool results (a `required` choice applies to a user's turn, not to that reply).
   * Throws when the tools are not valid JSON.
   */
  body(extra = [], afterTools = false) {
    const s = this.settings();
    const messages = [];
    if (s.system.trim()) messages.push({ role: 'system', content: s.system });
    messages.push(...this.messages, ...extra);
    const body = { messages };
    if (s.tools.length > 0) {
      body.tools = s.tools;
      body.tool_choice = afterTools && s.toolChoice === 'required' ? 'auto' : s.toolChoice;
    }
    if (s.tools.length > 0 && !s.parallel) body.parallel_tool_calls = false;
    for (const key of ['temperature', 'top_p', 'max_tokens', 'seed']) {
      if (s[key] !== null) body[key] = s[key];
    }
    return body;
  }

  /**
   * Sends the user's `text` and streams the reply (the promise ends with it); `voice` hooks
   * follow the reply's text. Throws at once when the settings are not valid.
   */
  send(text, voice = null) {
    const body = this.body([{ role: 'user', content: text }]);
    const asked = { entry: { role: 'user', content: text }, view: element('div', 'msg user', text) };
    this.messages.push(asked.entry);
    this.list.append(asked.view);
    return this.#reply(body, voice, asked);
  }

  /** Stops the streaming reply, keeping what arrived. */
  stop() {
    this.current?.controller.abort();
  }

  /**
   * Stops the streaming reply (if it still streams) and keeps of it only `kept` characters,
   * what was spoken: the next turn carries that, not what the user never heard.
   */
  cut(turn, kept) {
    const text = turn.text.slice(0, kept).trimEnd();
    turn.entry.content = text;
    delete turn.entry.tool_calls;
    turn.cutAt = text.length;
    turn.controller.abort();
    // The conversation can go on at once: the aborted stream ends on its own.
    if (this.current === turn) {
      this.current = null;
      this.onBusy(false, turn);
    }
    this.#showText(turn);
    turn.view.classList.add('interrupted');
  }

  /** Streams the reply to `body`; resolves to the turn once it ended. `asked`: the user's message it answers. */
  async #reply(body, voice, asked = null) {
    const view = element('div', 'msg assistant streaming');
    const textView = element('div', 'text');
    const figures = element('div', 'figures', 'waiting for the first token…');
    view.append(textView, figures);
    this.list.append(view);
    const entry = { role: 'assistant', content: '' };
    const turn = {
      controller: new AbortController(),
      entry,
      view,
      textView,
      figures,
      text: '',
      calls: [],
      cutAt: null,
      voice,
      asked,
      takenBack: false,
      started: performance.now(),
      ttftMs: null,
      timings: null,
      usage: null,
      finish: null,
    };
    this.current = turn;
    this.messages.push(entry);
    this.onBusy(true);
    view.scrollIntoView({ block: 'end' });
    try {
      body.stream = true;
      body.stream_options = { include_usage: true };
      const response = await call('/v1/chat/completions', { body, signal: turn.controller.signal });
      for await (const chunk of events(response)) this.#take(turn, chunk);
    } catch (error) {
      if (turn.controller.signal.aborted) {
        turn.finish ??= 'stopped';
      } else {
        turn.failed = error;
        this.onError(error);
      }
    }
    this.#finish(turn);
    return turn;
  }

  /** One chunk of the stream. */
  #take(turn, chunk) {
    const choice = chunk.choices?.[0];
    if (choice) {
      const delta = choice.delta ?? {};
      if (delta.content || delta.tool_calls) {
        if (turn.ttftMs === null) {
          turn.ttftMs = performance.now() - turn.started;
          turn.voice?.onFirstWord(performance.now());
        }
      }
      if (delta.content) {
        turn.text += delta.content;
        if (turn.cutAt === null) turn.entry.content = turn.text;
        this.#showText(turn);
        turn.voice?.onText(turn, false);
      }
      for (const piece of delta.tool_calls ?? []) {
        const call = (turn.calls[piece.index ?? 0] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (piece.id) call.id = piece.id;
        if (piece.function?.name) call.function.name += piece.function.name;
        if (piece.function?.arguments) call.function.arguments += piece.function.arguments;
      }
      if (choice.finish_reason) turn.finish = choice.finish_reason;
    }
    if (chunk.timings) turn.timings = chunk.timings;
    if (chunk.usage) turn.usage = chunk.usage;
  }

  #showText(turn) {
    if (turn.cutAt === null) {
      turn.textView.textContent = turn.text;
      return;
    }
    const unspoken = element('span', 'unspoken', turn.text.slice(turn.cutAt));
    unspoken.title = 'not spoken: left out of the conversation';
    turn.textView.replaceChildren(document.createTextNode(turn.text.slice(0, turn.cutAt)), unspoken);
  }

  #finish(turn) {
    if (this.current === turn) this.current = null;
    turn.view.classList.remove('streaming');
    const nothing = turn.text === '' && turn.calls.length === 0;
    if (turn.failed && nothing) {
      // Refused before any output: the turn is taken back, so it can be sent again.
      for (const taken of [turn.entry, turn.asked?.entry]) {
        const at = this.messages.indexOf(taken);
        if (at >= 0) this.messages.splice(at, 1);
      }
      turn.view.remove();
      turn.asked?.view.remove();
      turn.takenBack = true;
      this.onBusy(this.busy, turn);
      return;
    }
    if (turn.cutAt === null && turn.calls.length > 0) {
      // A call cut by max_tokens is not a call (the server leaves it out of its answer): its
      // card says so, and only the whole calls go back with the conversation.
      turn.whole = turn.calls.filter((call) => parsedArguments(call) !== null);
      turn.entry.content = turn.text || (turn.whole.length > 0 ? null : '');
      if (turn.whole.length > 0) turn.entry.tool_calls = turn.whole;
      this.#cards(turn);
    }
    turn.voice?.onText(turn, true);
    const record = { ttftMs: turn.ttftMs, timings: turn.timings, usage: turn.usage, voice: turn.voice?.endOfSpeechMs?.() ?? null };
    const lines = [turnFigures(record)];
    if (record.voice !== null) lines.push(`end of speech → first word ${ms(record.voice)}`);
    if (turn.finish && turn.finish !== 'stop' && turn.finish !== 'tool_calls') lines.push(`ended: ${turn.finish}`);
    turn.figures.textContent = lines.join(' · ');
    if (turn.timings?.cache) {
      const words = element('div', 'cache-words', `cache: ${cacheInWords(turn.timings.cache)}`);
      turn.figures.after(words);
    }
    if (turn.timings) {
      this.turns.push(record);
      this.onTurn(record);
    }
    this.onBusy(this.busy, turn);
  }

  /** The tool calls of `turn` as cards; once each has a result, the results are sent. */
  #cards(turn) {
    const box = element('div', 'cards');
    const pending = new Map();
    for (const call of turn.calls) {
      const args = parsedArguments(call);
      const card = element('div', 'card');
      card.setAttribute('role', 'group');
      card.setAttribute('aria-label', `tool call ${call.function.name}`);
      const head = element('div', 'card-head');
      head.append(element('span', 'fn', call.function.name), element('code', 'call-id', call.id));
      if (args === null) {
        card.classList.add('cut');
        const note = element('p', 'note', `cut off (${turn.finish}): not a whole call, left out of the conversation`);
        card.append(head, element('pre', 'args', call.function.arguments), note);
        box.append(card);
        continue;
      }
      const shown = JSON.stringify(args, null, 2);
      const result = element('textarea', 'result');
      result.rows = 2;
      result.setAttribute('aria-label', `result of ${call.function.name}`);
      result.placeholder = 'the result, as the tool would answer';
      const canned = element('button', 'canned', 'Canned result');
      canned.type = 'button';
      const answer = element('button', 'answer', 'Send result');
      answer.type = 'button';
      const row = element('div', 'row');
      row.append(canned, answer);
      card.append(head, element('pre', 'args', shown), result, row);
      box.append(card);
      pending.set(call.id, null);
      canned.addEventListener('click', () => {
        result.value = JSON.stringify(cannedResult(call.function.name, args));
        answer.focus();
      });
      answer.addEventListener('click', () => {
        if (!result.value.trim() || this.busy) return;
        pending.set(call.id, result.value);
        card.classList.add('answered');
        result.readOnly = true;
        canned.disabled = true;
        answer.disabled = true;
        if ([...pending.values()].every((value) => value !== null)) this.#sendResults(turn, pending);
      });
    }
    turn.view.insertBefore(box, turn.figures);
  }

  /** Sends the results of `turn`'s whole calls and streams the reply to them. */
  #sendResults(turn, results) {
    if (this.messages[this.messages.length - 1] !== turn.entry) {
      this.onError(new Error('the conversation went on: these calls can no longer be answered'));
      return;
    }
    const answers = turn.whole.map((call) => ({ role: 'tool', tool_call_id: call.id, content: results.get(call.id) }));
    let body;
    try {
      body = this.body(answers, true);
    } catch (error) {
      this.onError(error);
      return;
    }
    this.messages.push(...answers);
    this.#reply(body, null);
  }
}
