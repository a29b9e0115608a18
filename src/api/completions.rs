//! `POST /v1/completions`: OpenAI's legacy text completions. The prompt (text, or token ids) is
//! continued as it is, without a chat template, on the same engine and prefix cache as chat.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::admission::{prepare_job, Prepared};
use super::answer::AnswerShaper;
use super::chat::{collect, random_id, start, stream_response, EventFramer, Framed, SsePayload};
use super::convert::OutputPlan;
use super::error::ApiError;
use super::extract::parse_json;
use super::frame::{json, wire_timings, wire_usage, ResponseMeta, DONE};
use super::logprobs::TextLogprobs;
use super::request_log::RequestRecord;
use super::sampling::{token_limit, SamplingFields};
use super::wire::WireTimings;
use super::{unix_now, AppState};
use crate::chat::tools::ToolFormat;
use crate::engine::{Event, FinishReason, GenerationRequest, ModelInfo, Prompt, TokenLogprob};

/// OpenAI's default `max_tokens` for text completions.
const DEFAULT_MAX_TOKENS: u32 = 16;
/// Most alternatives the legacy `logprobs` may ask for (OpenAI's limit).
const MAX_LEGACY_LOGPROBS: i64 = 5;

/// The endpoint's own fields (the shared ones are read as [`SamplingFields`]).
#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: Option<WirePrompt>,
    suffix: Option<String>,
    echo: Option<bool>,
    best_of: Option<i64>,
    logprobs: Option<i64>,
}

/// `prompt`: text or token ids, alone or as a list of one.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WirePrompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// A validated text completion.
struct CompletionJob {
    request: GenerationRequest,
    stream: bool,
    include_usage: bool,
    model: String,
}

/// Parses and checks a body.
fn into_job(bytes: &[u8], model: &ModelInfo) -> Result<CompletionJob, ApiError> {
    let body: CompletionRequest = parse_json(bytes)?;
    let mut shared: SamplingFields = parse_json(bytes)?;
    if body.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "'suffix' (fill-in-the-middle) is not supported by this server"));
    }
    if body.echo == Some(true) {
        return Err(ApiError::invalid("echo", "'echo' is not supported by this server; only echo=false"));
    }
    if let Some(n) = body.best_of.filter(|&n| n != 1) {
        return Err(ApiError::invalid("best_of", format!("only best_of=1 is supported, got {n}")));
    }
    let logprobs = match body.logprobs {
        Some(n) if !(0..=MAX_LEGACY_LOGPROBS).contains(&n) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("'logprobs' must be between 0 and {MAX_LEGACY_LOGPROBS}, got {n}"),
            ))
        }
        n => n.map(|n| n as u32),
    };
    let request = GenerationRequest {
        prompt: convert_prompt(body.prompt)?,
        max_tokens: Some(token_limit("max_tokens", shared.max_tokens)?.unwrap_or(DEFAULT_MAX_TOKENS)),
        max_tokens_is_ceiling: false,
        stop: shared.stops()?,
        sampling: shared.sampling(model)?,
        grammar: None,
        preserved_tokens: Vec::new(),
        logprobs,
        reasoning_budget: None,
        pregenerate: None,
        reuse_after_change: shared.reuse_after_change,
        media: Vec::new(),
    };
    Ok(CompletionJob {
        request,
        stream: shared.stream.unwrap_or(false),
        include_usage: shared.include_usage(),
        model: shared.model_name(model),
    })
}

fn convert_prompt(prompt: Option<WirePrompt>) -> Result<Prompt, ApiError> {
    let tokens = |ids: Vec<i64>| {
        ids.into_iter()
            .map(|id| i32::try_from(id).map_err(|_| ApiError::invalid("prompt", format!("{id} is not a token id"))))
            .collect::<Result<Vec<i32>, _>>()
            .map(Prompt::Tokens)
    };
    let one = |count: usize| {
        ApiError::invalid("prompt", format!("one prompt per request is supported, got a list of {count}"))
    };
    match prompt {
        None => Err(ApiError::invalid("prompt", "'prompt' is required")),
        Some(WirePrompt::Text(text)) => Ok(Prompt::Text(text)),
        Some(WirePrompt::Texts(texts)) => match <[String; 1]>::try_from(texts) {
            Ok([text]) => Ok(Prompt::Text(text)),
            Err(texts) => Err(one(texts.len())),
        },
        Some(WirePrompt::Tokens(ids)) => tokens(ids),
        Some(WirePrompt::TokenLists(lists)) => match <[Vec<i64>; 1]>::try_from(lists) {
            Ok([ids]) => tokens(ids),
            Err(lists) => Err(one(lists.len())),
        },
    }
}

/// The one choice of a text completion (whole or a stream's chunk).
#[derive(Debug, Serialize)]
struct TextChoice {
    text: String,
    index: u32,
    logprobs: Option<TextLogprobs>,
    finish_reason: Option<&'static str>,
}

/// A text completion object.
const OBJECT: &str = "text_completion";

fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// The handler.
pub(super) async fn completions(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let record = RequestRecord::of(&request);
    let model = state.engine.model_info()?;
    let Prepared { value: (job, rendered), permit } =
        prepare_job(&state, request, move |bytes| into_job(bytes, &model), |job| &job.request).await?;
    let logprobs = job.request.logprobs.is_some().then(TextLogprobs::default);
    let (events, _) = start(&state, job.request, rendered, permit).await?;
    let meta = ResponseMeta { id: format!("cmpl-{}", random_id()), model: job.model, created: unix_now() };
    if job.stream {
        let framer = TextFramer { meta, include_usage: job.include_usage, logprobs, offset: 0, pending: Vec::new() };
        return Ok(stream_response(events, framer, record).into_response());
    }
    // The text as it is: no calls, no schema, no reasoning to look for.
    let plan = OutputPlan { format: ToolFormat::generic(), tools: None, schema: None, reasoning: None };
    let answer = collect(events, AnswerShaper::new(plan, false), &record).await?;
    let choice = TextChoice {
        text: answer.ending.content.unwrap_or_default(),
        index: 0,
        logprobs: logprobs.map(|_| TextLogprobs::of(answer.logprobs, 0).0),
        finish_reason: Some(answer.ending.finish_reason),
    };
    let mut body = meta.object(OBJECT, vec![choice]);
    body.usage = Some(wire_usage(answer.usage));
    body.timings = Some(wire_timings(answer.usage, answer.timings));
    Ok(Json(body).into_response())
}

/// A completion's stream: a chunk per piece of text (with its tokens' log-probabilities when
/// asked), the finish chunk, the usage chunk when asked, `[DONE]`.
struct TextFramer {
    meta: ResponseMeta,
    include_usage: bool,
    /// The lists for the next chunk; `None` when not asked for.
    logprobs: Option<TextLogprobs>,
    /// Characters of text before the next token.
    offset: usize,
    /// Tokens whose text is in the next piece.
    pending: Vec<TokenLogprob>,
}

impl TextFramer {
    /// Moves the pending tokens into the lists.
    fn take_logprobs(&mut self) {
        if let Some(lists) = self.logprobs.as_mut() {
            let (more, offset) = TextLogprobs::of(std::mem::take(&mut self.pending), self.offset);
            self.offset = offset;
            lists.extend(more);
        }
    }

    /// A chunk of `text` with the log-probabilities of its tokens.
    fn chunk(&mut self, text: String, finish_reason: Option<&'static str>, timings: Option<WireTimings>) -> SsePayload {
        self.take_logprobs();
        let logprobs = self.logprobs.as_mut().map(std::mem::take);
        let mut chunk = self.meta.object(OBJECT, vec![TextChoice { text, index: 0, logprobs, finish_reason }]);
        chunk.timings = timings;
        SsePayload::data(json(&chunk))
    }
}

impl EventFramer for TextFramer {
    fn first_events(&mut self) -> Vec<SsePayload> {
        Vec::new()
    }

    fn frame(&mut self, event: Option<Event>) -> Framed {
        let (events, done) = match event {
            Some(Event::Started { .. }) => (Vec::new(), false),
            Some(Event::Logprobs(tokens)) => {
                self.pending.extend(tokens);
                (Vec::new(), false)
            }
            Some(Event::Text(text)) => (vec![self.chunk(text, None, None)], false),
            Some(Event::Finished { reason, usage, timings }) => {
                let timings = Some(wire_timings(usage, timings));
                let mut events = vec![self.chunk(String::new(), Some(finish_reason(reason)), timings)];
                if self.include_usage {
                    let mut usage_chunk = self.meta.object::<TextChoice>(OBJECT, Vec::new());
                    usage_chunk.usage = Some(wire_usage(usage));
                    events.push(SsePayload::data(json(&usage_chunk)));
                }
                events.push(done());
                (events, true)
            }
            Some(Event::Failed(e)) => (vec![SsePayload::data(ApiError::from(e).to_json()), done()], true),
            None => (vec![SsePayload::data(ApiError::EngineStopped.to_json()), done()], true),
        };
        Framed { events, finish_now: false, done }
    }
}

fn done() -> SsePayload {
    SsePayload::data(DONE.to_string())
}

#[cfg(feature = "fuzzing")]
impl crate::fuzzing::Api {
    /// Parses and validates a `POST /v1/completions` body as the endpoint does: the engine
    /// request, or the error the client would get.
    ///
    /// # Errors
    /// The [`ApiError`] the endpoint answers with.
    pub fn validate_completion(body: &[u8], model: &ModelInfo) -> Result<GenerationRequest, ApiError> {
        into_job(body, model).map(|job| job.request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tests::model;

    fn job(body: serde_json::Value) -> Result<CompletionJob, ApiError> {
        into_job(body.to_string().as_bytes(), &model())
    }

    #[test]
    fn a_text_prompt_gets_openai_defaults() {
        let job = job(serde_json::json!({"prompt": "Once upon"})).expect("accepted");
        assert!(matches!(&job.request.prompt, Prompt::Text(t) if t == "Once upon"));
        assert_eq!(job.request.max_tokens, Some(DEFAULT_MAX_TOKENS));
        assert_eq!((job.stream, job.request.logprobs), (false, None));
    }

    #[test]
    fn token_prompts_and_single_item_lists_are_accepted() {
        let ids = job(serde_json::json!({"prompt": [1, 2, 3], "logprobs": 2})).expect("accepted");
        assert!(matches!(&ids.request.prompt, Prompt::Tokens(t) if t == &[1, 2, 3]));
        assert_eq!(ids.request.logprobs, Some(2));
        let listed = job(serde_json::json!({"prompt": ["Hi"], "max_tokens": 4})).expect("accepted");
        assert!(matches!(&listed.request.prompt, Prompt::Text(t) if t == "Hi"));
        assert_eq!(listed.request.max_tokens, Some(4));
        assert!(job(serde_json::json!({"prompt": [[5, 6]]})).is_ok());
    }

    #[test]
    fn what_the_server_cannot_do_is_a_400_naming_the_field() {
        let cases = [
            (serde_json::json!({}), "prompt"),
            (serde_json::json!({"prompt": ["a", "b"]}), "prompt"),
            (serde_json::json!({"prompt": [1, 99999999999i64]}), "prompt"),
            (serde_json::json!({"prompt": "x", "suffix": "}"}), "suffix"),
            (serde_json::json!({"prompt": "x", "echo": true}), "echo"),
            (serde_json::json!({"prompt": "x", "best_of": 3}), "best_of"),
            (serde_json::json!({"prompt": "x", "logprobs": 6}), "logprobs"),
            (serde_json::json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
            (serde_json::json!({"prompt": "x", "temperature": 3}), "temperature"),
            (serde_json::json!({"prompt": "x", "n": 2}), "n"),
            (serde_json::json!({"prompt": {"text": "x"}}), "prompt"),
        ];
        for (body, param) in cases {
            let Err(error) = job(body.clone()) else { panic!("{body} was accepted") };
            assert_eq!(error.status(), axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(error.param().as_deref(), Some(param), "{body}: {error}");
        }
    }
}
