//! `firstword bench`: the cold / warm / tool / decode / interleaved-job / alternating-conversations
//! / voice (spoken, preemptive, barge-in) / together (a second request while a reply streams) /
//! restart micro-benchmark against any OpenAI-compatible server, so users choose with
//! data from their own machine; with `--media`, the media scenario too (transcription and the
//! silent-failure probe, for servers started with a projector).
//!
//! Per repetition every server runs every scenario in turn (A B A B …), so machine drift hits
//! all of them equally. Each request becomes a [`Row`]; [`summarize`] and [`decide`] turn rows
//! into the summary and the decision.

mod busy;
mod chart;
mod client;
mod command;
mod error;
pub mod grade;
mod head;
mod home;
mod media;
pub mod quality;
mod report;
mod runner;
mod serve;
mod table;
mod together;
mod verdict;
mod verdict_report;
mod voice;

use std::time::Duration;

use serde_json::{json, Value};

pub use chart::{check_plot_path, plot};
pub use client::sse_data;
pub use command::{decide_run, execute, judge, Outputs, VerdictOptions};
pub use error::{BenchError, NoDecision, WeightsError};
pub use home::{HeadLayout, Home, HOME_ASKS};
pub use media::{
    bmp, media_summary, probe_verdict, transcript_words, word_error_rate, MediaSummary, ProbeAnswer, ProbeVerdict,
};
pub use report::{decide, summarize, write_csv, Conversation, HeadSummary, Row, Scenario, Spread, Summary};
pub use runner::{run, run_measured};
pub use table::table;
pub use verdict::{verdict, Decision, Estimate, Ratios, Rules, ServerVerdict, Verdict, VerdictError, Weights};
pub use verdict_report::{run_verdict, server_figures, verdict_text, write_verdict};

pub use busy::BusyLoad;
use client::{send, ServerReply};

/// A server to measure.
#[derive(Clone, Debug)]
pub struct Target {
    /// Name in the report.
    pub name: String,
    /// Base URL, e.g. `http://127.0.0.1:8080` (with or without `/v1`).
    pub url: String,
    /// Process id, to read its peak memory.
    pub pid: Option<u32>,
    /// A shell command that restarts the server and returns once it is ready again (the
    /// restart scenario R runs it); its last line of output, if a number, is the new process
    /// id.
    pub restart: Option<String>,
    /// A shell command that starts the server (`--serve NAME=COMMAND`): the bench starts it
    /// before the server's turn in each repetition and stops it after, one server resident at
    /// a time, the order alternated per repetition.
    pub serve: Option<String>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The servers, run in turn.
    pub targets: Vec<Target>,
    /// The long system prompt (a per-repetition nonce is put in front of it so turn 1 is cold).
    pub system_prompt: String,
    /// Conversation turns, the first cold.
    pub turns: u32,
    /// Repetitions.
    pub reps: u32,
    /// `model` sent in requests.
    pub model: String,
    /// Tokens per conversation turn.
    pub turn_tokens: u32,
    /// Tokens for the decode scenarios.
    pub decode_tokens: u32,
    /// Per-request timeout.
    pub timeout: Duration,
    /// The end-of-turn pause of the voice scenarios: silence after the last word before the
    /// final transcript's request (voice pipelines wait 300–800 ms).
    pub vad: Duration,
    /// Reply tokens each prefill of the spoken scenarios asks the server to generate ahead
    /// (`pregenerate`).
    pub pregenerate: u32,
    /// Cores kept busy by a spinning thread each for the whole run (0: none): the servers
    /// measured next to other work.
    pub busy_cores: u32,
    /// The text scenarios, the media scenario, or both.
    pub scenarios: Scenarios,
    /// Devices of the changed-head scenario's home.
    pub home_entities: usize,
    /// The quality scenario (`--quality`): answered in the first repetition, after the
    /// server's other scenarios.
    pub quality: Option<quality::QualityRun>,
}

/// Which scenarios a run holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scenarios {
    /// The conversation, voice, tool, decode, alternating and restart scenarios.
    #[default]
    Text,
    /// Those, then the media scenario (`--media`).
    TextAndMedia,
    /// The media scenario alone (`--media-only`).
    Media,
    /// The together scenario alone (`--together-only`): several conversations at once.
    Together,
    /// The changed-head scenario alone (`--changed-head-only`): Home Assistant sessions whose
    /// system message holds a clock and the devices' states.
    ChangedHead,
    /// Nothing but the quality scenario (`--quality-only`).
    QualityOnly,
}

impl Scenarios {
    /// Whether the text scenarios run.
    #[must_use]
    pub fn text(self) -> bool {
        matches!(self, Self::Text | Self::TextAndMedia)
    }

    /// Whether the media scenario runs: transcription of spoken clips (espeak-ng) and the
    /// silent-failure probe.
    #[must_use]
    pub fn media(self) -> bool {
        matches!(self, Self::TextAndMedia | Self::Media)
    }
}

impl BenchConfig {
    /// The default end-of-turn pause.
    pub const DEFAULT_VAD: Duration = Duration::from_millis(500);
    /// The default `pregenerate` of the spoken scenarios' prefills.
    pub const DEFAULT_PREGENERATE: u32 = 16;
    /// The default number of devices in the changed-head scenario's home.
    pub const DEFAULT_HOME_ENTITIES: usize = 96;
}

/// The words and numbers of one synthetic system prompt.
struct Wording {
    intro: &'static str,
    item: &'static str,
    place: &'static str,
    feature: &'static str,
    topics: [&'static str; 8],
    /// Shifts the topics and numbers.
    seed: usize,
}

/// The smart-home facts of [`synthetic_system_prompt`].
const FACTS: Wording = Wording {
    intro: "You are a helpful voice assistant for a smart home. Facts you know:\n",
    item: "Fact",
    place: "region",
    feature: "feature",
    topics: ["rivers", "mountains", "libraries", "trains", "gardens", "satellites", "bakeries", "harbors"],
    seed: 0,
};

/// The city-guide notes of the alternating scenario's conversation B.
const NOTES: Wording = Wording {
    intro: "You are a helpful travel guide for a coastal city. Notes you know:\n",
    item: "Note",
    place: "district",
    feature: "style",
    topics: ["bridges", "forests", "museums", "ferries", "orchards", "observatories", "markets", "lighthouses"],
    seed: 5,
};

/// Roughly how many tokens `text` is: typical tokenizers take about 2.7 characters per token
/// on the synthetic prompts.
fn approx_tokens(text: &str) -> usize {
    text.len() * 3 / 8
}

/// A long system prompt of roughly `tokens` tokens: varied facts, like a real one.
#[must_use]
pub fn synthetic_system_prompt(tokens: usize) -> String {
    synthetic_prompt(tokens, &FACTS)
}

fn synthetic_prompt(tokens: usize, wording: &Wording) -> String {
    let mut text = String::from(wording.intro);
    let mut i = 0;
    while approx_tokens(&text) < tokens {
        let n = i + wording.seed;
        text.push_str(&format!(
            "{} {i}: the {} of {} {} are known for {} {} since {}.\n",
            wording.item,
            wording.topics[n % wording.topics.len()],
            wording.place,
            n * 7 % 97,
            wording.feature,
            n * 13 % 31,
            1800 + n * 37 % 200
        ));
        i += 1;
    }
    text
}

const QUESTIONS: [&str; 6] = [
    "Which facts mention trains? Answer in one sentence.",
    "And gardens?",
    "Which region has feature 3?",
    "Summarise what you know in one line.",
    "Anything about harbors?",
    "Thanks. What else should I know?",
];

/// `get_weather(city, unit)`, the unit an enum: the tool of the tool scenario's question (the
/// integration tests call it too).
#[must_use]
pub fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}})
}

/// The tools of the tool scenario: an enum and an integer, as voice assistants use them.
#[must_use]
pub fn bench_tools() -> Value {
    json!([
        weather_tool(),
        {"type": "function", "function": {"name": "set_timer", "description": "Start a timer",
            "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1}},
                "required": ["minutes"], "additionalProperties": false}}}
    ])
}

/// The base URL without a trailing `/v1`.
fn base(url: &str) -> &str {
    let url = url.trim_end_matches('/');
    url.strip_suffix("/v1").unwrap_or(url)
}

/// One server's scenarios in one repetition.
struct ServerRun<'a, P> {
    config: &'a BenchConfig,
    client: &'a reqwest::Client,
    target: &'a Target,
    /// The server's process id now (a restart changes it).
    pid: &'a mut Option<u32>,
    rep: u32,
    rows: &'a mut Vec<Row>,
    progress: &'a mut P,
}

impl<P: FnMut(&Row)> ServerRun<'_, P> {
    async fn request(&mut self, mut row: Row, body: Value) -> ServerReply {
        let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
        self.record(row);
        reply
    }

    /// Reports a finished row and keeps it.
    fn record(&mut self, row: Row) {
        (self.progress)(&row);
        self.rows.push(row);
    }

    fn body(&self, messages: &[Value], max_tokens: u32, stream: bool) -> Value {
        json!({"model": self.config.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null }})
    }

    fn row(&self, scenario: Scenario, turn: u32) -> Row {
        Row::new(&self.target.name, self.rep, scenario, turn)
    }

    /// `label`, then a line unique per server and repetition (no cache carries over) and equally
    /// long for every server (all evaluate the same number of prompt tokens): the start of a
    /// conversation's system prompt.
    fn nonce(&self, label: &str) -> String {
        let server_tag = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            self.target.name.hash(&mut hasher);
            hasher.finish() % 100_000
        };
        format!("{label}Session {}-{server_tag:05}-{}.\n", self.rep, std::process::id())
    }

    /// One conversation turn: the turn's question, the request, the reply added to `messages`.
    async fn turn(&mut self, messages: &mut Vec<Value>, row: Row) {
        messages.push(json!({"role": "user", "content": QUESTIONS[(row.turn as usize - 1) % QUESTIONS.len()]}));
        let body = self.body(messages, self.config.turn_tokens, true);
        let reply = self.request(row, body).await;
        messages.push(json!({"role": "assistant", "content": reply.content}));
    }

    /// A (cold), B (warm), the voice turns (P, P with a word added, preemptive, barge-in), E
    /// (interleaved job), D (decode), C (tool), F (alternating conversations), in an order where
    /// each measures what it claims: the conversation first (its turn 1 is the only cold one;
    /// the voice turns continue it), the interleaved job between two of its turns, then the
    /// scenarios that share only the system prompt with it (decode after the long prompt, the
    /// tool calls), the short-prompt decode, which shares nothing, and last the two alternating
    /// conversations, whose system prompts start with a nonce of their own, and T (together),
    /// whose satellites' prompt does too; R, where the server has a restart command, after them
    /// all.
    async fn text_scenarios(&mut self) {
        let system = self.nonce("") + &self.config.system_prompt;
        let mut messages = vec![json!({"role": "system", "content": system})];
        for turn in 1..=self.config.turns {
            let scenario = if turn == 1 { Scenario::Cold } else { Scenario::Warm };
            self.turn(&mut messages, self.row(scenario, turn)).await;
        }

        self.voice_scenarios(&mut messages, self.config.turns + 1).await;

        let job = [
            json!({"role": "system", "content": "You summarize documents in three sentences."}),
            json!({"role": "user", "content": format!("Summarize:\n{}", synthetic_system_prompt(600))}),
        ];
        let body = self.body(&job, self.config.turn_tokens, false);
        self.request(self.row(Scenario::InterleavedJob, 0), body).await;
        messages.push(json!({"role": "user", "content": "Back to us: which facts mention bakeries?"}));
        let body = self.body(&messages, self.config.turn_tokens, true);
        let reply = self.request(self.row(Scenario::AfterInterleave, self.config.turns + 5), body).await;
        messages.push(json!({"role": "assistant", "content": reply.content}));

        let story = json!({"role": "user", "content": "Write a long story about a dragon who learns to bake."});
        let body = self.body(&[messages[0].clone(), story.clone()], self.config.decode_tokens, true);
        self.request(self.row(Scenario::DecodeLong, 0), body).await;
        self.tool_scenario(&messages[0]).await;
        let body = self.body(&[story], self.config.decode_tokens, true);
        self.request(self.row(Scenario::DecodeShort, 0), body).await;
        self.alternating_scenario().await;
        self.together_scenario().await;
        if let Some(command) = &self.target.restart {
            self.restart_turn(command, &mut messages, self.config.turns + 6).await;
        }
    }

    /// R: restarts the server with `command`, waits until it answers `/health`, then sends the
    /// conversation's next turn: what a user says first after an update, a crash or a reboot.
    async fn restart_turn(&mut self, command: &str, messages: &mut Vec<Value>, turn: u32) {
        let mut row = self.row(Scenario::Restart, turn);
        row.restarted_peak_rss_mb = self.pid.and_then(peak_rss_mb);
        match restart(command, base(&self.target.url), self.config.timeout).await {
            Ok(new_pid) => {
                if new_pid.is_some() {
                    *self.pid = new_pid;
                }
                messages.push(json!({"role": "user", "content": "We were cut off. Where were we?"}));
                let body = self.body(messages, self.config.turn_tokens, true);
                let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
                messages.push(json!({"role": "assistant", "content": reply.content}));
            }
            Err(error) => row.error = error,
        }
        self.record(row);
    }

    /// F: conversation A (the configured system prompt) and B (another synthetic one of about
    /// the same size), turns interleaved A1 B1 A2 B2 …: with a cache that keeps other prompts'
    /// states, every turn after each conversation's first is warm.
    async fn alternating_scenario(&mut self) {
        let config = self.config;
        let prompt_b = synthetic_prompt(approx_tokens(&config.system_prompt), &NOTES);
        let mut conversations =
            [(Conversation::A, &config.system_prompt), (Conversation::B, &prompt_b)].map(|(conversation, prompt)| {
                let system = self.nonce(&format!("Conversation {conversation:?}. ")) + prompt;
                (conversation, vec![json!({"role": "system", "content": system})])
            });
        for turn in 1..=config.turns {
            for (conversation, messages) in &mut conversations {
                let row = Row { conversation: Some(*conversation), ..self.row(Scenario::Alternating, turn) };
                self.turn(messages, row).await;
            }
        }
    }

    /// C: a forced call streamed and not, then the follow-up with the call and its result.
    async fn tool_scenario(&mut self, system: &Value) {
        let tools = bench_tools();
        let messages =
            vec![system.clone(), json!({"role": "user", "content": "What's the weather in Paris, in celsius?"})];
        // One question, one call: a voice command wants one action, not a list of guesses.
        let with_tools = |mut body: Value, choice: &str| {
            body["tools"] = tools.clone();
            body["tool_choice"] = json!(choice);
            body["parallel_tool_calls"] = json!(false);
            body
        };
        let body = with_tools(self.body(&messages, 96, true), "required");
        let mut row = self.row(Scenario::ToolStream, 0);
        let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
        if row.error.is_empty() {
            row.error = check_tool_reply(&reply, true).err().unwrap_or_default();
        }
        self.record(row);

        let body = with_tools(self.body(&messages, 96, false), "required");
        let mut row = self.row(Scenario::ToolNonStream, 0);
        let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
        if row.error.is_empty() {
            row.error = check_tool_reply(&reply, false).err().unwrap_or_default();
        }
        let follow_up = reply.message.filter(|_| row.error.is_empty());
        self.record(row);

        let mut row = self.row(Scenario::ToolFollowUp, 0);
        let Some(message) = follow_up else {
            row.error = "skipped: no tool call to follow up".into();
            self.record(row);
            return;
        };
        let id = message["tool_calls"][0]["id"].as_str().unwrap_or("call_0").to_string();
        let mut history = messages;
        history.push(message);
        history
            .push(json!({"role": "tool", "tool_call_id": id, "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}));
        let body = with_tools(self.body(&history, 48, true), "auto");
        let reply = send(self.client, base(&self.target.url), &body, &mut row).await;
        if row.error.is_empty() && reply.content.trim().is_empty() && reply.calls.is_empty() {
            row.error = "the follow-up after the tool result was not answered".into();
        }
        self.record(row);
    }
}

/// Runs a restart command and waits (up to `timeout`) until the server at `base` answers
/// `/health` with 200; returns the new process id the command printed, if any.
async fn restart(command: &str, base: &str, timeout: Duration) -> Result<Option<u32>, String> {
    let output = tokio::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .await
        .map_err(|e| format!("restart command: {e}"))?;
    if !output.status.success() {
        return Err(format!("restart command failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr)));
    }
    let pid = String::from_utf8_lossy(&output.stdout).lines().last().and_then(|line| line.trim().parse().ok());
    let deadline = tokio::time::Instant::now() + timeout;
    let client = reqwest::Client::new();
    loop {
        let health = client.get(format!("{base}/health")).timeout(Duration::from_secs(5)).send().await;
        if health.is_ok_and(|r| r.status().is_success()) {
            return Ok(pid);
        }
        if tokio::time::Instant::now() > deadline {
            return Err("the server did not answer /health after the restart".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tool check: structured calls with a declared name and schema-valid arguments, and
/// `finish_reason: "tool_calls"`; otherwise the reason it failed.
fn check_tool_reply(reply: &ServerReply, streamed: bool) -> Result<(), String> {
    if reply.calls.is_empty() {
        let content = reply.content.trim();
        if content.contains("\"name\"") || content.contains("<tool_call>") || content.starts_with('{') {
            return Err("tool call came back as JSON in content".into());
        }
        return Err(format!("no tool_calls; finish_reason {}", reply.finish_reason.as_deref().unwrap_or("missing")));
    }
    let tools = bench_tools();
    for call in &reply.calls {
        if call.repeated_header > 0 {
            return Err(format!("id or name of {:?} sent more than once (clients concatenate them)", call.name));
        }
        let schema = tools
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["function"]["name"] == call.name.as_str())
            .map(|t| t["function"]["parameters"].clone())
            .ok_or_else(|| format!("called an undeclared function {:?}", call.name))?;
        let arguments: Value = serde_json::from_str(&call.arguments)
            .map_err(|_| format!("arguments of {} are not valid JSON: {}", call.name, call.arguments))?;
        let validator = jsonschema::validator_for(&schema).map_err(|e| e.to_string())?;
        validator.validate(&arguments).map_err(|e| format!("arguments of {} break the schema: {e}", call.name))?;
    }
    match reply.finish_reason.as_deref() {
        Some("tool_calls") => Ok(()),
        other => {
            Err(format!("finish_reason {other:?}, expected \"tool_calls\"{}", if streamed { " (stream)" } else { "" }))
        }
    }
}

/// Peak resident memory of a process (VmHWM), MB; Linux only.
#[must_use]
pub fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}

/// The 1-minute load average (Linux), to warn about a busy machine.
#[must_use]
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}
