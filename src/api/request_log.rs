//! One line per request at `info`: method, path, status, prompt/cached/generated tokens, time to
//! first token and total time (for a stream, when its last byte left or the client left). Never
//! the prompt, the reply or a key. The same figures go to `/metrics` ([`Metrics::request`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use parking_lot::Mutex;

use super::error::ErrorCode;
use super::metrics::{Metrics, Outcome};
use crate::engine::{Event, Timings, Usage};

/// What a handler learned about its request, for the log line: shared between the handler
/// (which fills it from the engine's events) and the response body (which logs it at its end).
#[derive(Clone, Default)]
pub(super) struct RequestRecord(Arc<Mutex<Recorded>>);

#[derive(Default)]
struct Recorded {
    usage: Option<Usage>,
    first_token: Option<Instant>,
    timings: Option<Timings>,
}

impl RequestRecord {
    /// The record the logging layer attached to `request` (a fresh one without the layer).
    pub(super) fn of(request: &Request) -> Self {
        request.extensions().get::<Self>().cloned().unwrap_or_default()
    }

    /// Notes an engine event: the first text is the first token, `Finished` has the usage.
    pub(super) fn observe(&self, event: &Event) {
        let mut recorded = self.0.lock();
        match event {
            Event::Text(_) => {
                recorded.first_token.get_or_insert_with(Instant::now);
            }
            Event::Finished { usage, timings, .. } => {
                recorded.usage = Some(*usage);
                recorded.timings = Some(timings.clone());
            }
            Event::Started { .. } | Event::Logprobs(_) | Event::Failed(_) => {}
        }
    }

    /// Notes the token counts and timings of a request that generates nothing (a prefill).
    pub(super) fn prefilled(&self, usage: Usage, timings: Timings) {
        let mut recorded = self.0.lock();
        recorded.usage = Some(usage);
        recorded.timings = Some(timings);
    }
}

/// The middleware: attaches a [`RequestRecord`], and logs and counts the request when its
/// response body is done.
pub(super) async fn log_requests(State(metrics): State<Arc<Metrics>>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let record = RequestRecord::default();
    request.extensions_mut().insert(record.clone());
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    // The route's pattern, not the path a client made up: a bounded set of metric labels.
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_string();
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    let code = parts.extensions.get::<ErrorCode>().and_then(|code| code.0);
    let line = LogLine { method, path, route, status: parts.status, code, started, record, metrics };
    Response::from_parts(parts, Body::new(LoggedBody { inner: body, line: Some(line) }))
}

/// The line of one request, written once.
struct LogLine {
    method: Method,
    path: String,
    route: String,
    status: StatusCode,
    code: Option<&'static str>,
    started: Instant,
    record: RequestRecord,
    metrics: Arc<Metrics>,
}

impl LogLine {
    /// Writes the line; `complete`: the body was sent to its end (else the client left).
    fn write(self, complete: bool) {
        let recorded = self.record.0.lock();
        let ms = |instant: Instant| instant.duration_since(self.started).as_secs_f64() * 1000.0;
        let total_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let usage = recorded.usage;
        let ttft = recorded.first_token.map(|t| t.duration_since(self.started));
        let outcome = Outcome { usage, ttft, timings: recorded.timings.clone() };
        self.metrics.request(&self.route, self.status.as_u16(), self.code, &outcome);
        tracing::info!(
            target: "firstword::request",
            status = self.status.as_u16(),
            prompt_tokens = usage.map(|u| u.prompt_tokens),
            cached_tokens = usage.map(|u| u.cached_tokens),
            completion_tokens = usage.map(|u| u.completion_tokens),
            ttft_ms = recorded.first_token.map(|t| ms(t).round() as u64),
            total_ms = total_ms.round() as u64,
            client_left = !complete,
            "{} {}",
            self.method,
            self.path,
        );
    }
}

/// A response body that writes its request's line when it ends or is dropped.
struct LoggedBody {
    inner: Body,
    line: Option<LogLine>,
}

impl HttpBody for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            if let Some(line) = self.line.take() {
                line.write(true);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            line.write(self.inner.is_end_stream());
        }
    }
}
