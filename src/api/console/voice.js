// Voice mode: the browser's speech recognition (or the server's, `ServerRecognition`) sends each
// partial transcript to `/v1/prefill` and the final one as the request; the reply is spoken sentence by sentence as it streams;
// speaking over it stops the speech and the reply is cut to what was heard (barge-in).

import { call, json } from './api.js';
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
export function browserRecognition() {
  return window.SpeechRecognition ?? window.webkitSpeechRecognition ?? null;
}

/** Whether the page can record the microphone itself (for {@link ServerRecognition}). */
export function canRecord() {
  return Boolean(navigator.mediaDevices?.getUserMedia) && typeof window.AudioContext === 'function';
}

/** A frame louder than this (RMS of samples in [-1, 1]) is speech. */
const SPEECH_RMS = 0.02;
/** This long under it ends an utterance. */
const END_OF_SPEECH_MS = 700;
/** An utterance is sent at this length even if the speaker goes on. */
const LONGEST_UTTERANCE_MS = 30_000;
/** Audio kept from before the first loud frame, so the first syllable is not cut. */
const PRE_ROLL_MS = 300;
/** The sample rate of the clips sent (speech models take 16 kHz). */
const CLIP_RATE = 16_000;

/** `samples` (mono, at `rate`) as a 16-bit PCM WAV at {@link CLIP_RATE}. */
export function wavClip(samples, rate) {
  const step = rate / CLIP_RATE;
  const count = Math.floor(samples.length / step);
  const bytes = new DataView(new ArrayBuffer(44 + count * 2));
  const text = (at, value) => [...value].forEach((c, i) => bytes.setUint8(at + i, c.charCodeAt(0)));
  text(0, 'RIFF');
  bytes.setUint32(4, 36 + count * 2, true);
  text(8, 'WAVEfmt ');
  bytes.setUint32(16, 16, true);
  bytes.setUint16(20, 1, true); // PCM
  bytes.setUint16(22, 1, true); // mono
  bytes.setUint32(24, CLIP_RATE, true);
  bytes.setUint32(28, CLIP_RATE * 2, true);
  bytes.setUint16(32, 2, true);
  bytes.setUint16(34, 16, true);
  text(36, 'data');
  bytes.setUint32(40, count * 2, true);
  for (let i = 0; i < count; i += 1) {
    // The mean of the samples the output sample stands for (a box filter against aliasing).
    const from = Math.floor(i * step);
    const to = Math.max(from + 1, Math.floor((i + 1) * step));
    let sum = 0;
    for (let j = from; j < to; j += 1) sum += samples[j];
    const value = Math.max(-1, Math.min(1, sum / (to - from)));
    bytes.setInt16(44 + i * 2, Math.round(value * 32767), true);
  }
  return new Blob([bytes], { type: 'audio/wav' });
}

/**
 * Speech recognition by the server itself: the page records the microphone (Web Audio), cuts
 * an utterance where the sound stays under {@link SPEECH_RMS} for {@link END_OF_SPEECH_MS}
 * (energy-based end of speech), and posts it as a WAV to `/v1/audio/transcriptions`; the
 * transcript comes back as one final result. The audio goes to this server only. It has the
 * part of `SpeechRecognition`'s interface that {@link Voice} uses; there are no interim
 * results, so nothing is prefilled while the user speaks.
 */
export class ServerRecognition {
  constructor() {
    this.onresult = null;
    this.onerror = null;
    this.onend = null;
    this.results = [];
  }

  start() {
    if (this.stream !== undefined) return;
    this.stream = null;
    navigator.mediaDevices
      .getUserMedia({ audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true } })
      .then((stream) => {
        if (this.stream === undefined) {
          for (const track of stream.getTracks()) track.stop();
          return;
        }
        this.stream = stream;
        this.audio = new AudioContext();
        const source = this.audio.createMediaStreamSource(stream);
        // A ScriptProcessor needs no module file (the page's policy allows only its own scripts).
        const processor = this.audio.createScriptProcessor(4096, 1, 1);
        processor.onaudioprocess = (event) => this.#frame(event.inputBuffer.getChannelData(0));
        this.processor = processor;
        source.connect(processor);
        processor.connect(this.audio.destination);
        this.#reset();
      })
      .catch((error) => this.onerror?.({ error: `microphone: ${error.message ?? error.name}` }));
  }

  stop() {
    // Frames already queued are dropped, not handed to a closed context.
    if (this.processor) this.processor.onaudioprocess = null;
    this.processor = null;
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.audio?.close();
    this.stream = undefined;
    this.audio = null;
    setTimeout(() => this.onend?.({}), 0);
  }

  abort() {
    this.stop();
  }

  #reset() {
    this.frames = [];
    this.speaking = false;
    this.quietMs = 0;
  }

  #frame(input) {
    // A frame the audio thread delivered after stop(): its context is gone.
    if (!this.audio) return;
    const rate = this.audio.sampleRate;
    const frame = Float32Array.from(input);
    const frameMs = (frame.length / rate) * 1000;
    let energy = 0;
    for (const sample of frame) energy += sample * sample;
    const loud = Math.sqrt(energy / frame.length) >= SPEECH_RMS;
    this.frames.push(frame);
    if (!this.speaking) {
      // Silence before speech: only the pre-roll is kept.
      while (this.frames.length > 1 && (this.frames.length - 1) * frameMs > PRE_ROLL_MS) this.frames.shift();
      if (loud) this.speaking = true;
      return;
    }
    this.quietMs = loud ? 0 : this.quietMs + frameMs;
    const lengthMs = this.frames.length * frameMs;
    if (this.quietMs >= END_OF_SPEECH_MS || lengthMs >= LONGEST_UTTERANCE_MS) {
      const samples = new Float32Array(this.frames.reduce((n, f) => n + f.length, 0));
      let at = 0;
      for (const f of this.frames) {
        samples.set(f, at);
        at += f.length;
      }
      this.#reset();
      this.#transcribe(wavClip(samples, rate));
    }
  }

  #transcribe(clip) {
    const form = new FormData();
    form.append('file', clip, 'speech.wav');
    form.append('model', 'firstword');
    form.append('response_format', 'json');
    call('/v1/audio/transcriptions', { form })
      .then((response) => response.json())
      .then((answer) => {
        const text = (answer.text ?? '').trim();
        if (!text || this.stream === undefined) return;
        const result = [{ transcript: text, confidence: 1 }];
        result.isFinal = true;
        this.results = [result];
        this.onresult?.({ resultIndex: 0, results: this.results });
      })
      .catch((error) => this.onerror?.({ error: `transcription refused: ${error.message}` }));
  }
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
    /** The recogniser's class: the browser's by default, {@link ServerRecognition} when chosen. */
    this.Recognition = browserRecognition();
  }

  /** Whether there is a recogniser. */
  get supported() {
    return this.Recognition !== null;
  }

  /** Listens with `Recognition` from now on (after a restart if listening). */
  use(Recognition) {
    const listening = this.on;
    if (listening) this.stop();
    this.Recognition = Recognition;
    if (listening) this.start();
  }

  /** Turns listening on or off. */
  toggle() {
    if (this.on) this.stop();
    else this.start();
  }

  start() {
    const Recognition = this.Recognition;
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
