//! `GET /metrics`: Prometheus (OpenMetrics) text from `prometheus-client`. Request, token,
//! time-to-first-token and speculation figures are counted as each request ends (by the
//! request log, which sees every request); queue and cache figures are read at each scrape.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::error::ApiError;
use super::AppState;
use crate::engine::{Timings, Usage};

/// Time-to-first-token buckets for voice: 25 ms (a warm GPU turn) to 30 s (a cold 8K prompt on
/// a small CPU), seconds.
const TTFT_BUCKETS: [f64; 12] = [0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0];

/// Restore-time buckets, seconds.
const RESTORE_BUCKETS: [f64; 8] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Buckets of `replies_beside`: how many other replies shared a reply's decode steps (0: none;
/// at most `--parallel` − 1).
const BESIDE_BUCKETS: [f64; 5] = [0.0, 1.0, 2.0, 3.0, 7.0];

/// Request-path buckets: 0.25 ms to a second, seconds (the target is 5 ms for a 4K-token
/// conversation).
const REQUEST_PATH_BUCKETS: [f64; 10] = [0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 0.25, 1.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThreadLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ParkingLabels {
    outcome: &'static str,
}

/// Every metric firstword exports.
pub(super) struct Metrics {
    registry: Registry,
    requests: Family<RouteLabels, Counter>,
    errors: Family<CodeLabels, Counter>,
    ttft: Histogram,
    prompt_evaluated: Counter,
    prompt_reused: Family<SourceLabels, Counter>,
    generated: Counter,
    generation_seconds: Counter<f64>,
    restore_seconds: Family<SourceLabels, Histogram, fn() -> Histogram>,
    request_path_seconds: Family<StageLabels, Histogram, fn() -> Histogram>,
    drafted: Counter,
    accepted: Counter,
    queued: Gauge,
    busy: Gauge,
    cache_entries: Family<StoreLabels, Gauge>,
    cache_bytes: Family<StoreLabels, Gauge>,
    cache_budget_bytes: Family<StoreLabels, Gauge>,
    disk_bytes_written: Counter,
    live_tokens: Gauge,
    parked_generations: Family<ParkingLabels, Counter>,
    lanes_running: Gauge,
    kept_conversations: Gauge,
    lane_requests: Counter,
    replies_beside: Histogram,
    threads: Family<ThreadLabels, Gauge>,
    other_busy_cores: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Metrics {
    /// Every metric, registered, at zero.
    pub(super) fn new() -> Self {
        let mut registry = Registry::with_prefix("firstword");
        let metrics = Self {
            requests: Family::default(),
            errors: Family::default(),
            ttft: Histogram::new(TTFT_BUCKETS),
            prompt_evaluated: Counter::default(),
            prompt_reused: Family::default(),
            generated: Counter::default(),
            generation_seconds: Counter::default(),
            restore_seconds: Family::new_with_constructor(restore_histogram),
            request_path_seconds: Family::new_with_constructor(request_path_histogram),
            drafted: Counter::default(),
            accepted: Counter::default(),
            queued: Gauge::default(),
            busy: Gauge::default(),
            cache_entries: Family::default(),
            cache_bytes: Family::default(),
            cache_budget_bytes: Family::default(),
            disk_bytes_written: Counter::default(),
            live_tokens: Gauge::default(),
            parked_generations: Family::default(),
            lanes_running: Gauge::default(),
            kept_conversations: Gauge::default(),
            lane_requests: Counter::default(),
            replies_beside: Histogram::new(BESIDE_BUCKETS),
            threads: Family::default(),
            other_busy_cores: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("requests", "Requests answered, by route and HTTP status", metrics.requests.clone());
        registry.register("errors", "Error answers, by the envelope's code", metrics.errors.clone());
        registry.register("ttft_seconds", "Request arrival to first token", metrics.ttft.clone());
        registry.register(
            "prompt_tokens_evaluated",
            "Prompt tokens evaluated (prefilled)",
            metrics.prompt_evaluated.clone(),
        );
        registry.register(
            "prompt_tokens_reused",
            "Prompt tokens served from the cache, by where they came from (live, ram, checkpoint, disk)",
            metrics.prompt_reused.clone(),
        );
        registry.register("generated_tokens", "Tokens generated", metrics.generated.clone());
        registry.register(
            "generation_seconds",
            "Time spent generating after the first token (decode rate: generated_tokens over this)",
            metrics.generation_seconds.clone(),
        );
        registry.register(
            "cache_restore_seconds",
            "Restores of stored states, by source",
            metrics.restore_seconds.clone(),
        );
        registry.register(
            "request_path_seconds",
            "What requests cost before llama.cpp was called, by stage (total: arrival to the prompt's evaluation)",
            metrics.request_path_seconds.clone(),
        );
        registry.register("draft_tokens_drafted", "Tokens drafted by speculative decoding", metrics.drafted.clone());
        registry.register("draft_tokens_accepted", "Drafted tokens the model accepted", metrics.accepted.clone());
        registry.register("queue_depth", "Generation requests waiting for the engine", metrics.queued.clone());
        registry.register("engine_busy", "1 while the engine serves a request", metrics.busy.clone());
        registry.register("cache_entries", "Stored states, by store (ram, disk, media)", metrics.cache_entries.clone());
        registry.register("cache_bytes", "Bytes of stored states, by store", metrics.cache_bytes.clone());
        registry.register("cache_budget_bytes", "Budget of each store", metrics.cache_budget_bytes.clone());
        registry.register(
            "disk_bytes_written",
            "Bytes the disk cache wrote (bases and delta segments, headers included)",
            metrics.disk_bytes_written.clone(),
        );
        registry.register("live_tokens", "Tokens the live KV sequence holds", metrics.live_tokens.clone());
        registry.register(
            "parked_generations",
            "Parked generations (pregenerated, or a reply whose client left), by outcome: parked, adopted, discarded",
            metrics.parked_generations.clone(),
        );
        registry.register(
            "lanes_running",
            "Requests served beside the live sequence's reply now, each in a sequence of its own (--parallel)",
            metrics.lanes_running.clone(),
        );
        registry.register(
            "kept_conversations",
            "Conversations kept in their KV cells under a sequence of their own, continued with nothing restored (--parallel)",
            metrics.kept_conversations.clone(),
        );
        registry.register(
            "lane_requests",
            "Requests served to their end beside another reply (--parallel)",
            metrics.lane_requests.clone(),
        );
        registry.register(
            "replies_beside",
            "Per reply generated: the most other replies that shared one of its decode steps (0: it ran alone)",
            metrics.replies_beside.clone(),
        );
        registry.register(
            "threads",
            "Threads llama.cpp computes with now, by kind (generation, batch): fewer while other processes keep cores busy",
            metrics.threads.clone(),
        );
        registry.register(
            "other_busy_cores",
            "Cores other processes kept busy when the engine last looked (what decided the threads)",
            metrics.other_busy_cores.clone(),
        );
        Self { registry, ..metrics }
    }

    /// Counts a finished request: its route (the matched path), status, error code, and what
    /// the engine reported for it.
    pub(super) fn request(&self, route: &str, status: u16, error_code: Option<&str>, outcome: &Outcome) {
        self.requests.get_or_create(&RouteLabels { route: route.to_string(), status: status.to_string() }).inc();
        if let Some(code) = error_code {
            self.errors.get_or_create(&CodeLabels { code: code.to_string() }).inc();
        }
        if let Some(ttft) = outcome.ttft {
            self.ttft.observe(ttft.as_secs_f64());
        }
        if let Some(usage) = outcome.usage {
            self.generated.inc_by(u64::from(usage.completion_tokens));
        }
        let Some(timings) = &outcome.timings else { return };
        let cache = &timings.cache;
        self.prompt_evaluated.inc_by(u64::from(cache.prefilled));
        if cache.reused > 0 {
            let source = SourceLabels { source: cache.source.as_str().to_string() };
            self.prompt_reused.get_or_create(&source).inc_by(u64::from(cache.reused));
        }
        if let Some(restore) = cache.restore {
            let source = SourceLabels { source: cache.source.as_str().to_string() };
            self.restore_seconds.get_or_create(&source).observe(restore.as_secs_f64());
        }
        if let Some(path) = timings.request {
            let stages = [
                ("total", path.total),
                ("read", path.read),
                ("parse", path.parse),
                ("render", path.render),
                ("tokenize", path.tokenize),
                ("queue", path.queue),
                ("match", path.matching),
            ];
            for (stage, time) in stages {
                self.request_path_seconds.get_or_create(&StageLabels { stage }).observe(time.as_secs_f64());
            }
        }
        self.generation_seconds.inc_by(timings.generation.as_secs_f64());
        if outcome.ttft.is_some() {
            self.replies_beside.observe(f64::from(timings.shared.map_or(0, |shared| shared.replies_beside)));
        }
        if let Some(draft) = timings.draft {
            self.drafted.inc_by(u64::from(draft.drafted));
            self.accepted.inc_by(u64::from(draft.accepted));
        }
    }
}

/// A histogram of restore times.
fn restore_histogram() -> Histogram {
    Histogram::new(RESTORE_BUCKETS)
}

/// A histogram of request-path stages.
fn request_path_histogram() -> Histogram {
    Histogram::new(REQUEST_PATH_BUCKETS)
}

/// What the engine reported for one request.
#[derive(Clone, Debug, Default)]
pub(super) struct Outcome {
    /// Token counts.
    pub(super) usage: Option<Usage>,
    /// Request arrival to the first token.
    pub(super) ttft: Option<std::time::Duration>,
    /// The engine's timings (cache report, speculation).
    pub(super) timings: Option<Timings>,
}

/// The handler: every metric, the queue and cache read now.
pub(super) async fn metrics(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let metrics = &state.metrics;
    let load = state.engine.load();
    metrics.queued.set(load.waiting as i64);
    metrics.busy.set(i64::from(load.busy));
    let cache = state.engine.cache_status();
    metrics.live_tokens.set(i64::from(cache.live_tokens));
    let ram = StoreLabels { store: "ram".into() };
    metrics.cache_entries.get_or_create(&ram).set(cache.entries.len() as i64);
    metrics.cache_bytes.get_or_create(&ram).set(cache.used_bytes as i64);
    metrics.cache_budget_bytes.get_or_create(&ram).set(cache.budget_bytes as i64);
    if let Some(disk) = &cache.disk {
        let store = StoreLabels { store: "disk".into() };
        metrics.cache_entries.get_or_create(&store).set(disk.entries.len() as i64);
        metrics.cache_bytes.get_or_create(&store).set(disk.used_bytes as i64);
        metrics.cache_budget_bytes.get_or_create(&store).set(disk.budget_bytes as i64);
        // The writer's own count, taken as it stands (never counted twice by two scrapes).
        metrics.disk_bytes_written.inner().fetch_max(disk.bytes_written, std::sync::atomic::Ordering::Relaxed);
    }
    if let Some(media) = &cache.media {
        let store = StoreLabels { store: "media".into() };
        metrics.cache_entries.get_or_create(&store).set(i64::from(media.entries));
        metrics.cache_bytes.get_or_create(&store).set(media.used_bytes as i64);
        metrics.cache_budget_bytes.get_or_create(&store).set(media.budget_bytes as i64);
    }
    let parking = cache.parking;
    for (outcome, count) in [("parked", parking.parked), ("adopted", parking.adopted), ("discarded", parking.discarded)]
    {
        let counter = metrics.parked_generations.get_or_create(&ParkingLabels { outcome });
        counter.inner().fetch_max(count, std::sync::atomic::Ordering::Relaxed);
    }
    metrics.lanes_running.set(i64::from(cache.lanes.running));
    metrics.kept_conversations.set(i64::from(cache.lanes.kept));
    metrics.lane_requests.inner().fetch_max(cache.lanes.served, std::sync::atomic::Ordering::Relaxed);
    if let Some(threads) = state.engine.threads() {
        metrics.threads.get_or_create(&ThreadLabels { kind: "generation" }).set(i64::from(threads.counts.generation));
        metrics.threads.get_or_create(&ThreadLabels { kind: "batch" }).set(i64::from(threads.counts.batch));
        metrics.other_busy_cores.set(threads.other_busy_cores);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics.registry)
        .map_err(|e| ApiError::Internal(format!("encoding the metrics failed: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response())
}
