//! Images and audio through a projector (`--mmproj`), on SmolLM2 with the tiny projector
//! fixtures (random weights: the answers are noise, everything else is real): a media's tokens
//! in the prompt, the cache reused across turns that re-send the same picture or clip (greedy
//! output equal to a fresh context evaluating the same split), another picture diverging where
//! it starts (`media-changed`), the load-time probe refusing a projector that maps every
//! picture to one output, and bad media answered with a 400 naming the part while the server
//! goes on unchanged.

mod common;

use std::path::PathBuf;

use common::media::{
    audio_part, audio_projector, black_png, checkerboard, degenerate_projector, image_part, os2_bmp, red, tone,
    top_down_bmp, vision_projector, AUDIO_TOKENS, VISION_TOKENS,
};
use common::{generate, post, post_json, smollm2_path, spawn_server, test_config, Generated, ServerProcess};
use firstword::bench::bmp;
use firstword::engine::media::{MediaInput, MediaKind, MAX_MEDIA_PARTS};
use firstword::{CacheMiss, CacheSource, ChatMessage, Engine, EngineConfig, GenerationRequest, Prompt, SamplingParams};
use serde_json::{json, Value};

/// SmolLM2 with `projector`.
fn config_with(projector: PathBuf) -> EngineConfig {
    EngineConfig { mmproj: Some(projector), ..test_config(smollm2_path()) }
}

/// One user message: the media, then a question.
fn ask(media: &MediaInput, question: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!("{}\nQuestion: {question}", media.marker()))]
}

/// A greedy request for `prompt` with `media`, at most `max_tokens`.
fn request(prompt: Prompt, media: &[&MediaInput], max_tokens: u32) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        media: media.iter().map(|&m| m.clone()).collect(),
        ..GenerationRequest::chat(Vec::new())
    }
}

/// The chat prompt's text for `messages`, and its tokens before `media`'s marker.
fn text_and_tokens_before(engine: &Engine, messages: &[ChatMessage], media: &MediaInput) -> (String, u32) {
    let text = engine.chat_prompt_text(messages, &[], &Default::default()).expect("renders");
    let before = &text[..text.find(&media.marker()).expect("the marker is in the text")];
    let tokens = engine.tokenize_blocking(&Prompt::Text(before.to_string())).expect("tokenizes");
    (text, tokens.len() as u32)
}

/// A fresh engine (store off) evaluating `text` as a cached request did: `text[..split]`
/// alone, then all of it; returns the greedy reply, after checking it cached what `cached` says.
fn fresh_split(config: &EngineConfig, text: &str, split: usize, media: &[&MediaInput], cached: u32) -> Generated {
    let fresh = Engine::start(EngineConfig { cache_ram_mib: 0, ..config.clone() }).expect("model loads");
    generate(&fresh, request(Prompt::Text(text[..split].to_string()), media, 0));
    let answer = generate(&fresh, request(Prompt::Text(text.to_string()), media, 12));
    assert_eq!(answer.usage.cached_tokens, cached, "the same split on both sides");
    answer
}

#[test]
fn a_picture_sent_again_continues_the_cache_and_another_diverges_where_it_starts() {
    let config = config_with(vision_projector());
    let engine = Engine::start(config.clone()).expect("loads");
    let info = engine.model_info().expect("ready");
    assert!(info.media.image && !info.media.audio && info.media.refused.is_none(), "{:?}", info.media);
    let red = MediaInput::new(MediaKind::Image, red(), "test");
    let checker = MediaInput::new(MediaKind::Image, checkerboard(), "test");

    let first = ask(&red, "What is this?");
    let (_, before) = text_and_tokens_before(&engine, &first, &red);
    let text_only = vec![ChatMessage::user("\nQuestion: What is this?")];
    let text_only = generate(&engine, request(Prompt::chat(text_only, Vec::new()), &[], 1));
    let turn1 = generate(&engine, request(Prompt::chat(first, Vec::new()), &[&red], 8));
    assert!(
        turn1.usage.prompt_tokens >= text_only.usage.prompt_tokens + VISION_TOKENS - 2,
        "the picture's {VISION_TOKENS} tokens are in the prompt: {} vs {} without it",
        turn1.usage.prompt_tokens,
        text_only.usage.prompt_tokens
    );

    // The same picture, another question: the cache holds the picture.
    let again = ask(&red, "Which colour is it?");
    let (text, _) = text_and_tokens_before(&engine, &again, &red);
    let turn2 = generate(&engine, request(Prompt::chat(again.clone(), Vec::new()), &[&red], 12));
    let cache = &turn2.timings.cache;
    assert_eq!(cache.source, CacheSource::Live);
    assert!(turn2.usage.cached_tokens >= before + VISION_TOKENS, "{} cached", turn2.usage.cached_tokens);
    let split = text.find("Question:").expect("question") + "Question:".len();
    let fresh = fresh_split(&config, &text, split, &[&red], turn2.usage.cached_tokens);
    assert_eq!(turn2.text, fresh.text, "reusing the picture's cache changed the answer");

    // Another picture: the cache is kept up to where it starts, and says why.
    let other = ask(&checker, "Which colour is it?");
    let (text, _) = text_and_tokens_before(&engine, &other, &checker);
    let turn3 = generate(&engine, request(Prompt::chat(other, Vec::new()), &[&checker], 12));
    let cache = &turn3.timings.cache;
    assert_eq!((turn3.usage.cached_tokens, cache.reason), (before, Some(CacheMiss::MediaChanged)));
    let split = text.find(&checker.marker()).expect("marker");
    let fresh = fresh_split(&config, &text, split, &[&checker], before);
    assert_eq!(turn3.text, fresh.text, "the other picture's answer differs from a fresh context's");
}

#[test]
fn audio_clips_take_their_tokens_and_a_clip_sent_again_continues_the_cache() {
    let config = config_with(audio_projector());
    let engine = Engine::start(config.clone()).expect("loads");
    let info = engine.model_info().expect("ready");
    assert!(info.media.audio && !info.media.image, "{:?}", info.media);
    let short = MediaInput::new(MediaKind::Audio, tone(1.0, 440.0, 16_000), "test");
    let long = MediaInput::new(MediaKind::Audio, tone(31.0, 440.0, 16_000), "test");
    let resampled = MediaInput::new(MediaKind::Audio, tone(1.0, 440.0, 44_100), "test");
    let tokens = |clip: &MediaInput| {
        generate(&engine, request(Prompt::chat(ask(clip, "What do you hear?"), Vec::new()), &[clip], 1))
            .usage
            .prompt_tokens
    };
    let (one_second, thirty_one, at_44k) = (tokens(&short), tokens(&long), tokens(&resampled));
    assert_eq!(thirty_one - one_second, AUDIO_TOKENS, "each 30 s window of audio is {AUDIO_TOKENS} tokens");
    assert_eq!(at_44k, one_second, "a 44.1 kHz clip is resampled to the projector's rate");

    let (_, before) = text_and_tokens_before(&engine, &ask(&short, "x"), &short);
    generate(&engine, request(Prompt::chat(ask(&short, "What do you hear?"), Vec::new()), &[&short], 6));
    let again = ask(&short, "Which note is it?");
    let (text, _) = text_and_tokens_before(&engine, &again, &short);
    let turn2 = generate(&engine, request(Prompt::chat(again, Vec::new()), &[&short], 12));
    assert!(turn2.usage.cached_tokens >= before + AUDIO_TOKENS, "{} cached", turn2.usage.cached_tokens);
    let split = text.find("Question:").expect("question") + "Question:".len();
    let fresh = fresh_split(&config, &text, split, &[&short], turn2.usage.cached_tokens);
    assert_eq!(turn2.text, fresh.text, "reusing the clip's cache changed the answer");
}

#[test]
fn a_projector_mapping_every_picture_to_one_output_is_refused_at_load() {
    let engine = Engine::start(config_with(degenerate_projector())).expect("loads: text still works");
    let refused = engine.model_info().expect("ready").media.refused.expect("the probe refuses it");
    assert!(refused.contains("tiny-mmproj-degenerate.gguf") && refused.contains("same output"), "{refused}");
    let server = spawn_server(engine);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let body = json!({"messages": [{"role": "user", "content": [image_part(&red()), {"type": "text", "text": "What is this?"}]}], "max_tokens": 4});
        let (status, answer) = post(&server.base, &body).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], "messages[0].content[0].type");
        assert!(answer["error"]["message"].as_str().unwrap_or("").contains("same output"), "{answer}");
        let (status, _) = post(&server.base, &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})).await;
        assert_eq!(status, 200, "text is still served");
        let models: Value = reqwest::get(format!("{}/v1/models", server.base)).await.expect("models").json().await.expect("JSON");
        assert_eq!(models["data"][0]["meta"]["input_media"], json!([]), "{models}");
        assert!(models["data"][0]["meta"]["media_refused"].as_str().is_some_and(|r| r.contains("same output")), "{models}");
    });
}

#[test]
fn bad_media_gets_a_400_naming_the_part_and_changes_nothing() {
    let server = spawn_server(Engine::start(config_with(vision_projector())).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let good = json!({"messages": [{"role": "user", "content": [image_part(&red()), {"type": "text", "text": "What is this?"}]}], "max_tokens": 8, "temperature": 0});
        let (status, before) = post(&server.base, &good).await;
        assert_eq!(status, 200, "{before}");
        let models: Value = reqwest::get(format!("{}/v1/models", server.base)).await.expect("models").json().await.expect("JSON");
        assert_eq!(models["data"][0]["meta"]["input_media"], json!(["image"]), "{models}");
        let user = |parts: Value| json!({"messages": [{"role": "user", "content": parts}], "max_tokens": 4});
        let text = json!({"type": "text", "text": "What is this?"});
        let data_url = |mime: &str, bytes: &[u8]| {
            json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{}", common::media::base64(bytes))}})
        };
        // A PNG whose header declares 40,000 × 40,000 pixels.
        let mut huge = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        huge.extend_from_slice(&40_000u32.to_be_bytes());
        huge.extend_from_slice(&40_000u32.to_be_bytes());
        huge.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        // A PNG with a valid header and no picture after it.
        let mut broken = huge.clone();
        broken[16..24].copy_from_slice(&[0, 0, 0, 64, 0, 0, 0, 64]);
        broken.extend_from_slice(b"\x00\x00\x00\x04IDATjunkjunk");
        let marker = MediaInput::new(MediaKind::Image, red(), "x").marker();
        let cases: Vec<(&str, Value, &str)> = vec![
            ("a URL to fetch", user(json!([{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}, text])), "messages[0].content[0].image_url"),
            ("not base64", user(json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, text])), "messages[0].content[0].image_url"),
            ("no url", user(json!([{"type": "image_url", "image_url": {}}, text])), "messages[0].content[0].image_url.url"),
            ("a declared 1.6-gigapixel picture", user(json!([data_url("image/png", &huge), text])), "messages[0].content[0]"),
            ("a broken PNG", user(json!([data_url("image/png", &broken), text])), "messages[0].content[0]"),
            ("WebP", user(json!([data_url("image/webp", b"RIFF\x1a\x00\x00\x00WEBPVP8 \x0e\x00\x00\x00"), text])), "messages[0].content[0]"),
            ("audio for a vision projector", user(json!([text, audio_part(&tone(1.0, 440.0, 16_000))])), "messages[0].content[1].type"),
            ("text where a picture is", user(json!([data_url("image/png", b"hello, world"), text])), "messages[0].content[0]"),
            ("seventeen pictures", user(Value::Array((0..17).map(|_| image_part(&red())).chain([text.clone()]).collect())), "messages[0].content[16]"),
            ("a marker naming no part of the request", user(json!([image_part(&checkerboard()), {"type": "text", "text": marker}])), "messages"),
        ];
        for (what, body, param) in cases {
            let (status, answer) = post(&server.base, &body).await;
            assert_eq!(status, 400, "{what}: {answer}");
            assert_eq!(answer["error"]["param"], param, "{what}: {answer}");
        }
        let health = reqwest::get(format!("{}/health", server.base)).await.expect("health");
        assert_eq!(health.status().as_u16(), 200, "the server is up");
        // Top-down rows (a negative height) and an OS/2 header (16-bit sizes) are 2 × 2 pictures.
        for (what, bmp) in [("a top-down BMP", top_down_bmp()), ("an OS/2 BMP", os2_bmp())] {
            let (status, answer) = post(&server.base, &user(json!([image_part(&bmp), text]))).await;
            assert_eq!(status, 200, "{what}: {answer}");
        }
        let (status, after) = post(&server.base, &good).await;
        assert_eq!(status, 200, "{after}");
        assert_eq!(after["choices"][0]["message"]["content"], before["choices"][0]["message"]["content"]);
    });
}

#[test]
fn the_responses_api_takes_pictures_and_keeps_them_along_a_chain() {
    let server = spawn_server(Engine::start(config_with(vision_projector())).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let url = format!("data:image/bmp;base64,{}", common::media::base64(&red()));
        let first = json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}, {"type": "input_text", "text": "What is this?"}]}], "max_output_tokens": 6, "temperature": 0});
        let (status, answer) = post_json(&server.base, "/v1/responses", &first).await;
        assert_eq!(status, 200, "{answer}");
        let prompt_tokens = answer["usage"]["input_tokens"].as_u64().expect("usage");
        let next = json!({"previous_response_id": answer["id"], "input": "And its colour?", "max_output_tokens": 6, "temperature": 0});
        let (status, answer) = post_json(&server.base, "/v1/responses", &next).await;
        assert_eq!(status, 200, "the stored turn's picture goes with the chain: {answer}");
        let cached = answer["usage"]["input_tokens_details"]["cached_tokens"].as_u64().expect("cached tokens");
        assert!(cached >= prompt_tokens - 1, "the picture's tokens are reused: {cached} of {prompt_tokens}");
    });
}

#[test]
fn a_responses_chain_past_the_media_limit_gets_a_400_and_the_chain_goes_on() {
    let server = spawn_server(Engine::start(config_with(vision_projector())).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let picture = |shade: u8| {
            let url = format!("data:image/bmp;base64,{}", common::media::base64(&bmp(16, 16, |_, _| [shade, 40, 90])));
            json!({"type": "input_image", "image_url": url})
        };
        let turn = |previous: Option<&Value>, shades: &[u8]| {
            let mut content: Vec<Value> = shades.iter().map(|&shade| picture(shade)).collect();
            content.push(json!({"type": "input_text", "text": "Which is brightest?"}));
            let mut body =
                json!({"input": [{"role": "user", "content": content}], "max_output_tokens": 2, "temperature": 0});
            if let Some(id) = previous {
                body["previous_response_id"] = id.clone();
            }
            body
        };
        let shades: Vec<u8> = (0..MAX_MEDIA_PARTS as u8).map(|i| i * 15).collect();
        let (status, first) = post_json(&server.base, "/v1/responses", &turn(None, &shades[..10])).await;
        assert_eq!(status, 200, "{first}");
        let (status, second) = post_json(&server.base, "/v1/responses", &turn(Some(&first["id"]), &shades[10..])).await;
        assert_eq!(status, 200, "16 distinct pictures along the chain: {second}");
        let (status, refused) = post_json(&server.base, "/v1/responses", &turn(Some(&second["id"]), &[250])).await;
        assert_eq!(status, 400, "a 17th picture along the chain: {refused}");
        assert_eq!(refused["error"]["param"], "input", "{refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("17 (16 stored, 1 new)"), "{message}");
        let (status, again) = post_json(&server.base, "/v1/responses", &turn(Some(&second["id"]), &[0])).await;
        assert_eq!(status, 200, "a picture the chain holds already adds nothing: {again}");
        let (status, text) = post_json(&server.base, "/v1/responses", &turn(Some(&second["id"]), &[])).await;
        assert_eq!(status, 200, "the chain goes on without new media: {text}");
    });
}

#[test]
fn prepared_media_count_in_the_ram_budget_and_are_evicted_by_bytes() {
    // 4 MiB of --cache-ram: a quarter (1 MiB) for the media, which a fixture picture's segment
    // (16 embeddings) fills more than half of; the state store gets the other 3 MiB.
    let config = EngineConfig { cache_ram_mib: 4, ..config_with(vision_projector()) };
    let server = spawn_server(Engine::start(config).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        for shade in [30u8, 130, 230] {
            let picture = bmp(16, 16, |_, _| [shade, 90, 40]);
            let body = json!({"messages": [{"role": "user", "content": [image_part(&picture), {"type": "text", "text": "What is this?"}]}], "max_tokens": 2, "temperature": 0});
            let (status, answer) = post(&server.base, &body).await;
            assert_eq!(status, 200, "{answer}");
        }
        let cache: Value = reqwest::get(format!("{}/cache", server.base)).await.expect("cache").json().await.expect("JSON");
        let media = &cache["media"];
        assert_eq!(media["budget_bytes"], 1 << 20, "{cache}");
        assert_eq!(cache["budget_bytes"], 3 << 20, "the store has the rest: {cache}");
        let used = media["used_bytes"].as_u64().expect("media bytes");
        assert!(used > 1 << 19 && used <= 1 << 20, "one picture's segment, within the share: {cache}");
        assert_eq!(media["entries"], 1, "the older pictures were evicted by bytes: {cache}");
        let store_used = cache["used_bytes"].as_u64().expect("store bytes");
        assert!(store_used + used <= 4 << 20, "both within --cache-ram: {cache}");
        let metrics = reqwest::get(format!("{}/metrics", server.base)).await.expect("metrics").text().await.expect("text");
        assert!(metrics.contains(&format!("cache_bytes{{store=\"media\"}} {used}")), "{metrics}");
    });
}

/// A form field: its name, its file name (for files), its bytes.
type FormField<'a> = (&'a str, Option<&'a str>, &'a [u8]);

/// A multipart/form-data body of `fields` (name, file name, bytes) and its content type.
fn form(fields: &[FormField<'_>]) -> (Vec<u8>, String) {
    let boundary = "firstwordTestBoundary7MA4YWxk";
    let mut body = Vec::new();
    for (name, file, bytes) in fields {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match file {
            Some(file) => body.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
            ),
            None => body.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes()),
        }
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (body, format!("multipart/form-data; boundary={boundary}"))
}

/// Posts a transcription form; returns the status, the content type and the body's text.
async fn transcribe(base: &str, fields: &[FormField<'_>]) -> (u16, String, String) {
    let (body, content_type) = form(fields);
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/audio/transcriptions"))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let kind = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    (status, kind, response.text().await.expect("body"))
}

#[test]
fn transcriptions_answer_as_the_chat_turn_that_asks_for_them() {
    // One sequence: with several, the transcription's turn (which the chat turn displaces) stays
    // kept in its cells, and the chat turn's sums then follow other cells than a lone turn's
    // (docs/serving.md): the same words only within llama.cpp's rounding.
    let config = EngineConfig { parallel: 1, ..config_with(audio_projector()) };
    let server = spawn_server(Engine::start(config).expect("loads"));
    let vision = spawn_server(Engine::start(config_with(vision_projector())).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let clip = tone(1.0, 440.0, 16_000);
        let (status, kind, body) = transcribe(&server.base, &[("file", Some("clip.wav"), &clip), ("model", None, b"whisper-1")]).await;
        assert_eq!((status, kind.as_str()), (200, "application/json"), "{body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        let text = answer["text"].as_str().expect("text").to_string();
        assert!(answer["usage"]["input_tokens"].as_u64().expect("usage") > u64::from(AUDIO_TOKENS));
        // The same turn through chat completions: the same words.
        let chat = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Transcribe audio to text"}, audio_part(&clip)]}], "max_tokens": 448, "temperature": 0});
        let (status, reply) = post(&server.base, &chat).await;
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["choices"][0]["message"]["content"].as_str().map(str::trim), Some(text.as_str()));

        let (status, kind, plain) = transcribe(&server.base, &[("file", Some("clip.wav"), &clip), ("response_format", None, b"text")]).await;
        assert_eq!((status, kind.starts_with("text/plain"), plain.as_str()), (200, true, text.as_str()));

        let refusals: Vec<(&str, Vec<FormField<'_>>, &str)> = vec![
            ("no file", vec![("model", None, b"x")], "file"),
            ("subtitles", vec![("file", Some("clip.wav"), &clip), ("response_format", None, b"srt")], "response_format"),
            ("a streamed transcript", vec![("file", Some("clip.wav"), &clip), ("stream", None, b"true")], "stream"),
            ("a flac file", vec![("file", Some("clip.flac"), &clip)], "file"),
            ("text as audio", vec![("file", Some("clip.wav"), b"not a sound")], "file"),
            ("an unknown field", vec![("file", Some("clip.wav"), &clip), ("timestamp_granularities[]", None, b"word")], "timestamp_granularities[]"),
        ];
        for (what, fields, param) in refusals {
            let (status, _, body) = transcribe(&server.base, &fields).await;
            assert_eq!(status, 400, "{what}: {body}");
            let error: Value = serde_json::from_str(&body).expect("an error envelope");
            assert_eq!(error["error"]["param"], param, "{what}: {body}");
        }
        let (status, _, body) = transcribe(&vision.base, &[("file", Some("clip.wav"), &clip)]).await;
        assert_eq!(status, 400, "a vision projector takes no audio: {body}");
        let json_body = reqwest::Client::new().post(format!("{}/v1/audio/transcriptions", server.base)).json(&json!({})).send().await.expect("request");
        assert_eq!(json_body.status().as_u16(), 400);
    });
}

/// A transcription's 448 tokens per started 30 s are a ceiling, not room the clip must leave:
/// a clip longer than 30 s × n_ctx / 448 is transcribed into what the context has left (it was
/// refused with `context_length_exceeded`), while a chat request asking for as many tokens is
/// still refused, and a clip whose own tokens fill the context is refused too.
#[test]
fn a_long_clip_is_transcribed_within_the_context_its_cap_does_not_refuse_it() {
    const N_CTX: u32 = 512;
    let config = EngineConfig { ctx_size: Some(N_CTX), ..config_with(audio_projector()) };
    let server = spawn_server(Engine::start(config).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // 45 s: two windows, a cap of 896 tokens, more than the whole context.
        let seconds = 45.0;
        assert!(seconds > 30.0 * N_CTX as f32 / 448.0);
        let clip = tone(seconds, 440.0, 16_000);
        let (status, _, body) = transcribe(&server.base, &[("file", Some("long.wav"), &clip)]).await;
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        let (input, output) = (answer["usage"]["input_tokens"].as_u64(), answer["usage"]["output_tokens"].as_u64());
        let (input, output) = (input.expect("input tokens"), output.expect("output tokens"));
        assert!(input > u64::from(2 * AUDIO_TOKENS) && input + output <= u64::from(N_CTX), "{body}");

        // A chat request that asks for those 896 tokens keeps OpenAI's meaning: refused.
        let chat = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Transcribe audio to text"}, audio_part(&clip)]}], "max_tokens": 896, "temperature": 0});
        let (status, reply) = post(&server.base, &chat).await;
        assert_eq!((status, reply["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{reply}");

        // 300 s: ten windows, 600 tokens of audio alone, more than the context.
        let longest = tone(300.0, 440.0, 8_000);
        let (status, _, body) = transcribe(&server.base, &[("file", Some("longest.wav"), &longest)]).await;
        assert_eq!(status, 400, "{body}");
        let error: Value = serde_json::from_str(&body).expect("an error envelope");
        assert_eq!(error["error"]["code"], "context_length_exceeded", "{body}");
        let (status, _, body) = transcribe(&server.base, &[("file", Some("long.wav"), &clip)]).await;
        assert_eq!(status, 200, "the server goes on: {body}");
    });
}

#[test]
fn damaged_pictures_and_clips_get_a_200_or_a_400_never_a_crash() {
    // The decoders (stb_image, miniaudio) behind the API, fed valid files with bytes changed:
    // seeded, so a failure replays.
    let vision = spawn_server(Engine::start(config_with(vision_projector())).expect("loads"));
    let audio = spawn_server(Engine::start(config_with(audio_projector())).expect("loads"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut rng = fastrand::Rng::with_seed(28);
        let picture = checkerboard();
        let clip = tone(0.5, 440.0, 16_000);
        let mut answered = [0usize; 2];
        for round in 0..40 {
            let part: fn(&[u8]) -> Value = if round % 2 == 0 { image_part } else { audio_part };
            let (server, mut bytes) =
                if round % 2 == 0 { (&vision.base, picture.clone()) } else { (&audio.base, clip.clone()) };
            // Headers are where decoders trust sizes: change bytes there more often.
            for _ in 0..rng.usize(1..6) {
                let at = if rng.bool() { rng.usize(..64.min(bytes.len())) } else { rng.usize(..bytes.len()) };
                bytes[at] = rng.u8(..);
            }
            if rng.u8(..4) == 0 {
                bytes.truncate(rng.usize(1..bytes.len()));
            }
            let body = json!({"messages": [{"role": "user", "content": [part(&bytes), {"type": "text", "text": "What is it?"}]}], "max_tokens": 1});
            let (status, answer) = post(server, &body).await;
            assert!(status == 200 || status == 400, "round {round}: {status} {answer}");
            if status == 400 {
                assert!(answer["error"]["param"].as_str().is_some_and(|p| p.starts_with("messages[0].content[0]")), "round {round}: {answer}");
            }
            answered[usize::from(status == 200)] += 1;
        }
        for server in [&vision.base, &audio.base] {
            let health = reqwest::get(format!("{server}/health")).await.expect("health");
            assert_eq!(health.status().as_u16(), 200, "the server is up");
        }
        assert!(answered[0] > 0 && answered[1] > 0, "both outcomes were exercised: {answered:?}");
    });
}

/// Turn 2 of the conversation about `media` after turn 1's `reply`.
fn turn2_again(media: &MediaInput, reply: &str) -> Vec<ChatMessage> {
    let mut turn = ask(media, "What is this?");
    turn.extend([ChatMessage::assistant(reply), ChatMessage::user("And its colour?")]);
    turn
}

#[test]
fn a_restart_brings_a_conversation_back_from_disk_with_its_picture() {
    let dir = std::env::temp_dir().join(format!("firstword-media-disk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = EngineConfig { cache_dir: Some(dir.clone()), cache_min_tokens: 16, ..config_with(vision_projector()) };
    let red = MediaInput::new(MediaKind::Image, red(), "test");
    let turn1 = ask(&red, "What is this?");
    let engine = Engine::start(config.clone()).expect("loads");
    let first = generate(&engine, request(Prompt::chat(turn1.clone(), Vec::new()), &[&red], 8));
    engine.wait_idle_blocking();
    drop(engine);
    let turn2 = turn2_again(&red, &first.text);

    // The conversation is live before the first request, the projector's load-time probe
    // notwithstanding (it runs before the restore): the first turn reads nothing from disk.
    let restarted = Engine::start(config.clone()).expect("loads");
    let status = restarted.cache_status();
    let disk = status.disk.clone().expect("the disk cache is on");
    assert_eq!(disk.entries.len(), 1, "{status:?}");
    assert!(status.live_tokens > first.usage.prompt_tokens, "{status:?}");
    assert_eq!(status.live_tokens, disk.entries[0].tokens, "the conversation is live before the first request");
    let second = generate(&restarted, request(Prompt::chat(turn2.clone(), Vec::new()), &[&red], 12));
    let cache = &second.timings.cache;
    eprintln!("after the restart: {} live tokens; the first turn {:?} {cache:?}", status.live_tokens, second.usage);
    assert_eq!((cache.source, cache.reason), (CacheSource::Disk, Some(CacheMiss::Restored)), "{cache:?}");
    assert_eq!(cache.restore, None, "the live sequence, restored at start, served the turn: {cache:?}");
    assert!(cache.reused > first.usage.prompt_tokens, "the picture and the reply come from disk: {cache:?}");
    drop(restarted);

    // An engine that never stopped: the same split, the same answer.
    let steady = Engine::start(EngineConfig { cache_dir: None, ..config.clone() }).expect("loads");
    let steady_first = generate(&steady, request(Prompt::chat(turn1, Vec::new()), &[&red], 8));
    assert_eq!(steady_first.text, first.text);
    let steady_second = generate(&steady, request(Prompt::chat(turn2, Vec::new()), &[&red], 12));
    assert_eq!(steady_second.usage.cached_tokens, second.usage.cached_tokens, "the same split on both sides");
    assert_eq!(second.text, steady_second.text, "the restored picture changed the answer");
    drop(steady);

    // Another projector file (here: the same one with bytes added, as an updated file would
    // be): its embeddings may differ at the picture's positions, so the file is not used.
    let changed = std::env::temp_dir().join(format!("firstword-media-projector-{}.gguf", std::process::id()));
    let mut bytes = std::fs::read(vision_projector()).expect("the projector");
    bytes.extend_from_slice(&[0; 64]);
    std::fs::write(&changed, bytes).expect("a changed projector");
    let other = Engine::start(EngineConfig { mmproj: Some(changed.clone()), ..config }).expect("loads");
    let again = generate(&other, request(Prompt::chat(turn2_again(&red, &first.text), Vec::new()), &[&red], 12));
    assert_ne!(again.timings.cache.source, CacheSource::Disk, "a state made with another projector was restored");
    drop(other);
    let _ = std::fs::remove_file(&changed);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `firstword serve` over SmolLM2 with the audio projector fixture, as a process of its own: a
/// decoder that aborts ends that process, which the test then sees.
fn serve_audio_process() -> (ServerProcess, String) {
    let args = ["--no-cache-dir", "-c", "2048", "-t", "2"].map(Into::into);
    let files = ["-m".into(), smollm2_path().into(), "--mmproj".into(), audio_projector().into()];
    ServerProcess::serve_drained(&[&args[..], &files[..]].concat(), |_| {})
}

/// The most memory process `pid` has held at once (Linux's VmHWM), in MiB.
fn peak_memory_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process's status");
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()).expect("a size in kB") / 1024
}

/// An MPEG-1 layer III frame header: 128 kbit/s, 44.1 kHz, mono (417-byte frames).
const MPEG_HEADER: [u8; 4] = [0xFF, 0xFB, 0x90, 0xC4];

/// A WAV of `data` bytes: `fmt ` chunk body `fmt`, then `extra` chunks, then the data.
fn wav_file(fmt: &[u8], extra: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = b"RIFF\0\0\0\0WAVEfmt ".to_vec();
    out.extend_from_slice(&(fmt.len() as u32).to_le_bytes());
    out.extend_from_slice(fmt);
    out.extend_from_slice(extra);
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    let riff = (out.len() - 8) as u32;
    out[4..8].copy_from_slice(&riff.to_le_bytes());
    out
}

/// A `fmt ` chunk's 16 bytes: format `tag`, one channel, `rate`, `bits` per sample.
fn fmt_chunk(tag: u16, rate: u32, bits: u16) -> Vec<u8> {
    let block = bits.div_ceil(8);
    [
        &tag.to_le_bytes()[..],
        &1u16.to_le_bytes(),
        &rate.to_le_bytes(),
        &(rate * u32::from(block)).to_le_bytes(),
        &block.to_le_bytes(),
        &bits.to_le_bytes(),
    ]
    .concat()
}

/// The clip: 4 MB of 8-bit WAV at 1 Hz (46 days to the decoder, ~238 GiB once resampled
/// to 16 kHz), with an MPEG frame header planted in its data.
fn wav_at_one_hertz() -> Vec<u8> {
    let mut data = vec![0x80; 4_000_000];
    data[1_000..1_004].copy_from_slice(&MPEG_HEADER);
    wav_file(&fmt_chunk(1, 1, 8), &[], &data)
}

/// Twenty MPEG frames, the first holding a Xing tag that claims 16 million of them.
fn mp3_claiming_millions_of_frames() -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..20 {
        out.extend_from_slice(&MPEG_HEADER);
        out.resize(out.len() + 413, 0);
    }
    // After the header and the side information of a mono MPEG-1 frame (17 bytes).
    out[21..25].copy_from_slice(b"Xing");
    out[25..29].copy_from_slice(&1u32.to_be_bytes());
    out[29..33].copy_from_slice(&16_000_000u32.to_be_bytes());
    out
}

/// A FLAC stream whose STREAMINFO claims 2^36 - 1 samples at 44.1 kHz, an MPEG frame header
/// planted in its padding.
fn flac_claiming_a_day() -> Vec<u8> {
    let mut info = Vec::new();
    info.extend_from_slice(&4096u16.to_be_bytes());
    info.extend_from_slice(&4096u16.to_be_bytes());
    info.extend_from_slice(&[0; 6]);
    let packed = (44_100u64 << 44) | (15 << 36) | ((1 << 36) - 1);
    info.extend_from_slice(&packed.to_be_bytes());
    info.extend_from_slice(&[0; 16]);
    let mut out = b"fLaC\x00\x00\x00\x22".to_vec();
    out.extend_from_slice(&info);
    out.extend_from_slice(&[0x81, 0x00, 0x01, 0x00]);
    out.extend_from_slice(&MPEG_HEADER);
    out.resize(out.len() + 252, 0);
    out
}

/// `WAVE_FORMAT_EXTENSIBLE` whose subformat is Microsoft ADPCM, with a `fact` chunk claiming
/// 4 billion samples.
fn extensible_adpcm() -> Vec<u8> {
    let mut fmt = fmt_chunk(0xFFFE, 16_000, 4);
    fmt[12..14].copy_from_slice(&256u16.to_le_bytes());
    fmt.extend_from_slice(&22u16.to_le_bytes());
    fmt.extend_from_slice(&4u16.to_le_bytes());
    fmt.extend_from_slice(&4u32.to_le_bytes());
    fmt.extend_from_slice(&[
        0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
    ]);
    let fact = [b"fact".as_slice(), &4u32.to_le_bytes(), &u32::MAX.to_le_bytes()].concat();
    wav_file(&fmt, &fact, &[0; 1024])
}

/// A chat turn holding `clip` as an `input_audio` part of `format` (none: unsaid).
fn audio_turn(clip: &[u8], format: Option<&str>) -> Value {
    let mut audio = json!({"data": common::media::base64(clip)});
    if let Some(format) = format {
        audio["format"] = json!(format);
    }
    json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": audio}, {"type": "text", "text": "What is it?"}]}], "max_tokens": 4, "temperature": 0})
}

#[test]
fn audio_a_decoder_would_blow_up_is_refused_before_it_runs_and_the_server_stays_up() {
    let (server, base) = serve_audio_process();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let good = audio_turn(&tone(1.0, 440.0, 16_000), Some("wav"));
        let (status, before) = post(&base, &good).await;
        assert_eq!(status, 200, "{before}");
        let peak = peak_memory_mib(server.id());
        let slow = wav_at_one_hertz();
        // A 10,000 × 10,000 PNG (300 MB as RGB) with an MPEG frame header in a text chunk.
        let picture = black_png(10_000, &MPEG_HEADER);
        let chats: Vec<(&str, Value)> = vec![
            ("a WAV at 1 Hz said to be mp3", audio_turn(&slow, Some("mp3"))),
            ("a WAV at 1 Hz", audio_turn(&slow, None)),
            (
                "an MP3 whose Xing tag claims 16 million frames",
                audio_turn(&mp3_claiming_millions_of_frames(), Some("mp3")),
            ),
            ("FLAC claiming 2^36 samples", audio_turn(&flac_claiming_a_day(), None)),
            ("extensible ADPCM with a fact chunk", audio_turn(&extensible_adpcm(), Some("wav"))),
            ("a 100-megapixel PNG as input_audio", audio_turn(&picture, None)),
        ];
        let client = reqwest::Client::new();
        for (what, body) in chats {
            let sent = client.post(format!("{base}/v1/chat/completions")).json(&body).send().await;
            let response = sent.unwrap_or_else(|e| panic!("{what}: no answer, the server died? {e}"));
            let status = response.status().as_u16();
            let answer: Value = response.json().await.expect("an error envelope");
            assert_eq!(status, 400, "{what}: {answer}");
            assert_eq!(answer["error"]["param"], "messages[0].content[0]", "{what}: {answer}");
            let health = client.get(format!("{base}/health")).send().await.expect("the server is up");
            assert_eq!(health.status().as_u16(), 200, "{what}");
        }
        let (status, _, body) = transcribe(&base, &[("file", Some("x.mp3"), &slow)]).await;
        let answer: Value = serde_json::from_str(&body).expect("an error envelope");
        assert_eq!((status, &answer["error"]["param"]), (400, &json!("file")), "{answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("WAV audio, not mp3")), "{answer}");

        let grown = peak_memory_mib(server.id()).saturating_sub(peak);
        eprintln!("peak memory grew by {grown} MiB over the refused parts");
        assert!(grown < 100, "the refused parts grew the server's peak memory by {grown} MiB");
        let (status, after) = post(&base, &good).await;
        assert_eq!(status, 200, "{after}");
        assert_eq!(after["choices"][0]["message"]["content"], before["choices"][0]["message"]["content"]);
    });
}

/// A request with a picture (or a clip) sent while another reply streams takes a lane: its
/// text chunks stop where the media starts, the media is evaluated whole into the lane's
/// sequence, and the reply is the one the request gives alone (a reference engine serving
/// the same requests one after the other: the same splits). The streaming reply goes on.
#[test]
fn a_request_with_media_takes_a_lane_beside_a_streaming_reply() {
    let system = common::long_system_prompt(300);
    for (projector, media) in [
        (vision_projector(), MediaInput::new(MediaKind::Image, red(), "test")),
        (audio_projector(), MediaInput::new(MediaKind::Audio, tone(1.0, 440.0, 16_000), "test")),
    ] {
        let config = EngineConfig { parallel: 3, ..config_with(projector) };
        let story = |engine: &Engine| {
            let end_of_turn: Vec<i32> = ["<|im_end|>", "<|endoftext|>"]
                .iter()
                .filter_map(|text| engine.tokenize_blocking(&Prompt::Text((*text).into())).ok()?.last().copied())
                .collect();
            let messages =
                vec![ChatMessage::system(&system), ChatMessage::user("Tell me a long story about a dragon.")];
            GenerationRequest {
                sampling: SamplingParams {
                    logit_bias: end_of_turn.iter().map(|&token| (token, f32::NEG_INFINITY)).collect(),
                    ..SamplingParams::greedy()
                },
                ..request(Prompt::chat(messages, Vec::new()), &[], 160)
            }
        };
        let question = vec![
            ChatMessage::system(&system),
            ChatMessage::user(format!("{}\nQuestion: What is this?", media.marker())),
        ];
        let asked = request(Prompt::chat(question, Vec::new()), &[&media], 12);

        let reference = Engine::start(config.clone()).expect("loads");
        generate(&reference, story(&reference));
        let alone = generate(&reference, asked.clone());
        drop(reference);

        let engine = Engine::start(config).expect("loads");
        let streaming = common::streaming(&engine, story(&engine));
        let (beside, beside_ended) = common::read(engine.submit(asked).expect("submitted"), None);
        let (story, story_ended) = streaming.join().expect("reader");
        eprintln!("{:?}: beside {:?} {:?}; alone {:?}", media.kind, beside.text, beside.timings.shared, alone.text);
        assert!(beside.timings.shared.is_some_and(|shared| shared.sequence > 0), "it took a lane");
        assert!(beside_ended < story_ended, "it ended before the story");
        assert!(beside.usage.cached_tokens > 0, "it shared the system prompt the story evaluated");
        assert_eq!(beside.usage.prompt_tokens, alone.usage.prompt_tokens, "the media's tokens are in the prompt");
        assert_eq!((&beside.text, beside.reason), (&alone.text, alone.reason), "the reply it gives alone");
        assert_eq!(story.usage.completion_tokens, 160, "the story went on to its limit");
    }
}
