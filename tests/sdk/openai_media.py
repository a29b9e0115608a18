"""Images and audio through the official `openai` Python SDK: chat `image_url` and
`input_audio` parts, the Responses API's `input_image`, `client.audio.transcriptions.create`
(json and text), the cache kept across turns that re-send a picture, and the 400 for a URL the
server must not fetch.

Usage: python openai_media.py VISION_BASE_URL AUDIO_BASE_URL MODEL   (two servers over one
model, one with a vision projector, one with an audio projector)

Prints `PASS name` or `FAIL name: reason` per check and exits 1 when any check failed.
tests/openai_sdk.rs runs it.
"""

import base64
import io
import math
import struct
import sys
import wave
import zlib

import openai

from harness import CheckFailed, checks, client, expect, expect_api_error, run

CHECKS, check = checks()

# Tokens the vision fixture makes of any picture.
VISION_TOKENS = 16


def png(width, height, color):
    """A PNG whose pixel (x, y) is `color(x, y)` (RGB)."""
    rows = b"".join(b"\x00" + bytes(c for x in range(width) for c in color(x, y)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def tone(seconds, pitch, rate=16000):
    """A 16-bit mono WAV of a sine tone."""
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        frames = int(seconds * rate)
        clip.writeframes(
            b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * pitch * i / rate))) for i in range(frames))
        )
    return out.getvalue()


RED = png(64, 64, lambda x, y: (220, 20, 20))
CLIP = tone(1.0, 440.0)


def image_part(data):
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


class Session:
    def __init__(self, vision_url, audio_url, model):
        self.vision = client(vision_url)
        self.audio = client(audio_url)
        self.model = model


@check
def chat_with_a_picture(session):
    messages = [{"role": "user", "content": [image_part(RED), {"type": "text", "text": "What is this?"}]}]
    reply = session.vision.chat.completions.create(model=session.model, messages=messages, max_tokens=8, temperature=0)
    expect(isinstance(reply.choices[0].message.content, str), f"content {reply.choices[0].message.content!r}")
    expect(reply.usage.prompt_tokens > VISION_TOKENS, f"prompt tokens {reply.usage.prompt_tokens}")
    # The same picture, another question: the cache holds the picture.
    messages = [{"role": "user", "content": [image_part(RED), {"type": "text", "text": "Which colour?"}]}]
    again = session.vision.chat.completions.create(model=session.model, messages=messages, max_tokens=8, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    expect(cached >= VISION_TOKENS, f"cached tokens {cached}: the picture was evaluated again")


@check
def a_picture_url_is_not_fetched(session):
    part = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/picture.png"}}
    try:
        session.vision.chat.completions.create(
            model=session.model, messages=[{"role": "user", "content": [part]}], max_tokens=4
        )
    except openai.BadRequestError as error:
        expect_api_error(error, 400)
        expect(error.body.get("param") == "messages[0].content[0].image_url", f"param {error.body.get('param')!r}")
        return
    raise CheckFailed("a URL to fetch was accepted")


@check
def the_responses_api_takes_a_picture(session):
    url = "data:image/png;base64," + base64.b64encode(RED).decode()
    content = [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What is this?"}]
    response = session.vision.responses.create(
        model=session.model, input=[{"role": "user", "content": content}], max_output_tokens=8, temperature=0
    )
    expect(response.status in ("completed", "incomplete"), f"status {response.status}")
    expect(response.usage.input_tokens > VISION_TOKENS, f"input tokens {response.usage.input_tokens}")


@check
def chat_with_a_clip(session):
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(CLIP).decode(), "format": "wav"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What do you hear?"}, part]}]
    reply = session.audio.chat.completions.create(model=session.model, messages=messages, max_tokens=8, temperature=0)
    expect(isinstance(reply.choices[0].message.content, str), f"content {reply.choices[0].message.content!r}")


@check
def transcriptions_json_and_text(session):
    transcript = session.audio.audio.transcriptions.create(model="whisper-1", file=("clip.wav", CLIP, "audio/wav"))
    expect(isinstance(transcript.text, str) and transcript.text, f"text {transcript.text!r}")
    plain = session.audio.audio.transcriptions.create(
        model="whisper-1", file=("clip.wav", CLIP, "audio/wav"), response_format="text"
    )
    expect(isinstance(plain, str) and plain.strip() == transcript.text, f"text format {plain!r}")


@check
def transcriptions_refuse_what_they_cannot_do(session):
    try:
        session.audio.audio.transcriptions.create(model="whisper-1", file=("clip.wav", CLIP), response_format="srt")
    except openai.BadRequestError as error:
        expect_api_error(error, 400)
        expect(error.body.get("param") == "response_format", f"param {error.body.get('param')!r}")
        return
    raise CheckFailed("subtitles were accepted")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(f"usage: {sys.argv[0]} VISION_BASE_URL AUDIO_BASE_URL MODEL")
    print(f"openai {openai.__version__} against {sys.argv[1]} and {sys.argv[2]}")
    run(CHECKS, Session(*sys.argv[1:]))
