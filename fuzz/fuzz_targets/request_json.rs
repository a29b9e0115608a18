//! Request JSON → validation: arbitrary bytes as a `POST /v1/chat/completions` body, and as
//! `/v1/completions` and `/v1/responses` bodies.
//!
//! Input: the body. Its length picks the model's call format (`common::format`), so every
//! format's grammar envelope is built.
//!
//! Checks: validation never panics; a refusal is a 4xx whose envelope is JSON naming the same
//! field; an accepted chat body's messages and tools all reach the engine request, with
//! sampling values in their documented ranges, at most the allowed stop strings (plus the
//! format's openers when calls are not allowed), logit biases inside the vocabulary, and a
//! grammar whose root rule is defined, and media parts (a projector taking images and audio)
//! within the limits, each standing in a message as its marker; the other endpoints' accepted bodies have sampling in
//! range and a defined grammar root too.

#![no_main]

mod common;

use firstword::engine::media::{check_media, MediaKind, MediaSupport, MAX_MEDIA_BYTES, MAX_MEDIA_PARTS};
use firstword::engine::TemplateSource;
use firstword::fuzzing::Api;
use firstword::{GenerationRequest, ModelInfo, Prompt};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|body: &[u8]| {
    let format = common::format(body.len() as u8);
    let model = ModelInfo {
        id: "fuzz-model".into(),
        architecture: "llama".into(),
        n_ctx: 4096,
        n_ctx_train: 8192,
        n_vocab: 32_000,
        n_swa: None,
        template_source: TemplateSource::Gguf,
        tool_format: format.clone(),
        reasoning: None,
        threads: 1,
        threads_batch: 1,
        // A projector taking both kinds: media parts are decoded and checked on their headers.
        media: MediaSupport { projector: Some("fuzz.gguf".into()), image: true, audio: true, refused: None },
        n_params: 135_000_000,
        size_bytes: 90_000_000,
        file_type: Some(3),
    };
    for other in [Api::validate_completion(body, &model), Api::validate_response(body, &model)] {
        match other {
            Ok(request) => check_request(&request, &model),
            Err(error) => check_refusal(&error),
        }
    }
    let request = match Api::validate_request(body, &model) {
        Ok(request) => request,
        Err(error) => return check_refusal(&error),
    };
    let Prompt::Chat { messages, tools, .. } = &request.prompt else { panic!("a chat request") };
    // Unknown fields are ignored unread, so they may hold numbers beyond f64 that `Value` refuses.
    if let Ok(body) = serde_json::from_slice::<Value>(body) {
        assert_eq!(Some(messages.len()), body["messages"].as_array().map(Vec::len), "every message");
        assert_eq!(tools.len(), body["tools"].as_array().map_or(0, Vec::len), "every tool");
    }
    check_request(&request, &model);
    // Every media part kept is within the limits and stands in a message as its marker.
    assert!(request.media.len() <= MAX_MEDIA_PARTS);
    for media in &request.media {
        assert!(media.bytes.len() <= MAX_MEDIA_BYTES && !media.bytes.is_empty());
        assert!(messages.iter().any(|m| m.content.contains(&media.marker())), "the marker is in a message");
        assert!(check_media(media.kind, &media.bytes, None).is_ok() || media.kind == MediaKind::Audio);
    }
    let openers = format.openers();
    let asked: Vec<&String> = request.stop.iter().filter(|s| !openers.contains(s)).collect();
    assert!(asked.len() <= 4 && asked.iter().all(|s| s.len() <= 256), "{:?}", request.stop);
});

/// A refusal is a 4xx whose envelope is JSON naming the same field.
fn check_refusal(error: &firstword::api::ApiError) {
    assert!(error.status().is_client_error(), "{:?}: {error}", error.status());
    let envelope: Value = serde_json::from_str(&error.to_json()).expect("the envelope is JSON");
    assert!(envelope["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{envelope}");
    assert_eq!(envelope["error"]["param"].as_str(), error.param().as_deref(), "{envelope}");
}

/// An accepted request's sampling values lie in their documented ranges, its logit biases in
/// the vocabulary, and its grammar's root rule is defined.
fn check_request(request: &GenerationRequest, model: &ModelInfo) {
    let sampling = &request.sampling;
    assert!((0.0..=2.0).contains(&sampling.temperature) && (0.0..=1.0).contains(&sampling.top_p));
    assert!((0.0..=1.0).contains(&sampling.min_p) && sampling.top_k >= 0 && sampling.repeat_penalty > 0.0);
    assert!((0..=model.n_ctx as i32).contains(&sampling.repeat_last_n));
    assert!(sampling
        .logit_bias
        .iter()
        .all(|&(token, bias)| (0..model.n_vocab).contains(&token) && bias.abs() <= 100.0));
    assert!(request.max_tokens.is_none_or(|m| m >= 1));
    assert!(request.logprobs.is_none_or(|n| n <= 20));
    if let Some(grammar) = &request.grammar {
        let root = format!("{} ::=", grammar.root);
        assert!(grammar.gbnf.lines().any(|line| line.starts_with(&root)), "root defined: {}", grammar.gbnf);
    }
}
