// Voice mode: the browser's speech recognition sends each partial transcript to `/v1/prefill`
// and the final one as the request; the reply is spoken sentence by sentence as it streams;
// speaking over it stops the speech and the reply is cut to what was heard (barge-in).

import { json } from './api.js';
import { ms } from './words.js';

/** Where a sentence ends: its punctuation (and closing quotes) before a space, or a line break. */
const SENTENCE_END = /[.!?…]+["'”’)\]]*\s+|\n+/g;

/** The length of the word starting at `at` in `text`. */
function wordLength(text, at) {
  const match = /^\S+/.exec(text.slice(at));
  return match ? match[0].length : 0;
}

/** Speaks a reply sentence by sentence and knows how much of it was heard. */
export class Speaker {
  constructor(synth = window.speechSynthesis) {
    this.synth = synth;
    this.turn = null;
    this.generation = 0;
    this.pending = 0;
  }

  /** Whether the browser can speak. */
  get available() {
    return Boolean(this.synth) && typeof window.SpeechSynthesisUtterance === 'function';
  }

  /** Whether something is being said or waits to be. */
  get speaking() {
    return this.pending > 0;
  }

  /** Speaks what `turn`'s text holds of complete sentences not yet spoken; with `done`, all the rest. */
  follow(turn, done) {
    if (!this.available || turn.cutAt !== null) return;
    if (this.turn !== turn) {
      this.turn = turn;
      this.generation += 1;
      this.queued = 0;
      this.heard = 0;
    }
    const text = turn.text;
    SENTENCE_END.lastIndex = this.queued;
    let match;
    while ((match = SENTENCE_END.exec(text)) !== null) {
      const end = match.index + match[0].length;
      this.#say(text, this.queued, end);
      this.queued = end;
    }
    if (done && this.queued < text.length) {
      this.#say(text, this.queued, text.length);
      this.queued = text.length;
    }
  }

  #say(text, start, end) {
    const raw = text.slice(start, end);
    const sentence = raw.trim();
    if (!sentence) return;
    const offset = start + (raw.length - raw.trimStart().length);
    const generation = this.generation;
    const current = () => generation === this.generation;
    const utterance = new window.SpeechSynthesisUtterance(sentence);
    utterance.onboundary = (event) => {
      if (!current()) return;
      const length = event.charLength || wordLength(sentence, event.charIndex);
      this.heard = Math.max(this.heard, offset + event.charIndex + length);
    };
    utterance.onend = () => {
      if (!current()) return;
      this.heard = Math.max(this.heard, offset + sentence.length);
      this.pending = Math.max(0, this.pending - 1);
    };
    utterance.onerror = () => {
      if (current()) this.pending = Math.max(0, this.pending - 1);
    };
    this.pending += 1;
    this.synth.speak(utterance);
  }

  /** Stops speaking; returns how many characters of the reply were heard. */
  silence() {
    const heard = this.heard ?? 0;
    this.generation += 1;
    this.turn = null;
    this.pending = 0;
    if (this.available) this.synth.cancel();
    return heard;
  }
}

/** The browser's speech recognition, or null where there is none. */
function recognitionClass() {
  return window.SpeechRecognition ?? window.webkitSpeechRecognition ?? null;
}

/** Voice mode over `conversation`: `status(text)` shows where it stands. */
export class Voice {
  constructor({ conversation, speaker, status, onListening }) {
    this.conversation = conversation;
    this.speaker = speaker;
    this.status = status;
    this.onListening = onListening;
    this.on = false;
    this.replying = null;
    this.lastPartial = '';
  }

  /** Whether the browser has speech recognition. */
  get supported() {
    return recognitionClass() !== null;
  }

  /** Turns listening on or off. */
  toggle() {
    if (this.on) this.stop();
    else this.start();
  }

  start() {
    const Recognition = recognitionClass();
    if (!Recognition || this.on) return;
    const recognition = new Recognition();
    recognition.continuous = true;
    recognition.interimResults = true;
    recognition.lang = navigator.language || 'en-US';
    recognition.onresult = (event) => this.#results(event);
    recognition.onerror = (event) => this.status(`speech recognition: ${event.error ?? 'failed'}`);
    // Recognition ends by itself after a silence: listen again while voice mode is on.
    recognition.onend = () => {
      if (this.on && this.recognition === recognition) {
        try {
          recognition.start();
        } catch {
          // Already starting.
        }
      }
    };
    this.recognition = recognition;
    this.on = true;
    recognition.start();
    this.onListening(true);
    this.status(this.speaker.available ? 'listening…' : 'listening… (this browser cannot speak: replies are shown only)');
  }

  stop() {
    if (!this.on) return;
    this.on = false;
    this.recognition?.stop();
    this.recognition = null;
    this.speaker.silence();
    this.onListening(false);
    this.status('voice mode off');
  }

  #results(event) {
    let partial = '';
    for (let i = event.resultIndex; i < event.results.length; i += 1) {
      const result = event.results[i];
      const text = result[0].transcript.trim();
      if (!text) continue;
      if (result.isFinal) {
        partial = '';
        this.#final(text);
      } else {
        partial = partial ? `${partial} ${text}` : text;
      }
    }
    if (partial) this.#partial(partial);
  }

  /** The user speaks over the reply: it stops, and the conversation keeps what was heard. */
  #bargeIn() {
    const turn = this.replying;
    if (!turn) return;
    this.replying = null;
    const streaming = this.conversation.current === turn;
    if (!streaming && !this.speaker.speaking) return;
    const heard = this.speaker.available ? this.speaker.silence() : turn.text.length;
    this.conversation.cut(turn, heard);
    this.status(`interrupted: the reply was cut to the ${turn.cutAt} characters heard`);
  }

  /** A partial transcript: prefilled, so the request at the end of speech evaluates only what is new. */
  #partial(text) {
    this.#bargeIn();
    if (text === this.lastPartial || this.conversation.busy) return;
    this.lastPartial = text;
    let body;
    try {
      body = this.conversation.body([{ role: 'user', content: text }]);
    } catch (error) {
      this.status(error.message);
      return;
    }
    this.status(`“${text}”`);
    json('/v1/prefill', { body })
      .then((answer) => {
        if (answer.superseded || this.lastPartial !== text) return;
        const ahead = answer.pregenerated_tokens ? `, ${answer.pregenerated_tokens} generated ahead` : '';
        this.status(`“${text}” prefilled: ${answer.prefilled_tokens} evaluated, ${answer.cached_tokens} reused${ahead}`);
      })
      .catch((error) => this.status(`prefill refused: ${error.message}`));
  }

  /** The final transcript: the request. */
  #final(text) {
    this.#bargeIn();
    this.lastPartial = '';
    if (this.conversation.busy) this.conversation.stop();
    const endOfSpeech = performance.now();
    let firstWord = null;
    const hooks = {
      onFirstWord: (at) => {
        firstWord = at;
        this.status(`end of speech → first word ${ms(at - endOfSpeech)}`);
      },
      onText: (turn, done) => this.speaker.follow(turn, done),
      endOfSpeechMs: () => (firstWord === null ? null : firstWord - endOfSpeech),
    };
    let sent;
    try {
      sent = this.conversation.send(text, hooks);
    } catch (error) {
      this.status(error.message);
      return;
    }
    this.replying = this.conversation.current;
    return sent;
  }
}
