//! Hugging Face chat templates rendered with minijinja, the way `transformers` renders them.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};

mod generation;
mod lists;
mod probes;
mod python;
mod variables;

use super::pyjson;
use super::{CallArguments, CallContent, ChatMessage, TemplateKwargs};

const TEMPLATE_NAME: &str = "chat";
const GEMMA_TEMPLATE: &str = include_str!("templates/gemma.jinja");

/// A template problem.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TemplateError {
    /// The template does not compile.
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    /// The template file cannot be read.
    #[error("cannot read chat template file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        reason: String,
    },
    /// The GGUF has no template and none is known for its architecture.
    #[error(
        "the model has no chat template and firstword knows none for architecture '{0}'; give it a chat template file"
    )]
    Missing(String),
    /// Rendering failed for these messages (including `raise_exception` in the template).
    #[error("the chat template rejected the messages: {0}")]
    Render(String),
    /// Rendering these messages went past the render limits (template steps, output length).
    #[error("the chat template exceeded a limit rendering the messages: {0}")]
    Limit(String),
}

/// Bounds on one rendering, so that no template (a GGUF's or a file's) takes unbounded time or
/// produces unbounded output. Minijinja bounds some single operations itself (a repeated string
/// is at most 100 MB, a `range` at most 100,000 items).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RenderLimits {
    /// Minijinja fuel: most template instructions executed.
    pub fuel: u64,
    /// Longest rendered text, in bytes.
    pub output_bytes: usize,
}

impl RenderLimits {
    /// Real templates take tens of instructions per message (SmolLM2's about 25, the built-in
    /// Gemma one about 50), so this fuel is a million messages and more (a few seconds); the
    /// output bound is eight times the default request body limit, far beyond any context.
    pub(crate) const DEFAULT: Self = Self { fuel: 50_000_000, output_bytes: 256 << 20 };
}

/// Where the chat template came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// `tokenizer.chat_template` in the GGUF.
    Gguf,
    /// A file given by the user.
    File(PathBuf),
    /// Chosen by firstword from the model's architecture (the GGUF has none).
    Builtin(&'static str),
}

impl std::fmt::Display for TemplateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gguf => f.write_str("gguf"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Builtin(name) => write!(f, "built-in {name} (the GGUF has none)"),
        }
    }
}

/// What template selection needs to know about a model.
#[derive(Clone, Debug, Default)]
pub struct ModelTemplateFacts {
    /// `tokenizer.chat_template`, if the GGUF has one.
    pub gguf_template: Option<String>,
    /// `general.architecture`.
    pub architecture: String,
    /// Text of the BOS token.
    pub bos_token: String,
    /// Text of the EOS token.
    pub eos_token: String,
}

/// A compiled chat template plus the special-token texts it may print.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    limits: RenderLimits,
    forms: probes::Forms,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    ///
    /// # Errors
    /// [`TemplateError::Compile`] if it does not parse.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        Self::with_limits(source, bos_token, eos_token, RenderLimits::DEFAULT)
    }

    /// [`Self::new`] with other render limits.
    pub(crate) fn with_limits(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        limits: RenderLimits,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_fuel(Some(limits.fuel));
        // transformers renders with trim_blocks and lstrip_blocks on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("namespace", lists::namespace);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("string", python::string_filter);
        env.add_filter("upper", python::upper_filter);
        env.add_filter("lower", python::lower_filter);
        env.add_test("iterable", python::is_iterable);
        env.set_formatter(python::format);
        let compiled = generation::rewrite_generation_blocks(source).into_owned();
        env.add_template_owned(TEMPLATE_NAME, compiled).map_err(|e| TemplateError::Compile(e.to_string()))?;
        let mut template = Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            limits,
            forms: probes::Forms::default(),
        };
        template.forms = template.probe_forms();
        Ok(template)
    }

    /// Picks the template for a model: a user file first, then the GGUF's own, then one known
    /// for the architecture (with a warning). Never guesses ChatML for a model that does not
    /// speak it.
    ///
    /// # Errors
    /// The file is unreadable, the template does not compile, or none is known.
    pub fn for_model(facts: &ModelTemplateFacts, file: Option<&Path>) -> Result<(Self, TemplateSource), TemplateError> {
        let compile = |source: &str| Self::new(source, &facts.bos_token, &facts.eos_token);
        if let Some(path) = file {
            let source = std::fs::read_to_string(path)
                .map_err(|e| TemplateError::Unreadable { path: path.to_path_buf(), reason: e.to_string() })?;
            return Ok((compile(&source)?, TemplateSource::File(path.to_path_buf())));
        }
        if let Some(source) = facts.gguf_template.as_deref().filter(|s| !s.trim().is_empty()) {
            return Ok((compile(source)?, TemplateSource::Gguf));
        }
        if facts.architecture.starts_with("gemma") {
            tracing::warn!(
                architecture = %facts.architecture,
                "the GGUF has no chat template; using firstword's built-in Gemma turn format (a chat template file overrides it)"
            );
            return Ok((compile(GEMMA_TEMPLATE)?, TemplateSource::Builtin("gemma")));
        }
        Err(TemplateError::Missing(facts.architecture.clone()))
    }

    /// The template's Jinja source.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation to prompt text; `kwargs` are extra template variables (the
    /// conversation's own variables take precedence over them).
    ///
    /// # Errors
    /// [`TemplateError::Render`] when the template fails or calls `raise_exception`;
    /// [`TemplateError::Limit`] past the render limits.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
    ) -> Result<String, TemplateError> {
        self.render_as(messages, tools, add_generation_prompt, kwargs, self.forms)
    }

    fn render_as(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &TemplateKwargs,
        forms: probes::Forms,
    ) -> Result<String, TemplateError> {
        let messages: Vec<serde_json::Value> =
            messages.iter().map(|m| m.to_template_value(forms.arguments, forms.content)).collect();
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| TemplateError::Compile(e.to_string()))?;
        let mut output = BoundedOutput { text: Vec::new(), limit: self.limits.output_bytes, overflowed: false };
        let conversation = minijinja::context! {
            messages => Value::from_serialize(&messages),
            tools => tools.map(Value::from_serialize),
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        // The last map wins where both have a key.
        let context = minijinja::value::merge_maps([Value::from_serialize(kwargs), conversation]);
        let rendered = template.render_captured_to(context, &mut output);
        if output.overflowed {
            return Err(TemplateError::Limit(format!(
                "the prompt would be longer than {} bytes",
                self.limits.output_bytes
            )));
        }
        if let Err(e) = rendered {
            return Err(match (e.kind(), e.detail()) {
                (ErrorKind::OutOfFuel, _) => TemplateError::Limit(format!(
                    "rendering took more than {} template steps (is the template looping?)",
                    self.limits.fuel
                )),
                (ErrorKind::InvalidOperation, Some(detail)) => TemplateError::Render(detail.to_string()),
                _ => TemplateError::Render(e.to_string()),
            });
        }
        // Minijinja writes whole `str`s, and a write past the limit is refused whole.
        String::from_utf8(output.text).map_err(|e| TemplateError::Render(e.to_string()))
    }
}

/// The rendered text, refusing writes past `limit` bytes: the output stops growing there, not
/// after the whole rendering.
struct BoundedOutput {
    text: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for BoundedOutput {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.text.len().saturating_add(bytes.len()) > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("the output limit is reached"));
        }
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `raise_exception(message)`: templates use it to reject conversations they cannot render.
fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time in a strftime format (Llama 3.x templates print it).
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, format!("bad strftime format {format:?}")))?;
    Ok(Value::from(out))
}

/// `tojson`, as transformers defines it: Python's `json.dumps` with its options (`indent`,
/// `ensure_ascii`, `separators`, `sort_keys`; non-ASCII kept by default).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let separators = match separators.as_deref() {
        None => None,
        Some([item, key]) => Some((item.clone(), key.clone())),
        Some(_) => {
            return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"))
        }
    };
    let options = pyjson::Dumps {
        indent: kwargs.get("indent")?,
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        separators,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    if value.is_undefined() {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: the value is undefined"));
    }
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(pyjson::dumps_with(&json, &options)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{Role, ToolCall};

    fn gemma() -> ChatTemplate {
        ChatTemplate::new(GEMMA_TEMPLATE, "<bos>", "<eos>").expect("gemma template compiles")
    }

    #[test]
    fn gemma_folds_the_system_prompt_into_the_first_user_turn() {
        let prompt = gemma()
            .render(
                &[
                    ChatMessage::system("Be brief."),
                    ChatMessage::user(" Hi! "),
                    ChatMessage::assistant("Hello."),
                    ChatMessage::user("Bye"),
                ],
                None,
                true,
                &TemplateKwargs::new(),
            )
            .expect("renders");
        assert_eq!(
            prompt,
            "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn gemma_without_system_and_without_generation_prompt() {
        let prompt = gemma().render(&[ChatMessage::user("Hi")], None, false, &TemplateKwargs::new()).expect("renders");
        assert_eq!(prompt, "<bos><start_of_turn>user\nHi<end_of_turn>\n");
    }

    #[test]
    fn kwargs_reach_the_template_but_never_replace_the_conversation() {
        let t = ChatTemplate::new(
            "{% if enable_thinking is defined and not enable_thinking %}off{% endif %}|{{ messages | length }}",
            "",
            "",
        )
        .expect("compiles");
        let mut kwargs = TemplateKwargs::new();
        kwargs.insert("enable_thinking".into(), serde_json::json!(false));
        kwargs.insert("messages".into(), serde_json::json!([1, 2, 3]));
        let out = t.render(&[ChatMessage::user("x")], None, true, &kwargs).expect("renders");
        assert_eq!(out, "off|1");
        assert_eq!(t.render(&[ChatMessage::user("x")], None, true, &TemplateKwargs::new()).expect("renders"), "|1");
    }

    #[test]
    fn raise_exception_becomes_a_render_error_with_its_message() {
        let t = ChatTemplate::new("{{ raise_exception('Only user and assistant roles are supported!') }}", "", "")
            .expect("compiles");
        let err = t.render(&[ChatMessage::user("x")], None, true, &TemplateKwargs::new()).expect_err("raises");
        assert!(
            matches!(&err, TemplateError::Render(m) if m == "Only user and assistant roles are supported!"),
            "{err}"
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new("{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}", "", "").expect("compiles");
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"b": 1, "a": "é"}}}]);
        let out = t.render(&[], Some(&tools), false, &TemplateKwargs::new()).expect("renders");
        assert_eq!(
            out,
            "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"b\": 1, \"a\": \"é\"}}}]|{\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"get_weather\",\n    \"parameters\": {\n      \"b\": 1,\n      \"a\": \"é\"\n    }\n  }\n}"
        );
    }

    #[test]
    fn strftime_now_and_python_string_methods_work() {
        let t = ChatTemplate::new(
            "{{ strftime_now('%Y') | length }}|{{ ' x '.strip() }}|{{ 'a,b'.split(',') | length }}",
            "",
            "",
        )
        .expect("compiles");
        assert_eq!(t.render(&[], None, false, &TemplateKwargs::new()).expect("renders"), "4|x|2");
    }

    #[test]
    fn tool_call_arguments_reach_templates_as_objects() {
        let t = ChatTemplate::new("{{ messages[0].tool_calls[0].function.arguments.city }}", "", "").expect("compiles");
        let mut message = ChatMessage::new(Role::Assistant, "");
        message.tool_calls.push(crate::chat::ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris"}"#.into(),
        });
        assert_eq!(t.render(&[message], None, false, &TemplateKwargs::new()).expect("renders"), "Paris");
    }

    #[test]
    fn templates_that_only_concatenate_arguments_get_them_as_text() {
        let source = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ '>>>' + c.function.name + '\\n' + c.function.arguments }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(source, "", "").expect("compiles");
        assert_eq!(t.call_arguments(), CallArguments::Text);
        let mut message = ChatMessage::new(Role::Assistant, "");
        message.tool_calls.push(ToolCall { id: "c".into(), name: "f".into(), arguments: r#"{"a":1}"#.into() });
        assert_eq!(t.render(&[message], None, false, &TemplateKwargs::new()).expect("renders"), ">>>f\n{\"a\":1}");
        let objects =
            ChatTemplate::new("{{ messages[0].tool_calls[0].function.arguments | tojson }}", "", "").expect("compiles");
        assert_eq!(objects.call_arguments(), CallArguments::Object);
    }

    #[test]
    fn without_tools_tools_is_none_and_not_iterable() {
        let t = ChatTemplate::new(
            "{{ tools is defined }}{{ tools is none }}{% if tools is iterable and tools | length > 0 %}tools{% endif %}{{ documents }}",
            "",
            "",
        )
        .expect("compiles");
        assert_eq!(t.render(&[], None, false, &TemplateKwargs::new()).expect("renders"), "TrueTrueNone");
        assert_eq!(
            t.render(&[], Some(&serde_json::json!([{}])), false, &TemplateKwargs::new()).expect("renders"),
            "TrueFalsetoolsNone"
        );
    }

    #[test]
    fn generation_blocks_render_their_body_in_a_scope_of_their_own() {
        let source = "{% set x = 1 %}\n{%- generation -%} {{ messages[0].content }}{% set x = 2 %}{{ x }} {%- endgeneration %}{{ x }}";
        let t = ChatTemplate::new(source, "", "").expect("compiles");
        assert_eq!(
            t.render(&[ChatMessage::assistant("a")], None, false, &TemplateKwargs::new()).expect("renders"),
            "a21"
        );
    }

    #[test]
    fn tojson_takes_transformers_options_and_dicts_print_as_python() {
        let t = ChatTemplate::new("{{ tools[0] | tojson(ensure_ascii=True, sort_keys=True) }}|{{ tools[0] }}", "", "")
            .expect("compiles");
        let tools = serde_json::json!([{"n": "é", "a": true}]);
        assert_eq!(
            t.render(&[], Some(&tools), false, &TemplateKwargs::new()).expect("renders"),
            r#"{"a": true, "n": "\u00e9"}|{'n': 'é', 'a': True}"#
        );
    }

    #[test]
    fn reasoning_reaches_templates_as_thinking_and_reasoning_content() {
        let t = ChatTemplate::new("{% for k in messages[0] %}{{ k }} {% endfor %}{{ messages[0].thinking }}", "", "")
            .expect("compiles");
        let mut message = ChatMessage::assistant("a");
        message.reasoning = Some("r".into());
        assert_eq!(
            t.render(&[message], None, false, &TemplateKwargs::new()).expect("renders"),
            "thinking role content reasoning_content r"
        );
    }

    fn limited(source: &str, fuel: u64, output_bytes: usize) -> ChatTemplate {
        ChatTemplate::with_limits(source, "", "", RenderLimits { fuel, output_bytes }).expect("compiles")
    }

    #[test]
    fn endless_loops_run_out_of_fuel() {
        let nested = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
        let err = limited(nested, 100_000, 1 << 20)
            .render(&[], None, false, &TemplateKwargs::new())
            .expect_err("out of fuel");
        assert!(matches!(&err, TemplateError::Limit(m) if m.contains("100000 template steps")), "{err}");
        // The default fuel too: 10^10 steps would take minutes.
        let err = ChatTemplate::new(nested, "", "")
            .expect("compiles")
            .render(&[], None, false, &TemplateKwargs::new())
            .expect_err("out of fuel");
        assert!(matches!(&err, TemplateError::Limit(m) if m.contains("template steps")), "{err}");
    }

    #[test]
    fn output_stops_at_its_limit() {
        let long = "{% for i in range(100000) %}{{ 'abcdefghij' }}{% endfor %}";
        assert_eq!(
            limited(long, 1 << 20, 1_000_000).render(&[], None, false, &TemplateKwargs::new()).expect("fits").len(),
            1_000_000
        );
        let err =
            limited(long, 1 << 20, 999_999).render(&[], None, false, &TemplateKwargs::new()).expect_err("too long");
        assert!(matches!(&err, TemplateError::Limit(m) if m.contains("longer than 999999 bytes")), "{err}");
        // One write past the limit is refused whole, not cut.
        let err = limited("{{ 'a' * 5000 }}", 100, 4_999)
            .render(&[], None, false, &TemplateKwargs::new())
            .expect_err("too long");
        assert!(matches!(err, TemplateError::Limit(_)), "{err}");
    }

    #[test]
    fn huge_repetitions_and_ranges_fail_before_allocating() {
        for source in
            ["{{ 'a' * 1000000000 }}", "{% for i in range(10**9) %}{% endfor %}", "{{ range(10**9) | length }}"]
        {
            let err = ChatTemplate::new(source, "", "")
                .expect("compiles")
                .render(&[], None, false, &TemplateKwargs::new())
                .expect_err(source);
            assert!(
                matches!(&err, TemplateError::Render(m) if m.contains("too large") || m.contains("too many")),
                "{err}"
            );
        }
    }

    #[test]
    fn real_templates_stay_far_below_the_limits() {
        let messages: Vec<ChatMessage> =
            (0..10_000)
                .map(|i| {
                    if i % 2 == 0 {
                        ChatMessage::user(format!("question {i}"))
                    } else {
                        ChatMessage::assistant("answer")
                    }
                })
                .collect();
        let hundredth = RenderLimits { fuel: RenderLimits::DEFAULT.fuel / 100, ..RenderLimits::DEFAULT };
        let gemma = ChatTemplate::with_limits(GEMMA_TEMPLATE, "<bos>", "<eos>", hundredth).expect("compiles");
        assert!(
            gemma.render(&messages, None, true, &TemplateKwargs::new()).is_ok(),
            "10,000 messages in a hundredth of the fuel"
        );
    }

    #[test]
    fn missing_template_for_unknown_architecture_is_an_error_not_chatml() {
        let facts = ModelTemplateFacts { architecture: "llama".into(), ..Default::default() };
        assert!(matches!(ChatTemplate::for_model(&facts, None), Err(TemplateError::Missing(a)) if a == "llama"));
    }

    #[test]
    fn gemma_architecture_without_template_gets_the_builtin() {
        let facts = ModelTemplateFacts { architecture: "gemma3".into(), ..Default::default() };
        let (_, source) = ChatTemplate::for_model(&facts, None).expect("builtin");
        assert_eq!(source, TemplateSource::Builtin("gemma"));
    }
}
