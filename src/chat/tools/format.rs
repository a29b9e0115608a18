//! A model's tool-call format: the syntax its chat template writes calls in (read off the
//! template's own rendering, see [`super::detect`]), whether the template writes the tools and
//! earlier calls itself, and how call ids look.

use std::sync::Arc;

use super::detect::{read_syntax, Syntax};
use super::syntax::{literal_pieces, Body, Layout, Markers, Params};
use super::{write, ToolDefinition};
use crate::chat::{ChatMessage, ChatTemplate, ReasoningFormat, TemplateKwargs, ToolCall};

/// A tool-call format, detected from the chat template. Clones share one description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolFormat(Arc<Description>);

/// What a format is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Description {
    family: Family,
    layout: Layout,
    body: Body,
    /// Mistral's templates want call ids of 9 letters and digits.
    short_ids: bool,
    /// The template renders the tools but not earlier calls: they are written into the
    /// assistant's text (LFM2, Granite 3.3).
    calls_in_text: bool,
    /// The template refuses a system message (Gemma 2): the generic format's tool description
    /// opens the first user turn instead.
    tools_in_user_turn: bool,
    /// The template writes one call per reply (GigaChat's drops the others).
    single_call: bool,
    /// The generation prompt ends with the call opener (functionary v3.2's `>>>`): a reply
    /// starts inside it, and this text there (`all\n`) opens plain text instead of a call.
    text_recipient: Option<String>,
}

/// The kinds of call syntax, for logs, `/v1/models` and the docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// The template knows no tools: firstword describes them in the system message and asks
    /// for Hermes-style `<tool_call>{"name": …, "arguments": …}</tool_call>` calls.
    Generic,
    /// A JSON object with the name and the arguments, between markers (Hermes, Qwen 2.5/3,
    /// Mistral, Apriel, Nemotron, MiniMax-M1, Granite, Command-R).
    Json,
    /// The name, then the arguments as JSON (DeepSeek, Kimi K2, Magistral's
    /// `[TOOL_CALLS]NAME[ARGS]{…}`, functionary).
    NamedJson,
    /// The name, then each argument between XML-style markers (Qwen3-Coder/3.5, GLM, MiniMax-M2,
    /// Seed-OSS, DeepSeek's DSML).
    Xml,
    /// Llama 3.x: a bare `{"name": …, "parameters": …}` object, optionally after `<|python_tag|>`.
    Llama3,
    /// Gemma 4: `<|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>`.
    Gemma4,
    /// FunctionGemma: `<start_function_call>call:name{key:<escape>text<escape>}<end_function_call>`.
    FunctionGemma,
    /// LFM2: `<|tool_call_start|>[name(key="text")]<|tool_call_end|>` in the reply's text.
    Pythonic,
    /// gpt-oss's Harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.
    Harmony,
}

impl Family {
    /// A short name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Generic => "generic",
            Self::Json => "json",
            Self::NamedJson => "name+json",
            Self::Xml => "xml",
            Self::Llama3 => "llama3",
            Self::Gemma4 => "gemma4",
            Self::FunctionGemma => "functiongemma",
            Self::Pythonic => "pythonic",
            Self::Harmony => "harmony",
        }
    }
}

/// Llama 3's marker for a call in code-interpreter style.
pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";
/// The token MiniMax-M3 writes before each of its markers.
const MINIMAX_NS: &str = "]<]minimax[>[";
/// How a bare Llama 3 call begins.
pub(crate) const BARE_JSON_OPENER: &str = "{\"name\"";

impl ToolFormat {
    fn new(family: Family, layout: Layout, body: Body) -> Self {
        Self(Arc::new(Description {
            family,
            layout,
            body,
            short_ids: false,
            calls_in_text: false,
            tools_in_user_turn: false,
            single_call: false,
            text_recipient: None,
        }))
    }

    /// The format of a syntax read off a template.
    pub(crate) fn described(layout: Layout, body: Body) -> Self {
        let family = match &body {
            Body::Json { .. } => Family::Json,
            Body::NamedJson { .. } => Family::NamedJson,
            Body::Params(_) => Family::Xml,
            Body::Gemma { .. } => Family::Gemma4,
            Body::Pythonic => Family::Pythonic,
        };
        Self::new(family, layout, body)
    }

    /// The format of a syntax read off a template, with what it tells beside the syntax.
    pub(crate) fn from_syntax(syntax: Syntax) -> Self {
        let format = Self::described(syntax.layout, syntax.body);
        Self(Arc::new(Description {
            single_call: !syntax.parallel,
            text_recipient: syntax.text_recipient,
            ..(*format.0).clone()
        }))
    }

    /// The text that, where a reply starts inside the call opener (the generation prompt ends
    /// with it), opens plain text instead of a call: functionary v3.2's `all\n` after `>>>`.
    #[must_use]
    pub fn text_recipient(&self) -> Option<&str> {
        self.0.text_recipient.as_deref()
    }

    /// gpt-oss's Harmony calls, as the model writes them (its template writes the recipient
    /// before the channel; the model after it): `<|channel|>commentary to=functions.NAME
    /// <|constrain|>json<|message|>{…}<|call|>`.
    #[must_use]
    pub fn harmony() -> Self {
        let markers = Markers {
            call_open: "<|channel|>commentary to=functions.".into(),
            call_close: "<|call|>".into(),
            separator: "<|start|>assistant".into(),
            ..Markers::default()
        };
        Self::new(
            Family::Harmony,
            Layout::Markers(markers),
            Body::NamedJson { name_close: " <|constrain|>json<|message|>".into() },
        )
    }

    fn json_in(markers: Markers) -> Layout {
        Layout::Markers(markers)
    }

    fn json_body(args_key: &str) -> Body {
        Body::Json { name_key: "name".into(), args_key: args_key.into() }
    }

    /// Templates without tool support: the tools described in the system message, Hermes-style
    /// calls.
    #[must_use]
    pub fn generic() -> Self {
        Self::new(Family::Generic, Self::json_in(Self::hermes_markers()), Self::json_body("arguments"))
    }

    fn hermes_markers() -> Markers {
        Markers {
            call_open: "<tool_call>\n".into(),
            call_close: "\n</tool_call>".into(),
            separator: "\n".into(),
            ..Markers::default()
        }
    }

    /// Hermes 2 Pro, Qwen 2.5/3: `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>`.
    #[must_use]
    pub fn hermes() -> Self {
        Self::new(Family::Json, Self::json_in(Self::hermes_markers()), Self::json_body("arguments"))
    }

    /// Llama 3.x's bare JSON calls.
    #[must_use]
    pub fn llama3() -> Self {
        Self::new(Family::Llama3, Layout::BareJson, Self::json_body("parameters"))
    }

    /// Mistral Nemo and Small: `[TOOL_CALLS][{"name": …, "arguments": …}, …]`, 9-character ids.
    #[must_use]
    pub fn mistral() -> Self {
        let markers =
            Markers { open: "[TOOL_CALLS][".into(), separator: ", ".into(), close: "]".into(), ..Markers::default() };
        Self::new(Family::Json, Layout::Markers(markers), Self::json_body("arguments")).with_short_ids()
    }

    /// The same format with Mistral's call ids.
    fn with_short_ids(self) -> Self {
        Self(Arc::new(Description { short_ids: true, ..(*self.0).clone() }))
    }

    /// Gemma 4.
    #[must_use]
    pub fn gemma4() -> Self {
        let markers =
            Markers { call_open: "<|tool_call>".into(), call_close: "<tool_call|>".into(), ..Markers::default() };
        Self::new(Family::Gemma4, Layout::Markers(markers), Body::Gemma { quote: "<|\"|>" })
    }

    /// FunctionGemma.
    #[must_use]
    pub fn function_gemma() -> Self {
        let markers = Markers {
            call_open: "<start_function_call>".into(),
            call_close: "<end_function_call>".into(),
            ..Markers::default()
        };
        Self::new(Family::FunctionGemma, Layout::Markers(markers), Body::Gemma { quote: "<escape>" })
    }

    /// LFM2's pythonic calls.
    #[must_use]
    pub fn lfm2() -> Self {
        let markers = Markers {
            open: "<|tool_call_start|>[".into(),
            separator: ", ".into(),
            close: "]<|tool_call_end|>".into(),
            ..Markers::default()
        };
        Self::new(Family::Pythonic, Layout::Markers(markers), Body::Pythonic).with_calls_in_text()
    }

    /// Granite 3.3's `<|tool_call|>[{"name": …, "arguments": …}]`, which its template does not
    /// render in the history.
    #[must_use]
    pub fn granite() -> Self {
        let markers =
            Markers { open: "<|tool_call|>[".into(), separator: ", ".into(), close: "]".into(), ..Markers::default() };
        Self::new(Family::Json, Layout::Markers(markers), Self::json_body("arguments")).with_calls_in_text()
    }

    /// The same format, its calls written into the assistant's text in the history.
    fn with_calls_in_text(self) -> Self {
        Self(Arc::new(Description { calls_in_text: true, ..(*self.0).clone() }))
    }

    /// Qwen3-Coder and Qwen3.5's XML-style calls, as their templates write them.
    #[must_use]
    pub fn qwen3_coder() -> Self {
        let markers = Markers {
            call_open: "<tool_call>\n<function=".into(),
            call_close: "</function>\n</tool_call>".into(),
            separator: "\n".into(),
            ..Markers::default()
        };
        let params = Params {
            name_close: ">\n".into(),
            key_open: "<parameter=".into(),
            key_close: ">\n".into(),
            key_close_json: ">\n".into(),
            value_close: "\n</parameter>\n".into(),
        };
        Self::new(Family::Xml, Layout::Markers(markers), Body::Params(params))
    }

    /// MiniMax-M3's calls: every marker starts with its `]<]minimax[>[` token, whose brackets
    /// hide where one marker ends and the next begins from a reading of the rendering.
    #[must_use]
    pub fn minimax_m3() -> Self {
        let markers = Markers {
            open: format!("{MINIMAX_NS}<tool_call>\n"),
            call_open: format!("{MINIMAX_NS}<invoke name=\""),
            call_close: format!("{MINIMAX_NS}</invoke>\n"),
            close: format!("{MINIMAX_NS}</tool_call>"),
            ..Markers::default()
        };
        let params = Params {
            name_close: "\">".into(),
            key_open: format!("{MINIMAX_NS}<"),
            key_close: ">".into(),
            key_close_json: ">".into(),
            value_close: format!("{MINIMAX_NS}</{}>", super::syntax::ARGUMENT_KEY),
        };
        Self::new(Family::Xml, Layout::Markers(markers), Body::Params(params))
    }

    /// DeepSeek V3.1's calls: the name, `<｜tool▁sep｜>`, the JSON arguments.
    #[must_use]
    pub fn deepseek_v3() -> Self {
        let markers = Markers {
            open: "<｜tool▁calls▁begin｜>".into(),
            call_open: "<｜tool▁call▁begin｜>".into(),
            call_close: "<｜tool▁call▁end｜>".into(),
            close: "<｜tool▁calls▁end｜>".into(),
            ..Markers::default()
        };
        Self::new(Family::NamedJson, Layout::Markers(markers), Body::NamedJson { name_close: "<｜tool▁sep｜>".into() })
    }

    /// Functionary v3.2's `>>>NAME\n{…}`: its generation prompt ends with `>>>`, so a reply
    /// starts with `all\n` (text) or a call, and later calls follow another `>>>`.
    #[must_use]
    pub fn functionary_v3_2() -> Self {
        let markers = Markers { call_open: ">>>".into(), ..Markers::default() };
        let format =
            Self::new(Family::NamedJson, Layout::Markers(markers), Body::NamedJson { name_close: "\n".into() });
        Self(Arc::new(Description { text_recipient: Some("all\n".into()), ..(*format.0).clone() }))
    }

    /// One format of each kind (for tests and tools that go through them all).
    #[must_use]
    pub fn examples() -> Vec<Self> {
        vec![
            Self::generic(),
            Self::hermes(),
            Self::llama3(),
            Self::mistral(),
            Self::gemma4(),
            Self::function_gemma(),
            Self::lfm2(),
            Self::qwen3_coder(),
            Self::deepseek_v3(),
            Self::harmony(),
        ]
    }

    /// Detects the format `template` writes calls in: explicit handlers where a syntax cannot
    /// be read off a rendering (Llama 3's bare JSON, Gemma's value syntax, LFM2's calls in
    /// text), else the syntax read off the template's rendering of sentinel calls; templates
    /// that write no calls get [`ToolFormat::generic`].
    #[must_use]
    pub fn detect(template: &ChatTemplate, reasoning: Option<ReasoningFormat>) -> Self {
        let source = template.source();
        let explicit = if source.contains("<|tool_call>call:") {
            Some(Self::gemma4())
        } else if source.contains("<start_function_call>") {
            Some(Self::function_gemma())
        } else if source.contains("<|tool_call_start|>")
            || source.contains("<|tool_list_start|>")
            || source.contains("\"List of tools: [\"")
        {
            // LFM2.5-Instruct's template lists the tools as LFM2's do but writes no calls.
            Some(Self::lfm2())
        } else if source.contains(MINIMAX_NS) {
            Some(Self::minimax_m3())
        } else if source.contains("<|tool_call|>") && source.contains("<|start_of_role|>") {
            Some(Self::granite())
        } else if source.contains("<|start_header_id|>") && source.contains("\"parameters\": ") {
            Some(Self::llama3())
        } else if source.contains("<|channel|>") && source.contains("functions.") {
            Some(Self::harmony())
        } else {
            None
        };
        let format = explicit.unwrap_or_else(|| {
            // A template that needs variables of its own (firefunction's `functions` and
            // `datetime`, which clients give in `chat_template_kwargs`) is read with them empty.
            let own_variables: TemplateKwargs =
                template.free_variables().into_iter().map(|name| (name, serde_json::Value::from(""))).collect();
            let render = |messages: &[ChatMessage], tools: &[ToolDefinition], generation: bool| {
                let definitions = serde_json::Value::Array(tools.iter().map(ToolDefinition::to_openai_json).collect());
                template
                    .render(messages, Some(&definitions), generation, &TemplateKwargs::new())
                    .or_else(|_| template.render(messages, Some(&definitions), generation, &own_variables))
                    .ok()
            };
            read_syntax(&render, reasoning).map_or_else(Self::generic, Self::from_syntax)
        });
        let format = if source.contains("length 9") { format.with_short_ids() } else { format };
        let no_tools = TemplateKwargs::new();
        let refuses_system = || {
            let system = [ChatMessage::system("S"), ChatMessage::user("U")];
            template.render(&system, None, true, &no_tools).is_err()
                && template.render(&system[1..], None, true, &no_tools).is_ok()
        };
        if format.family() == Family::Generic && refuses_system() {
            Self(Arc::new(Description { tools_in_user_turn: true, ..(*format.0).clone() }))
        } else {
            format
        }
    }

    /// Whether the generic format's tool description opens the first user turn (the template
    /// refuses a system message) rather than the system message.
    #[must_use]
    pub fn tools_in_user_turn(&self) -> bool {
        self.0.tools_in_user_turn
    }

    /// The kind of syntax.
    #[must_use]
    pub fn family(&self) -> Family {
        self.0.family
    }

    /// A short name for logs and `/v1/models`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.0.family.name()
    }

    /// The family and the text that opens calls (`xml <tool_call>`), for the docs.
    #[must_use]
    pub fn summary(&self) -> String {
        match self.openers().first() {
            Some(opener) if self.family() != Family::Generic => format!("{} {opener}", self.name()),
            _ => self.name().to_string(),
        }
    }

    /// Whether the chat template itself renders `tools`; otherwise firstword writes them into
    /// the system message (see [`super::prepare_messages`]).
    #[must_use]
    pub fn template_renders_tools(&self) -> bool {
        self.0.family != Family::Generic
    }

    /// Whether the chat template renders an assistant's `tool_calls`; otherwise firstword
    /// writes them into its text, as the model wrote them.
    #[must_use]
    pub fn template_renders_calls(&self) -> bool {
        self.0.family != Family::Generic && !self.0.calls_in_text
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub(crate) fn body(&self) -> &Body {
        &self.0.body
    }

    /// The markers the parser follows: Llama 3's optional `<|python_tag|>` as a call's open.
    pub(crate) fn parser_markers(&self) -> Markers {
        match self.layout() {
            Layout::Markers(markers) => markers.clone(),
            Layout::BareJson => Markers { call_open: PYTHON_TAG.into(), ..Markers::default() },
        }
    }

    /// How a call's body begins, where that alone tells a next call (a JSON object).
    pub(crate) fn body_start(&self) -> Option<char> {
        matches!(self.body(), Body::Json { .. }).then_some('{')
    }

    /// Whether a reply may hold several calls (Llama 3 writes one per message, and so do
    /// templates that write only a reply's first call).
    #[must_use]
    pub fn parallel_calls(&self) -> bool {
        *self.layout() != Layout::BareJson && !self.0.single_call
    }

    /// Texts that start a call wherever they appear in free text: the triggers of a lazy
    /// grammar, and stop strings when calls are not allowed.
    #[must_use]
    pub fn openers(&self) -> Vec<String> {
        match self.layout() {
            Layout::Markers(markers) => vec![markers.opener()],
            Layout::BareJson => vec![PYTHON_TAG.to_string()],
        }
    }

    /// Texts that start a call only where they open the reply (after optional whitespace):
    /// Llama 3's bare `{"name"`. Elsewhere they are ordinary text, so they are never stop
    /// strings.
    #[must_use]
    pub fn anchored_openers(&self) -> Vec<String> {
        match self.layout() {
            Layout::BareJson => vec![BARE_JSON_OPENER.to_string()],
            Layout::Markers(_) => Vec::new(),
        }
    }

    /// The arguments key of a bare JSON call opening the reply (`{"name": …, KEY: {…}}`): the
    /// format's own for JSON formats, OpenAI's `arguments` for the others.
    pub(crate) fn bare_args_key(&self) -> String {
        match self.body() {
            Body::Json { args_key, .. } => args_key.clone(),
            _ => "arguments".into(),
        }
    }

    /// Every marker of the format (openers, closers, quotes): the special tokens that must
    /// be shown as text for the parser to see them.
    #[must_use]
    pub fn markers(&self) -> Vec<String> {
        let mut markers = match self.layout() {
            Layout::Markers(markers) => markers.pieces(),
            Layout::BareJson => vec![PYTHON_TAG.to_string()],
        };
        match self.body() {
            Body::Gemma { quote } => markers.push((*quote).to_string()),
            Body::NamedJson { name_close } => markers.extend(literal_pieces(name_close)),
            Body::Params(params) => markers.extend(params.pieces()),
            Body::Json { .. } | Body::Pythonic => {}
        }
        markers.dedup();
        markers
    }

    /// A fresh call id. Mistral's templates require 9 alphanumerics; others use OpenAI's style.
    #[must_use]
    pub fn new_call_id(&self) -> String {
        if self.0.short_ids {
            std::iter::repeat_with(fastrand::alphanumeric).take(9).collect()
        } else {
            format!("call_{}", std::iter::repeat_with(fastrand::alphanumeric).take(24).collect::<String>())
        }
    }

    /// `calls` as this format writes them (the form the grammar produces), so calls sent back
    /// in the history render to the text the model generated. In a format whose reply starts
    /// inside the opener, the first call's opener is the prompt's, not the reply's.
    #[must_use]
    pub fn write_calls(&self, calls: &[ToolCall], tools: &[ToolDefinition]) -> String {
        match self.layout() {
            // Where the prompt writes the first call's opener, the model does not.
            Layout::Markers(markers) if self.text_recipient().is_some() => {
                let text = write::section(markers, self.body(), calls, tools);
                text.strip_prefix(markers.call_open.as_str()).map(str::to_string).unwrap_or(text)
            }
            Layout::Markers(markers) => write::section(markers, self.body(), calls, tools),
            Layout::BareJson => {
                calls.iter().map(|call| write::call_text(self.body(), call, 0, tools)).collect::<Vec<_>>().join("\n")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect(source: &str) -> ToolFormat {
        let template = ChatTemplate::new(source, "", "").expect("compiles");
        ToolFormat::detect(&template, ReasoningFormat::detect(source))
    }

    #[test]
    fn explicit_formats_are_detected_from_their_markers() {
        assert_eq!(detect("{{- '<|tool_call>call:' + function['name'] -}}"), ToolFormat::gemma4());
        assert_eq!(detect("<start_function_call>call:"), ToolFormat::function_gemma());
        assert_eq!(detect("<|im_start|>{{ message['role'] }}"), ToolFormat::generic());
    }

    #[test]
    fn a_template_that_writes_hermes_calls_is_read_as_hermes() {
        let source = "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}\
            {% for c in m.tool_calls or [] %}{% if not loop.first %}{{ '\\n' }}{% endif %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\
            <|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        assert_eq!(detect(source), ToolFormat::hermes());
    }

    /// Functionary v3.2's assistant turns and generation prompt.
    const FUNCTIONARY_V3_2: &str = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n\
        {% if m.role != 'assistant' %}{{ m.content }}{% else %}{% if m.content %}{{ '>>>all\\n' + m.content }}{% endif %}\
        {% for c in m.tool_calls or [] %}{{ '>>>' + c.function.name + '\\n' + c.function.arguments }}{% endfor %}{% endif %}\
        <|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n>>>{% endif %}";

    #[test]
    fn a_generation_prompt_that_ends_with_the_opener_is_read_off_the_template() {
        let format = detect(FUNCTIONARY_V3_2);
        assert_eq!(format, ToolFormat::functionary_v3_2());
        assert_eq!((format.openers(), format.text_recipient()), (vec![">>>".to_string()], Some("all\n")));
        assert!(format.parallel_calls());
        // The reply holds the calls without the first opener: the prompt wrote it.
        let calls = [
            ToolCall { id: "a".into(), name: "get_weather".into(), arguments: r#"{"city": "Paris"}"#.into() },
            ToolCall { id: "b".into(), name: "set_timer".into(), arguments: r#"{"minutes": 10}"#.into() },
        ];
        assert_eq!(
            format.write_calls(&calls, &[]),
            "get_weather\n{\"city\": \"Paris\"}>>>set_timer\n{\"minutes\": 10}"
        );
    }

    #[test]
    fn a_template_that_writes_calls_only_without_content_is_read_with_none() {
        // DeepSeek-R1-Distill-Llama's: calls only where `content is none`, no close after one call.
        let source = "{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}{% endif %}\
            {% if m.role == 'assistant' and m.content is none %}{% for c in m.tool_calls %}\
            {{ '<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + c.type + '<｜tool▁sep｜>' + c.function.name + '\\n```json\\n' + c.function.arguments + '\\n```<｜tool▁call▁end｜>' }}\
            {% endfor %}{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}\
            {% if add_generation_prompt %}<｜Assistant｜>{% endif %}";
        let format = detect(source);
        assert_eq!(format.family(), Family::NamedJson);
        assert_eq!(format.openers(), ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"]);
    }

    #[test]
    fn mistral_ids_fit_its_template() {
        let id = ToolFormat::mistral().new_call_id();
        assert_eq!(id.len(), 9);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
        assert!(ToolFormat::hermes().new_call_id().starts_with("call_"));
    }
}
