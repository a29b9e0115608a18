"""The console in a real browser: Debian's Chromium, headless, driven by Playwright (never
Playwright's own browser download). tests/console.rs runs one check per call against a real
firstword over SmolLM2:

    console_checks.py BASE_URL CHECK [API_KEY]

Headless Chromium has no microphone and no voice: the voice checks replace the browser's
SpeechRecognition with a scripted stand-in whose interim and final results the check injects,
and speechSynthesis with one that records each utterance and says when it ends (or reaches a
word) only when the check tells it to. With FIRSTWORD_CONSOLE_SCREENSHOT=PATH the typed-turn
check saves a screenshot of the console after its turns (docs/console.png).
"""

import json
import math
import os
import re
import struct
import sys
import tempfile
import urllib.request
import wave

from playwright.sync_api import expect

from chromium import STEP_MS, CheckFailed, expect_that, run_check


# Replaces speech recognition and synthesis before the page's scripts run.
VOICE_STUBS = """
(() => {
  const speech = { instances: [] };
  class ScriptedRecognition {
    constructor() { this.results = []; this.started = false; speech.instances.push(this); speech.active = this; }
    start() { this.started = true; }
    stop() { this.started = false; const end = this.onend; if (end) setTimeout(() => end({}), 0); }
    abort() { this.stop(); }
  }
  speech.emit = (text, isFinal) => {
    const rec = speech.active;
    if (!rec || !rec.started) throw new Error('speech recognition was not started');
    let index = rec.results.length;
    if (index > 0 && !rec.results[index - 1].isFinal) index -= 1;
    const result = [{ transcript: text, confidence: 0.9 }];
    result.isFinal = isFinal;
    rec.results[index] = result;
    rec.results.length = index + 1;
    rec.onresult({ resultIndex: index, results: rec.results });
  };
  window.SpeechRecognition = ScriptedRecognition;
  window.webkitSpeechRecognition = ScriptedRecognition;
  window.__speech = speech;

  const tts = { spoken: [], queue: [], cancels: 0 };
  tts.speak = (u) => {
    const streaming = document.querySelector('.msg.assistant.streaming') !== null;
    tts.spoken.push({ text: u.text, streaming });
    tts.queue.push(u);
    if (tts.queue.length === 1 && u.onstart) u.onstart({});
  };
  tts.cancel = () => {
    tts.cancels += 1;
    const queued = tts.queue;
    tts.queue = [];
    for (const u of queued) if (u.onerror) u.onerror({ error: 'interrupted' });
  };
  tts.end = () => {
    const u = tts.queue.shift();
    if (u && u.onend) u.onend({});
    if (tts.queue[0] && tts.queue[0].onstart) tts.queue[0].onstart({});
  };
  tts.boundary = (charIndex, charLength) => {
    const u = tts.queue[0];
    if (u && u.onboundary) u.onboundary({ name: 'word', charIndex, charLength });
  };
  Object.defineProperty(tts, 'speaking', { get: () => tts.queue.length > 0 });
  tts.pause = () => {};
  tts.resume = () => {};
  tts.getVoices = () => [];
  Object.defineProperty(window, 'speechSynthesis', { value: tts, configurable: true, writable: true });
  window.SpeechSynthesisUtterance = class { constructor(text) { this.text = text; } };
  window.__tts = tts;
})();
"""

NO_RECOGNITION = """
delete window.SpeechRecognition;
delete window.webkitSpeechRecognition;
"""

# Records, while a reply streams, each text it shows: proof that it appears piece by piece.
TEXT_RECORDER = """
window.__shown = [];
new MutationObserver(() => {
  const reply = document.querySelector('.msg.assistant.streaming .text');
  if (reply && reply.textContent) window.__shown.push(reply.textContent.length);
}).observe(document, { subtree: true, childList: true, characterData: true });
"""

# A reply's figures: its TTFT (ms, or s past a second), decode rate, reused and evaluated tokens.
FIGURES = re.compile(r"TTFT ([\d.]+ m?s)(?: · decode [\d.]+ tok/s)? · prompt (\d+) reused / (\d+) evaluated")


def long_text(topic, facts):
    """A system prompt of many short numbered facts (about 14 tokens each)."""
    things = ["trains", "gardens", "rivers", "bridges", "music", "clocks", "bread", "boats"]
    return f"You answer questions about {topic}.\n" + "\n".join(
        f"Fact {i}: the {things[i % len(things)]} of {topic} number {i * 7 % 97} were counted in {1900 + i}."
        for i in range(facts)
    )


def sse_payloads(text):
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def open_console(page, base):
    page.goto(f"{base}/")
    expect(page.locator("#health")).to_have_text("ready", timeout=STEP_MS)


def settings(page, temperature="0", max_tokens="40", system=None):
    page.fill("#temperature", temperature)
    page.fill("#max-tokens", max_tokens)
    if system is not None:
        page.fill("#system", system)


def type_turn(page, text):
    """Types `text`, sends it with Enter and waits for the reply's figures; returns the request
    body, the streamed payloads and the figures' text."""
    before = page.locator(".msg.assistant").count()
    page.click("#input")
    page.keyboard.type(text)
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as answer:
        page.keyboard.press("Enter")
    response = answer.value
    expect_that(response.status == 200, f"status {response.status}")
    expect_that(response.headers.get("content-type") == "text/event-stream", f"{response.headers}")
    reply = page.locator(".msg.assistant").nth(before)
    expect(reply.locator(".figures")).to_contain_text("TTFT", timeout=STEP_MS)
    body = response.request.post_data_json
    return body, sse_payloads(response.text()), reply.locator(".figures").inner_text(), reply


def check_typed_turn(page, base):
    # Without speech recognition voice mode is off and says so; typing works.
    bare = page.context.new_page()
    bare.add_init_script(NO_RECOGNITION)
    open_console(bare, base)
    expect(bare.locator("#voice")).to_be_disabled()
    expect(bare.locator("#voice-status")).to_contain_text("no speech recognition")
    bare.close()
    page.add_init_script(TEXT_RECORDER)
    open_console(page, base)
    settings(page, system="You are a helpful assistant. Answer in one or two sentences.")
    body, payloads, figures, reply = type_turn(page, "What is the capital of France?")
    expect_that(body["stream"] is True and body["temperature"] == 0 and body["max_tokens"] == 40, f"{body}")
    expect_that(body["messages"][0] == {"role": "system", "content": "You are a helpful assistant. Answer in one or two sentences."}, f"{body}")
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads if p.get("choices"))
    expect(reply.locator(".text")).to_have_text(text)
    shown = page.evaluate("window.__shown")
    expect_that(any(0 < n < len(text) for n in shown), f"the reply was shown only whole: {shown} of {len(text)}")
    timings = next(p["timings"] for p in payloads if "timings" in p)
    match = FIGURES.search(figures)
    expect_that(match is not None, f"figures: {figures!r}")
    expect_that((int(match[2]), int(match[3])) == (timings["cache_n"], timings["prompt_n"]), f"{figures!r} vs {timings}")

    # The second turn continues the first: its prompt is mostly cached, and the page says so.
    body, payloads, figures, reply = type_turn(page, "And the capital of Germany?")
    expect_that([m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"], f"{body}")
    expect_that(body["messages"][2]["content"] == text, "the first reply is sent back as shown")
    timings = next(p["timings"] for p in payloads if "timings" in p)
    match = FIGURES.search(figures)
    expect_that(match is not None and int(match[2]) == timings["cache_n"] > 0, f"{figures!r} vs {timings}")
    expect(reply.locator(".cache-words")).to_contain_text("continued the live cache")
    expect(page.locator("#ttft-chart rect.bar")).to_have_count(2)
    # The cache view and the /metrics histogram were refreshed after the turn.
    expect(page.locator("#cache")).to_contain_text("Live sequence:", timeout=STEP_MS)
    expect(page.locator("#histogram rect.bar")).to_have_count(13, timeout=STEP_MS)
    expect(page.locator("#histogram-summary")).to_contain_text("requests")
    screenshot = os.environ.get("FIRSTWORD_CONSOLE_SCREENSHOT")
    if screenshot:
        page.screenshot(path=screenshot, full_page=True)
    print(f"PASS typed_turn: {figures}")


def check_tool_round_trip(page, base):
    open_console(page, base)
    settings(page, max_tokens="60")
    page.click("#example-tools")
    page.select_option("#tool-choice", "required")
    # One call: with parallel calls SmolLM2 goes on calling until max_tokens.
    page.uncheck("#parallel")
    body, payloads, figures, reply = type_turn(page, "What's the weather in Paris in celsius?")
    expect_that(body["tool_choice"] == "required" and len(body["tools"]) == 2, f"{body}")
    expect_that(body["parallel_tool_calls"] is False, f"{body}")
    card = reply.locator(".card").first
    expect(card).to_be_visible()
    name = card.locator(".fn").inner_text()
    call_id = card.locator(".call-id").inner_text()
    expect_that(name in ("get_weather", "set_timer"), f"called {name!r}")
    arguments = json.loads(card.locator(".args").inner_text())
    expect_that(isinstance(arguments, dict), f"{arguments!r}")
    finish = [p["choices"][0]["finish_reason"] for p in payloads if p.get("choices") and p["choices"][0].get("finish_reason")]
    expect_that(finish == ["tool_calls"], f"{finish}")
    card.locator(".canned").click()
    canned = card.locator(".result").input_value()
    expect_that(isinstance(json.loads(canned), dict), canned)
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        card.locator(".answer").click()
    follow_up = sent.value.post_data_json
    assistant, tool = follow_up["messages"][-2], follow_up["messages"][-1]
    expect_that(assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == call_id, f"{assistant}")
    expect_that(json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == arguments, f"{assistant}")
    expect_that(tool == {"role": "tool", "tool_call_id": call_id, "content": canned}, f"{tool}")
    expect_that(follow_up["tool_choice"] == "auto", "required applies to the reply to the user")
    expect(card).to_have_class(re.compile("answered"))
    answer = page.locator(".msg.assistant").nth(1)
    expect(answer.locator(".figures")).to_contain_text("TTFT", timeout=STEP_MS)
    expect_that(FIGURES.search(answer.locator(".figures").inner_text()) is not None, "the follow-up's figures")
    print(f"PASS tool_round_trip: {name}({json.dumps(arguments)}) answered with {canned}")


def check_cache_view(page, base):
    open_console(page, base)
    first = long_text("Avalon", 48)
    settings(page, max_tokens="12", system=first)
    body, payloads, _, _ = type_turn(page, "Which facts mention trains?")
    saved_tokens = next(p for p in payloads if p.get("usage"))["usage"]["prompt_tokens"]
    expect_that(saved_tokens >= 300, f"the first conversation has {saved_tokens} tokens: too few to be kept")
    # Another conversation interleaves: its system prompt differs, so the first is set aside.
    page.fill("#system", long_text("Brigadoon", 40))
    _, _, _, reply = type_turn(page, "Which facts mention rivers?")
    expect(reply.locator(".cache-words")).to_contain_text("system prompt changed at token")
    rows = page.locator("#cache .ram-entries tbody tr")
    # The cache is shown as of the end of the last request, and the engine goes on after a reply
    # (it evaluates the next turn's opening): refresh until the page and the server agree.
    for _ in range(60):
        with page.expect_response(lambda r: r.url.endswith("/cache")) as answer:
            page.click("#cache-refresh")
        shown = answer.value.json()
        expect(page.locator("#cache")).to_contain_text(f"Live sequence: {shown['live_tokens']} tokens")
        entries = [row.locator("td").all_inner_texts() for row in rows.all()]
        listed = sorted((kind, int(tokens)) for kind, tokens, *_ in entries)
        server = json.load(urllib.request.urlopen(urllib.request.Request(f"{base}/cache")))
        stored = any(kind == "snapshot" and tokens >= saved_tokens for kind, tokens in listed)
        if stored and shown == server and listed == sorted((e["kind"], e["tokens"]) for e in shown["entries"]):
            break
    else:
        raise CheckFailed(f"no stored conversation of {saved_tokens}+ tokens listed: {entries} (server: {server})")
    expect_that(listed == sorted((e["kind"], e["tokens"]) for e in server["entries"]), f"{listed} vs {server}")
    print(f"PASS cache_view: {entries}")


def check_api_key(page, base, key):
    page.goto(f"{base}/")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible(timeout=STEP_MS)
    expect(dialog).to_contain_text("This server needs an API key")
    expect(dialog).to_contain_text("(401)")
    page.fill("#key-input", "not-the-key")
    page.keyboard.press("Enter")
    expect(page.locator("#key-message")).to_contain_text("incorrect API key provided (401)", timeout=STEP_MS)
    expect(dialog).to_be_visible()
    page.fill("#key-input", key)
    page.click("#key-save")
    expect(dialog).to_be_hidden()
    expect(page.locator("#health")).to_have_text("ready", timeout=STEP_MS)
    stored = page.evaluate("[sessionStorage.getItem('firstword-api-key'), localStorage.getItem('firstword-api-key')]")
    expect_that(stored == [key, None], f"kept for the tab only: {stored}")
    settings(page, max_tokens="8")
    body, _, figures, _ = type_turn(page, "Hello!")
    # Another tab of the same browser asks again: the key was not remembered.
    other = page.context.new_page()
    other.goto(f"{base}/")
    expect(other.locator("#key-dialog")).to_be_visible(timeout=STEP_MS)
    other.fill("#key-input", key)
    other.check("#key-remember")
    other.click("#key-save")
    expect(other.locator("#health")).to_have_text("ready", timeout=STEP_MS)
    third = page.context.new_page()
    third.goto(f"{base}/")
    expect(third.locator("#health")).to_have_text("ready", timeout=STEP_MS)
    expect(third.locator("#key-dialog")).to_be_hidden()
    print(f"PASS api_key: {figures}")


def voice_page(page, base):
    page.add_init_script(VOICE_STUBS)
    open_console(page, base)
    settings(page, max_tokens="48", system="You are a helpful assistant.")
    page.click("#voice")
    expect(page.locator("#voice")).to_have_attribute("aria-pressed", "true")


def say(page, text, final):
    page.evaluate("([text, final]) => window.__speech.emit(text, final)", [text, final])


def spoken(page):
    return page.evaluate("window.__tts.spoken")


def voice_turn(page, partials, final):
    """Says `partials` then `final`; returns the prefill bodies, the request body and the reply."""
    calls = []
    page.on("request", lambda r: calls.append(r) if r.url.endswith(("/v1/prefill", "/v1/chat/completions")) else None)
    before = page.locator(".msg.assistant").count()
    for text in partials:
        with page.expect_response(lambda r: r.url.endswith("/v1/prefill")):
            say(page, text, False)
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")):
        say(page, final, True)
    reply = page.locator(".msg.assistant").nth(before)
    expect(reply.locator(".figures")).to_contain_text("end of speech → first word", timeout=STEP_MS)
    prefills = [r.post_data_json for r in calls if r.url.endswith("/v1/prefill")]
    requests = [r.post_data_json for r in calls if r.url.endswith("/v1/chat/completions")]
    expect_that(len(requests) == 1, f"{len(requests)} requests")
    return prefills, requests[0], reply


def check_voice(page, base):
    voice_page(page, base)
    # The browser's recogniser is not local, and the page says so next to the Voice button.
    notice = page.locator("#voice-privacy")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("send the microphone's audio to Google's or Microsoft's servers")
    partials = ["Tell me", "Tell me about the", "Tell me about the sun"]
    prefills, request, reply = voice_turn(page, partials, "Tell me about the sun.")
    expect_that([p["messages"][-1] for p in prefills] == [{"role": "user", "content": t} for t in partials], f"{prefills}")
    expect_that(request["messages"][-1] == {"role": "user", "content": "Tell me about the sun."}, f"{request}")
    for prefill in prefills:
        # The same conversation and settings as the request, so what is prefilled is reused.
        same = {k: v for k, v in request.items() if k not in ("messages", "stream", "stream_options")}
        expect_that({k: v for k, v in prefill.items() if k != "messages"} == same, f"{prefill} vs {request}")
        expect_that(prefill["messages"][:-1] == request["messages"][:-1], f"{prefill}")
    figures = reply.locator(".figures").inner_text()
    expect_that(re.search(r"end of speech → first word [\d.]+ m?s", figures), figures)
    expect_that(FIGURES.search(figures) and int(FIGURES.search(figures)[2]) > 0, f"the prefilled prompt was reused: {figures}")
    text = reply.locator(".text").text_content()
    said = spoken(page)
    expect_that(len(said) >= 2, f"one utterance per sentence: {said} for {text!r}")
    expect_that(said[0]["streaming"], f"the first sentence was spoken while the reply streamed: {said}")
    expect_that(" ".join(s["text"] for s in said).split() == text.split(), f"{said} vs {text!r}")
    for s in said[:-1]:
        expect_that(re.search(r"[.!?…][\"'”’)\]]*$", s["text"]), f"not a whole sentence: {s['text']!r}")
    print(f"PASS voice: {len(prefills)} prefills, {len(said)} sentences spoken; {figures}")


def check_barge_in(page, base):
    voice_page(page, base)
    _, _, reply = voice_turn(page, ["Tell me about"], "Tell me about the moon.")
    said = spoken(page)
    expect_that(len(said) >= 2, f"two sentences at least: {said}")
    text = reply.locator(".text").text_content()
    # The first sentence is heard, then the second up to the end of its second word.
    page.evaluate("window.__tts.end()")
    second = said[1]["text"]
    word = re.match(r"\S+\s+(\S+)", second)
    expect_that(word is not None, f"a second sentence of two words: {second!r}")
    page.evaluate("([at, length]) => window.__tts.boundary(at, length)", [word.start(1), len(word[1])])
    start = text.index(second, text.index(said[0]["text"]) + len(said[0]["text"]))
    heard = text[: start + word.end(1)].rstrip()
    with page.expect_response(lambda r: r.url.endswith("/v1/prefill")) as prefill:
        say(page, "Wait", False)
    expect_that(page.evaluate("window.__tts.cancels") == 1, "speaking over the reply silences it")
    expect(reply).to_have_class(re.compile("interrupted"))
    expect(reply.locator(".unspoken")).to_have_text(text[len(heard):])
    expect_that(prefill.value.request.post_data_json["messages"][-2] == {"role": "assistant", "content": heard},
                f"{prefill.value.request.post_data_json['messages'][-2]} vs {heard!r}")
    _, request, _ = voice_turn(page, [], "Wait, what is it made of?")
    expect_that(request["messages"][-3:] == [
        {"role": "user", "content": "Tell me about the moon."},
        {"role": "assistant", "content": heard},
        {"role": "user", "content": "Wait, what is it made of?"},
    ], f"{request['messages']}")
    print(f"PASS barge_in: the reply was cut to {heard!r}")


def utterance_wav(path):
    """A 220 Hz tone for a second between seconds of silence (16 kHz mono): loud enough for the
    page's end-of-speech detection to cut it as one utterance. Chromium's fake microphone plays
    it in a loop."""
    rate = 16000
    tone = [round(0.4 * 32767 * math.sin(2 * math.pi * 220 * i / rate)) for i in range(rate)]
    samples = [0] * rate + tone + [0] * rate
    with wave.open(path, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(struct.pack(f"<{len(samples)}h", *samples))


def check_server_recogniser(page, base):
    open_console(page, base)
    # The model takes audio: the server is offered and chosen as the recogniser, and the page
    # says the audio goes to it only.
    expect(page.locator("#recogniser")).to_be_visible()
    expect(page.locator("#recogniser")).to_have_value("server")
    expect(page.locator("#voice-privacy")).to_contain_text("transcribed by this server")
    settings(page, max_tokens="8")
    with page.expect_response(lambda r: r.url.endswith("/v1/audio/transcriptions"), timeout=STEP_MS) as answer:
        page.click("#voice")
    response = answer.value
    expect_that(response.status == 200, f"the transcription was refused: {response.status} {response.text()}")
    # The server inspects the clip before the projector sees it: a 200 means a well-formed WAV.
    kind = response.request.headers.get("content-type", "")
    expect_that(kind.startswith("multipart/form-data"), f"the clip is posted as a form: {kind}")
    text = response.json()["text"].strip()
    if text:
        # The transcript is the user's turn (the projector's weights are random: any text).
        expect(page.locator(".msg.user").first).to_have_text(text, timeout=STEP_MS)
    page.click("#voice")
    expect(page.locator("#voice")).to_have_attribute("aria-pressed", "false")
    page.select_option("#recogniser", "browser")
    expect(page.locator("#voice-privacy")).to_contain_text("send the microphone's audio to Google's or Microsoft's servers")
    print(f"PASS server_recogniser: the clip was transcribed as {text!r}")


CHECKS = {
    "typed_turn": check_typed_turn,
    "tool_round_trip": check_tool_round_trip,
    "cache_view": check_cache_view,
    "api_key": check_api_key,
    "voice": check_voice,
    "barge_in": check_barge_in,
    "server_recogniser": check_server_recogniser,
}


def main():
    base, name = sys.argv[1], sys.argv[2]
    args = []
    if name == "server_recogniser":
        # A fake microphone playing a clip, allowed without asking.
        clip = os.path.join(tempfile.mkdtemp(), "utterance.wav")
        utterance_wav(clip)
        args = [
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={clip}",
            "--autoplay-policy=no-user-gesture-required",
        ]
    if name == "api_key":
        check = lambda page: check_api_key(page, base, sys.argv[3])  # noqa: E731
    else:
        check = lambda page: CHECKS[name](page, base)  # noqa: E731
    # The API-key check provokes a 401 on purpose.
    run_check(name, check, args, ignored_console=lambda text: "401" in text)


if __name__ == "__main__":
    main()
