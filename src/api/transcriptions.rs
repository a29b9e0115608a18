//! `POST /v1/audio/transcriptions` (OpenAI's multipart shape) for a model that takes audio: the
//! clip becomes a chat turn asking for its transcript, answered greedily by the loaded model, so
//! a voice pipeline can use one server for speech-to-text and the answer.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::FutureExt;
use serde_json::json;

use super::admission::{prepare_job, Prepared};
use super::answer::AnswerShaper;
use super::chat::{collect, start};
use super::convert::{convert_tool_choice, Constraints, FunctionShape, MediaParts, OutputPlan};
use super::error::{ApiError, Refusal};
use super::request_log::RequestRecord;
use super::AppState;
use crate::chat::ChatMessage;
use crate::engine::{GenerationRequest, ModelInfo, Prompt, SamplingParams};

/// Longest `language` and `prompt` fields, in bytes.
const MAX_FIELD_BYTES: usize = 4_096;

/// What the model is asked, as llama-server asks it.
const INSTRUCTION: &str = "Transcribe audio to text";

/// Most transcript tokens per started 30 s of audio (Whisper's decoder limit per window): a
/// model that does not stop is cut there, not at the server's generation cap. A ceiling, not
/// room the prompt must leave: a long clip in a small context is transcribed into what the
/// context has left after it.
const TOKENS_PER_WINDOW: f64 = 448.0;

/// A checked transcription request.
struct TranscriptionJob {
    request: GenerationRequest,
    output: OutputPlan,
    /// `json` or `text`.
    text_only: bool,
}

/// The handler.
pub(super) async fn transcriptions(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let record = RequestRecord::of(&request);
    let content_type = request.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let boundary = multer::parse_boundary(&content_type)
        .map_err(|_| ApiError::invalid("file", "a transcription request is multipart/form-data with a 'file'"))?;
    let model = state.engine.model_info()?;
    let Prepared { value: (job, rendered), permit } = prepare_job(
        &state,
        request,
        move |bytes| TranscriptionJob::parse(bytes, boundary, &model),
        |job: &TranscriptionJob| &job.request,
    )
    .await?;
    let (events, in_reasoning) = start(&state, job.request, rendered, permit).await?;
    let answer = collect(events, AnswerShaper::new(job.output, in_reasoning), &record).await?;
    let text = answer.ending.content.unwrap_or_default().trim().to_string();
    if job.text_only {
        return Ok(([(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response());
    }
    let usage = answer.usage;
    Ok(Json(json!({
        "text": text,
        "usage": {
            "type": "tokens",
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }))
    .into_response())
}

/// A form field as read: its name, the file name, and its bytes.
struct Field {
    name: String,
    file_name: Option<String>,
    bytes: Vec<u8>,
}

/// The fields of a multipart body, in order. The body is whole in memory: multer reads it
/// without ever waiting.
fn form_fields(bytes: &[u8], boundary: String) -> Result<Vec<Field>, ApiError> {
    let malformed = |e: multer::Error| ApiError::invalid("file", format!("the multipart body is malformed: {e}"));
    let body = axum::body::Bytes::copy_from_slice(bytes);
    let stream = futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut fields = Vec::new();
    loop {
        let next =
            multipart.next_field().now_or_never().ok_or_else(|| ApiError::Internal("multipart waited".into()))?;
        let Some(field) = next.map_err(malformed)? else { break };
        let name = field.name().unwrap_or_default().to_string();
        let file_name = field.file_name().map(str::to_string);
        let data = field.bytes().now_or_never().ok_or_else(|| ApiError::Internal("multipart waited".into()))?;
        fields.push(Field { name, file_name, bytes: data.map_err(malformed)?.to_vec() });
    }
    Ok(fields)
}

impl TranscriptionJob {
    /// Reads and checks a multipart body.
    fn parse(bytes: &[u8], boundary: String, model: &ModelInfo) -> Result<Self, ApiError> {
        let mut file = None;
        let (mut language, mut prompt, mut format, mut temperature) = (None, None, None, None);
        for field in form_fields(bytes, boundary)? {
            if field.name == "file" {
                file = Some((field.file_name, field.bytes));
                continue;
            }
            let Field { name, bytes, .. } = field;
            let text = || {
                if bytes.len() > MAX_FIELD_BYTES {
                    return Err(ApiError::refused(
                        Refusal::Limit,
                        name.as_str(),
                        format!("at most {MAX_FIELD_BYTES} bytes"),
                    ));
                }
                String::from_utf8(bytes.clone()).map_err(|_| ApiError::invalid(name.as_str(), "must be UTF-8 text"))
            };
            match name.as_str() {
                "model" => {}
                "language" => language = Some(text()?),
                "prompt" => prompt = Some(text()?),
                "response_format" => format = Some(text()?),
                "temperature" => temperature = Some(text()?),
                "stream" if text()? == "false" => {}
                "stream" => return Err(ApiError::invalid("stream", "streamed transcriptions are not supported")),
                other => {
                    return Err(ApiError::invalid(other, format!("'{other}' is not supported by this server")));
                }
            }
        }
        let (file_name, audio) = file.ok_or_else(|| ApiError::invalid("file", "the audio 'file' is missing"))?;
        let text_only = match format.as_deref().unwrap_or("json") {
            "json" => false,
            "text" => true,
            other => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!("response_format '{other}' is not supported; use json or text"),
                ))
            }
        };
        let temperature = match temperature {
            None => 0.0,
            Some(t) => t
                .trim()
                .parse::<f32>()
                .ok()
                .filter(|t| (0.0..=1.0).contains(t))
                .ok_or_else(|| ApiError::invalid("temperature", "a number from 0 to 1"))?,
        };
        let audio_format =
            file_name.as_deref().and_then(|name| name.rsplit_once('.')).map(|(_, ext)| ext.to_lowercase());
        let audio_format = match audio_format.as_deref() {
            Some("wav" | "wave") => Some("wav"),
            Some("mp3" | "mpga" | "mpeg") => Some("mp3"),
            Some(other) if !other.is_empty() => {
                return Err(ApiError::invalid("file", format!("'.{other}' files are not supported; send wav or mp3")))
            }
            _ => None,
        };
        let mut media = MediaParts::new(&model.media);
        let marker = media.audio_file(audio, audio_format, "file")?;
        let mut ask = prompt.filter(|p| !p.trim().is_empty()).unwrap_or_else(|| INSTRUCTION.to_string());
        if let Some(language) = language.filter(|l| !l.trim().is_empty()) {
            ask.push_str(&format!(" (language: {language})"));
        }
        // LFM2's audio models are asked in their system prompt, as llama-server does.
        let messages = if model.architecture.starts_with("lfm2") {
            vec![ChatMessage::system("Perform ASR."), ChatMessage::user(marker)]
        } else {
            vec![ChatMessage::user(format!("{ask}\n{marker}"))]
        };
        let choice = convert_tool_choice(None, FunctionShape::Nested)?;
        let constraints = Constraints::new(model, &[], &choice, false, None)?;
        let sampling = SamplingParams { temperature, ..SamplingParams::greedy() };
        let max_tokens = (TOKENS_PER_WINDOW * (media.audio_seconds() / 30.0).ceil().max(1.0)) as u32;
        let request = GenerationRequest {
            prompt: Prompt::chat(messages, Vec::new()),
            sampling,
            max_tokens: Some(max_tokens),
            max_tokens_is_ceiling: true,
            media: media.into_inputs(),
            ..GenerationRequest::chat(Vec::new())
        };
        Ok(Self { request, output: constraints.output, text_only })
    }
}
