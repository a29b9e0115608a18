//! One chat-completions request, timed from the client's side: the status, then either the
//! JSON answer or the SSE stream, event by event, and last the metrics.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::report::Row;

/// A streamed tool call as rebuilt from its deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct StreamedCall {
    /// `id`, from the call's first delta.
    pub id: String,
    /// The function name.
    pub name: String,
    /// Arguments, concatenated.
    pub arguments: String,
    /// How often `id` or `name` came again for the same call (clients concatenate them).
    pub repeated_header: u32,
}

/// What the server replied to one request, streamed or not.
#[derive(Debug, Default)]
pub(super) struct ServerReply {
    /// Content text.
    pub content: String,
    /// Tool calls (streamed or not).
    pub calls: Vec<StreamedCall>,
    /// The final `finish_reason`.
    pub finish_reason: Option<String>,
    /// Non-streamed: the assistant message as returned (for the follow-up turn).
    pub message: Option<Value>,
    /// Streamed: when each delta with content or tool calls came, since the request was sent.
    pub delta_at: Vec<Duration>,
}

/// The `data:` payloads of the complete events in `text`, in order, as an SSE client reads
/// them: events end at a blank line, `data:` and one space after it are cut off, comments
/// and keep-alives are skipped. Text after the last blank line is an event still arriving
/// and is not read. Each `data:` line is one payload (OpenAI-compatible servers send one per
/// event).
///
/// ```
/// let body = ": keep-alive\n\ndata: {\"a\":1}\n\ndata: [DONE]\n\ndata: {\"cut";
/// let payloads: Vec<&str> = firstword::bench::sse_data(body).collect();
/// assert_eq!(payloads, ["{\"a\":1}", "[DONE]"]);
/// ```
pub fn sse_data(text: &str) -> impl Iterator<Item = &str> {
    let complete = text.rfind("\n\n").map_or("", |end| &text[..end]);
    complete.split("\n\n").flat_map(str::lines).filter_map(|line| {
        let data = line.strip_prefix("data:")?;
        Some(data.strip_prefix(' ').unwrap_or(data))
    })
}

/// Sends one request and fills the row's timings, tokens and status. Never fails: problems
/// end up in `row.error`.
/// Posts `body` to `/v1/prefill`; the status, or `None` when no answer came.
pub(super) async fn prefill(client: reqwest::Client, base: String, body: Value) -> Option<u16> {
    let response = client.post(format!("{base}/v1/prefill")).json(&body).send().await.ok()?;
    let status = response.status().as_u16();
    // Read to the end, so the server is not left writing into a closed connection.
    let _ = response.bytes().await;
    Some(status)
}

pub(super) async fn send(client: &reqwest::Client, base: &str, body: &Value, row: &mut Row) -> ServerReply {
    send_watched(client, base, body, row, None).await
}

/// [`send`], publishing on `progress` how many deltas with content or tool calls have come
/// (a streamed request), so that another request can be sent while this one streams.
pub(super) async fn send_watched(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
    row: &mut Row,
    progress: Option<tokio::sync::watch::Sender<u64>>,
) -> ServerReply {
    let start = Instant::now();
    match exchange(client, base, body, row, start, progress).await {
        Ok(reply) => {
            row.total_ms = Some(ms(start.elapsed()));
            reply
        }
        Err(error) => {
            row.error = error;
            ServerReply::default()
        }
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Posts `body` and reads the reply the way it was asked for (streamed or not).
async fn exchange(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
    row: &mut Row,
    start: Instant,
    progress: Option<tokio::sync::watch::Sender<u64>>,
) -> Result<ServerReply, String> {
    let url = format!("{}/v1/chat/completions", base.trim_end_matches('/'));
    let response = client.post(&url).json(body).send().await.map_err(|e| format!("unreachable: {e}"))?;
    let response = check_status(response, row).await?;
    if body["stream"] == Value::Bool(true) {
        read_stream(response, row, start, progress).await
    } else {
        read_answer(response, row, start).await
    }
}

/// Records the HTTP status; a failure status is an error quoting the start of the body.
async fn check_status(response: reqwest::Response, row: &mut Row) -> Result<reqwest::Response, String> {
    row.http_status = response.status().as_u16();
    if response.status().is_success() {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    Err(format!("HTTP {}: {}", row.http_status, error_message(&text)))
}

/// What a failure's body says: an OpenAI error envelope's `error.message`, else the start of
/// the body.
fn error_message(body: &str) -> String {
    let envelope = serde_json::from_str::<Value>(body).ok();
    let message = envelope.as_ref().and_then(|v| v["error"]["message"].as_str()).unwrap_or(body);
    message.chars().take(200).collect()
}

/// A non-streamed answer: its first choice, its usage, and TTFT as the time to the whole answer.
async fn read_answer(response: reqwest::Response, row: &mut Row, start: Instant) -> Result<ServerReply, String> {
    let text = response.text().await.map_err(|e| format!("reading the answer: {e}"))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|_| format!("not an OpenAI answer: {}", text.chars().take(120).collect::<String>()))?;
    row.ttft_ms = Some(ms(start.elapsed()));
    read_usage(&value, row);
    let choice = value["choices"].get(0).ok_or("the answer has no choices")?;
    let message = choice["message"].clone();
    let calls = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| StreamedCall {
                    id: c["id"].as_str().unwrap_or_default().into(),
                    name: c["function"]["name"].as_str().unwrap_or_default().into(),
                    arguments: c["function"]["arguments"].as_str().unwrap_or_default().into(),
                    repeated_header: 0,
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(ServerReply {
        content: message["content"].as_str().unwrap_or_default().to_string(),
        calls,
        finish_reason: choice["finish_reason"].as_str().map(String::from),
        message: Some(message),
        delta_at: Vec::new(),
    })
}

/// A streamed answer: the SSE framing, each event as it arrives, then the metrics.
async fn read_stream(
    mut response: reqwest::Response,
    row: &mut Row,
    start: Instant,
    progress: Option<tokio::sync::watch::Sender<u64>>,
) -> Result<ServerReply, String> {
    let mut stream = StreamRead { progress, ..StreamRead::default() };
    let mut buffer = String::new();
    while let Some(events) = next_events(&mut response, &mut buffer).await? {
        for data in sse_data(&events) {
            stream.data(data.trim(), row, start)?;
        }
    }
    stream.finish(row)
}

/// Reads `response` until at least one whole SSE event has arrived and returns the whole
/// events received (what follows the last one stays in `buffer`); `None` at the stream's end.
async fn next_events(response: &mut reqwest::Response, buffer: &mut String) -> Result<Option<String>, String> {
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("stream broke: {e}"))? {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(end) = buffer.rfind("\n\n") {
            return Ok(Some(buffer.drain(..end + 2).collect()));
        }
    }
    Ok(None)
}

/// A stream as read so far: the reply, and when its deltas came.
#[derive(Default)]
struct StreamRead {
    reply: ServerReply,
    /// Since the request: the first and the last delta with content or tool calls.
    first: Option<Duration>,
    last: Option<Duration>,
    /// Deltas with content or tool calls.
    deltas: u64,
    /// `[DONE]` came.
    done: bool,
    /// Since the request: the first `finish_reason`.
    finished_at: Option<Duration>,
    /// Where the count of deltas is published as they come.
    progress: Option<tokio::sync::watch::Sender<u64>>,
}

impl StreamRead {
    /// One `data:` payload: a chunk, an error event or `[DONE]`.
    fn data(&mut self, data: &str, row: &mut Row, start: Instant) -> Result<(), String> {
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let value: Value = serde_json::from_str(data)
            .map_err(|_| format!("not an OpenAI stream: {}", data.chars().take(120).collect::<String>()))?;
        if let Some(error) = value.get("error") {
            return Err(format!("error event: {error}"));
        }
        read_usage(&value, row);
        let Some(choice) = value["choices"].get(0) else { return Ok(()) };
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.reply.finish_reason = Some(reason.to_string());
            self.finished_at.get_or_insert(start.elapsed());
        }
        self.delta(&choice["delta"], row, start);
        Ok(())
    }

    /// A chunk's delta: content text (and when the first sentence is complete) and tool calls.
    fn delta(&mut self, delta: &Value, row: &mut Row, start: Instant) {
        let content = delta["content"].as_str().unwrap_or_default();
        let calls = delta["tool_calls"].as_array().filter(|c| !c.is_empty());
        if content.is_empty() && calls.is_none() {
            return;
        }
        let now = start.elapsed();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.deltas += 1;
        self.reply.delta_at.push(now);
        if let Some(progress) = &self.progress {
            progress.send_replace(self.deltas);
        }
        if !content.is_empty() {
            self.reply.content.push_str(content);
            if row.first_sentence_ms.is_none() && sentence_complete(&self.reply.content) {
                row.first_sentence_ms = Some(ms(now));
            }
        }
        for call in calls.into_iter().flatten() {
            merge_call_delta(&mut self.reply.calls, call);
        }
    }

    /// The stream has ended: TTFT, first sentence, completion tokens and decode speed.
    fn finish(self, row: &mut Row) -> Result<ServerReply, String> {
        if !self.done {
            return Err("the stream ended without [DONE]".into());
        }
        // An empty reply (the model ended its turn at once) is an answer too: its first token
        // is the end.
        let first =
            self.first.or(self.finished_at).ok_or("neither content, tool calls nor a finish_reason was streamed")?;
        row.ttft_ms = Some(ms(first));
        if row.first_sentence_ms.is_none() && ends_sentence(self.reply.content.trim_end()) {
            row.first_sentence_ms = self.last.map(ms);
        }
        let generated = row.completion_tokens.unwrap_or(self.deltas);
        row.completion_tokens = Some(generated);
        if let Some(last) = self.last {
            let window = (last - first).as_secs_f64();
            if generated > 1 && window > 0.0 {
                row.decode_tok_s = Some((generated - 1) as f64 / window);
            }
        }
        Ok(self.reply)
    }
}
/// Where a cancelled request stops reading (and drops its connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CancelAt {
    /// After this many deltas with content.
    Deltas(u64),
    /// Once the content holds a complete sentence, or after this many deltas without one
    /// (the user interrupts a long first sentence).
    FirstSentence {
        /// Deltas after which the reply is cancelled without a complete sentence.
        or_deltas: u64,
    },
}

/// Streams `body` until `at`, then drops the connection, as a client that cancels does.
/// Returns the content received and the TTFT, ms; an error where the stream failed or ended
/// first (a reply shorter than the cut is no cancel).
pub(super) async fn send_cancelled(
    client: &reqwest::Client,
    base: &str,
    body: &Value,
    at: CancelAt,
) -> Result<(String, f64), String> {
    let start = Instant::now();
    let mut row = Row::new("", 0, super::Scenario::Warm, 0);
    let url = format!("{}/v1/chat/completions", base.trim_end_matches('/'));
    let response = client.post(&url).json(body).send().await.map_err(|e| format!("unreachable: {e}"))?;
    let mut response = check_status(response, &mut row).await?;
    let mut stream = StreamRead::default();
    let mut buffer = String::new();
    while let Some(events) = next_events(&mut response, &mut buffer).await? {
        for data in sse_data(&events) {
            stream.data(data.trim(), &mut row, start)?;
        }
        let reached = match at {
            CancelAt::Deltas(n) => stream.deltas >= n,
            CancelAt::FirstSentence { or_deltas } => {
                sentence_complete(&stream.reply.content) || stream.deltas >= or_deltas
            }
        };
        if reached {
            let ttft = stream.first.map_or(0.0, ms);
            // Dropping the response closes the connection: the server sees the client leave.
            drop(response);
            return Ok((stream.reply.content, ttft));
        }
    }
    Err(format!("the reply ended before it was cancelled ({at:?}): {:?}", stream.reply.content))
}

/// The part of a reply spoken before the user interrupted: up to the end of its first
/// sentence (`.`, `!` or `?` followed by whitespace), without that whitespace; the whole reply
/// when it has no complete sentence.
pub(super) fn spoken_part(reply: &str) -> &str {
    let mut previous = None;
    for (at, c) in reply.char_indices() {
        if let Some(end) = previous {
            if c.is_whitespace() {
                return &reply[..end];
            }
        }
        previous = matches!(c, '.' | '!' | '?').then_some(at + c.len_utf8());
    }
    reply
}

/// Token counts from `usage`, speculative-decoding counts from llama-server-style `timings`,
/// and where the prompt's cache came from (`timings.cache.source` and `.reason`, firstword).
fn read_usage(value: &Value, row: &mut Row) {
    let usage = &value["usage"];
    if let Some(n) = usage["prompt_tokens"].as_u64() {
        row.prompt_tokens = Some(n);
    }
    if let Some(n) = usage["completion_tokens"].as_u64() {
        row.completion_tokens = Some(n);
    }
    if let Some(n) = usage["prompt_tokens_details"]["cached_tokens"].as_u64() {
        row.cached_tokens = Some(n);
    }
    let timings = &value["timings"];
    if let Some(n) = timings["draft_n"].as_u64() {
        row.draft_n = Some(n);
    }
    if let Some(n) = timings["draft_n_accepted"].as_u64() {
        row.draft_n_accepted = Some(n);
    }
    let cache = &timings["cache"];
    for (field, value) in [(&mut row.cache_source, &cache["source"]), (&mut row.cache_reason, &cache["reason"])] {
        match value {
            Value::Null => {}
            Value::String(text) => *field = Some(text.clone()),
            other => *field = Some(other.to_string()),
        }
    }
    // Streams read every chunk: only the one with timings sets them.
    if let Some(ms) = cache["save_ms"].as_f64() {
        row.cache_save_ms = Some(ms);
    }
    if let Some(ms) = cache["restore_ms"].as_f64() {
        row.cache_restore_ms = Some(ms);
    }
    if let Some(n) = cache["adopted"].as_u64() {
        row.adopted_tokens = Some(n);
    }
}

/// Adds one `delta.tool_calls[]` element to the calls, by `index`, as clients do.
fn merge_call_delta(calls: &mut Vec<StreamedCall>, delta: &Value) {
    let index = delta["index"].as_u64().unwrap_or(calls.len().saturating_sub(1) as u64) as usize;
    if calls.len() <= index {
        calls.resize(index + 1, StreamedCall::default());
    }
    let call = &mut calls[index];
    if let Some(id) = delta["id"].as_str() {
        call.repeated_header += u32::from(!call.id.is_empty());
        call.id.push_str(id);
    }
    if let Some(name) = delta["function"]["name"].as_str() {
        call.repeated_header += u32::from(!call.name.is_empty());
        call.name.push_str(name);
    }
    if let Some(arguments) = delta["function"]["arguments"].as_str() {
        call.arguments.push_str(arguments);
    }
}

/// Whether `text` holds a complete sentence: `.`, `!` or `?` followed by whitespace.
fn sentence_complete(text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    chars.windows(2).any(|w| matches!(w[0], '.' | '!' | '?') && w[1].is_whitespace())
}

fn ends_sentence(text: &str) -> bool {
    text.ends_with(['.', '!', '?'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sentences_end_at_punctuation_and_space() {
        assert!(!sentence_complete("Hello there"));
        assert!(!sentence_complete("3.14 is pi"));
        assert!(sentence_complete("Hi. How"));
        assert!(ends_sentence("Done!"));
    }

    #[test]
    fn the_spoken_part_ends_with_the_first_sentence() {
        assert_eq!(spoken_part("Sure. The trains are in fact 3."), "Sure.");
        assert_eq!(spoken_part("Pi is 3.14! Really?\nYes"), "Pi is 3.14!");
        assert_eq!(spoken_part("Ça va? Oui."), "Ça va?");
        assert_eq!(spoken_part("No sentence end yet"), "No sentence end yet");
        assert_eq!(spoken_part("Ends here."), "Ends here.");
        assert!(sentence_complete("Sure. The"), "a cancel at the first sentence sees it complete");
    }

    #[test]
    fn sse_data_reads_only_complete_events() {
        let stream = "data: {\"a\":1}\n\n: comment\n\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n";
        assert_eq!(sse_data(stream).collect::<Vec<_>>(), ["{\"a\":1}", "{\"b\":2}"]);
        assert_eq!(sse_data(&format!("{stream}\n")).last(), Some("[DONE]"));
        assert_eq!(sse_data("data: {\"cut").count(), 0);
    }

    #[test]
    fn a_failure_is_told_by_its_error_envelope_or_its_body() {
        let envelope = r#"{"error": {"message": "this server takes no audio", "type": "invalid_request_error"}}"#;
        assert_eq!(error_message(envelope), "this server takes no audio");
        assert_eq!(error_message("boom"), "boom");
        assert_eq!(error_message(&"x".repeat(500)).len(), 200);
    }

    #[test]
    fn cache_source_and_reason_are_read_when_sent() {
        let mut row = Row::new("s", 1, crate::bench::Scenario::Warm, 2);
        read_usage(&json!({"timings": {"draft_n": 3}}), &mut row);
        assert_eq!((row.cache_source.as_deref(), row.cache_reason.as_deref()), (None, None));
        assert_eq!((row.cache_save_ms, row.cache_restore_ms), (None, None));
        read_usage(&json!({"timings": {"cache": {"source": "store", "reason": 7, "restore_ms": 4.5}}}), &mut row);
        assert_eq!((row.cache_source.as_deref(), row.cache_reason.as_deref()), (Some("store"), Some("7")));
        assert_eq!((row.cache_save_ms, row.cache_restore_ms), (None, Some(4.5)));
        // A later chunk without timings (the usage chunk) keeps what was read.
        read_usage(&json!({"usage": {"prompt_tokens": 3}}), &mut row);
        assert_eq!((row.cache_source.as_deref(), row.cache_restore_ms), (Some("store"), Some(4.5)));
    }

    #[test]
    fn call_deltas_merge_by_index_and_count_repeated_headers() {
        let mut calls = Vec::new();
        merge_call_delta(
            &mut calls,
            &json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}),
        );
        merge_call_delta(&mut calls, &json!({"index": 0, "function": {"arguments": "{\"a\":"}}));
        merge_call_delta(&mut calls, &json!({"index": 0, "function": {"name": "f", "arguments": "1}"}}));
        assert_eq!(
            calls,
            vec![StreamedCall {
                id: "call_1".into(),
                name: "ff".into(),
                arguments: "{\"a\":1}".into(),
                repeated_header: 1
            }]
        );
    }
}
