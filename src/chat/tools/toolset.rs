//! Tool definitions and JSON output schemas, checked once per request: names, schemas the
//! grammar converter accepts, and compiled validators for what the model returns.

use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::gbnf;

/// A function the model may call (OpenAI `tools[].function`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    /// Function name: letters, digits, `_` and `-`, at most 64 characters.
    pub name: String,
    /// What the function does, for the model.
    pub description: Option<String>,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

impl ToolDefinition {
    /// The definition in OpenAI's `{"type": "function", "function": {...}}` shape, as chat
    /// templates and the generic tool prompt show it to the model.
    #[must_use]
    pub fn to_openai_json(&self) -> Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::String(self.name.clone()));
        if let Some(description) = &self.description {
            function.insert("description".into(), Value::String(description.clone()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        serde_json::json!({"type": "function", "function": Value::Object(function)})
    }
}

/// Whether and which tool the model must call (OpenAI `tool_choice`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides: text, or calls.
    #[default]
    Auto,
    /// No calls; text only.
    None,
    /// At least one call, no text.
    Required,
    /// Exactly this function.
    Function(String),
}

/// A problem with the tools or output schema of a request. Each names the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// A name that is empty, too long or has characters other than letters, digits, `_`, `-`.
    #[error("tool name {name:?} is invalid: use 1-64 letters, digits, '_' or '-'")]
    InvalidName {
        /// Index in `tools`.
        index: usize,
        /// The name.
        name: String,
    },
    /// Two tools share a name.
    #[error("tool name {name:?} is used by more than one tool")]
    DuplicateName {
        /// Index of the second one in `tools`.
        index: usize,
        /// The name.
        name: String,
    },
    /// A parameters schema that is not a valid JSON Schema or that the grammar converter cannot
    /// handle.
    #[error("the parameters schema of tool {name:?} cannot be used: {reason}")]
    UnusableSchema {
        /// Index in `tools`.
        index: usize,
        /// The tool.
        name: String,
        /// Why.
        reason: String,
    },
    /// The response format schema cannot be used.
    #[error("the response_format schema cannot be used: {0}")]
    UnusableOutputSchema(String),
    /// `tool_choice` names a function that is not among the tools.
    #[error("tool_choice names function {0:?}, which is not among the tools")]
    UnknownChoice(String),
    /// `tool_choice` asks for a call but there are no tools.
    #[error("tool_choice {0:?} needs at least one tool in 'tools'")]
    ChoiceWithoutTools(String),
}

impl ToolError {
    /// The request field at fault, as an OpenAI `param` path.
    #[must_use]
    pub fn param(&self) -> String {
        match self {
            Self::InvalidName { index, .. } | Self::DuplicateName { index, .. } => {
                format!("tools[{index}].function.name")
            }
            Self::UnusableSchema { index, .. } => format!("tools[{index}].function.parameters"),
            Self::UnusableOutputSchema(_) => "response_format".into(),
            Self::UnknownChoice(_) | Self::ChoiceWithoutTools(_) => "tool_choice".into(),
        }
    }
}

/// A tool after checking: its validator and the grammar of its arguments.
#[derive(Clone, Debug)]
pub(crate) struct CheckedTool {
    pub spec: ToolDefinition,
    validator: jsonschema::Validator,
    /// GBNF for the arguments object; rules prefixed so that its root is `{prefix}root`.
    pub arguments_grammar: String,
    /// The prefix of this tool's grammar rules.
    pub rule_prefix: String,
    /// The declared arguments, in their order (formats that write arguments one by one).
    pub properties: Vec<Property>,
    /// Whether the schema declares no arguments but allows any (`{"type": "object"}`).
    pub open_properties: bool,
    /// The JSON grammars of the arguments' values, made when a format first needs them.
    property_grammars: Arc<OnceLock<String>>,
}

/// One declared argument of a tool.
#[derive(Clone, Debug)]
pub(crate) struct Property {
    /// Its name.
    pub name: String,
    /// Whether the schema requires it.
    pub required: bool,
    /// What its values are.
    pub kind: PropertyKind,
    /// The root rule of its value's JSON grammar (see [`CheckedTool::property_grammars`]).
    pub json_rule: String,
    /// Its schema (with the tool's definitions, so references resolve).
    schema: Value,
}

/// What an argument's values are, as formats that write values their own way need to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PropertyKind {
    /// Any string.
    Text,
    /// One of these strings.
    Choice(Vec<String>),
    /// An integer.
    Integer,
    /// A number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// Anything else (objects, lists, unions).
    Other,
}

impl PropertyKind {
    fn of(schema: &Value) -> Self {
        let choices = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|values| values.iter().map(|v| v.as_str().map(String::from)).collect::<Option<Vec<String>>>());
        if let Some(choices) = choices.filter(|c| !c.is_empty()) {
            return Self::Choice(choices);
        }
        match schema.get("type").and_then(Value::as_str) {
            Some("string") if schema.get("pattern").is_none() && schema.get("const").is_none() => Self::Text,
            Some("integer") => Self::Integer,
            Some("number") => Self::Number,
            Some("boolean") => Self::Boolean,
            _ => Self::Other,
        }
    }
}

impl CheckedTool {
    /// GBNF for every argument's value as JSON, rules prefixed so that argument `j`'s root is
    /// its `json_rule`; an argument whose schema the converter refuses takes any JSON value.
    pub(crate) fn property_grammars(&self) -> &str {
        self.property_grammars.get_or_init(|| {
            let mut out = String::new();
            for (j, property) in self.properties.iter().enumerate() {
                let prefix = format!("{}p{j}-", self.rule_prefix);
                let grammar = schema_grammar(&property.schema, &prefix)
                    .or_else(|_| schema_grammar(&serde_json::json!({}), &prefix))
                    .unwrap_or_default();
                out.push_str(&grammar);
                out.push('\n');
            }
            out
        })
    }
}

/// The declared arguments of `schema`, in order, with the schema's definitions beside each.
fn properties(root: &Value, rule_prefix: &str) -> Vec<Property> {
    let required: Vec<&str> = root
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(declared) = root.get("properties").and_then(Value::as_object) else { return Vec::new() };
    declared
        .iter()
        .enumerate()
        .map(|(j, (name, property))| {
            let mut schema = property.clone();
            if let Value::Object(map) = &mut schema {
                for defs in ["$defs", "definitions"] {
                    if let Some(found) = root.get(defs) {
                        map.entry(defs).or_insert_with(|| found.clone());
                    }
                }
            }
            Property {
                name: name.clone(),
                required: required.contains(&name.as_str()),
                kind: PropertyKind::of(property),
                json_rule: format!("{rule_prefix}p{j}-root"),
                schema,
            }
        })
        .collect()
}

/// The tools of one request, checked: unique valid names, usable schemas. Clones share the
/// compiled validators.
#[derive(Clone, Debug, Default)]
pub struct ToolSet {
    tools: Vec<CheckedTool>,
}

impl ToolSet {
    /// Checks tool definitions and prepares their validators and grammars.
    ///
    /// # Errors
    /// The first [`ToolError`] found.
    pub fn new(specs: Vec<ToolDefinition>) -> Result<Self, ToolError> {
        let mut tools: Vec<CheckedTool> = Vec::with_capacity(specs.len());
        for (index, spec) in specs.into_iter().enumerate() {
            let valid_name = !spec.name.is_empty()
                && spec.name.len() <= 64
                && spec.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid_name {
                return Err(ToolError::InvalidName { index, name: spec.name });
            }
            if tools.iter().any(|t| t.spec.name == spec.name) {
                return Err(ToolError::DuplicateName { index, name: spec.name });
            }
            let unusable = |reason: String| ToolError::UnusableSchema { index, name: spec.name.clone(), reason };
            if !spec.parameters.is_object() {
                return Err(unusable("it must be a JSON object".into()));
            }
            let validator = jsonschema::validator_for(&spec.parameters).map_err(|e| unusable(e.to_string()))?;
            let rule_prefix = format!("fw-t{index}-");
            let arguments_grammar = schema_grammar(&spec.parameters, &rule_prefix).map_err(unusable)?;
            let properties = properties(&spec.parameters, &rule_prefix);
            let open_properties = spec.parameters.get("properties").is_none();
            tools.push(CheckedTool {
                spec,
                validator,
                arguments_grammar,
                rule_prefix,
                properties,
                open_properties,
                property_grammars: Arc::default(),
            });
        }
        Ok(Self { tools })
    }

    /// Whether there are no tools.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The definitions, in request order.
    pub fn specs(&self) -> impl Iterator<Item = &ToolDefinition> {
        self.tools.iter().map(|t| &t.spec)
    }

    pub(crate) fn checked(&self) -> &[CheckedTool] {
        &self.tools
    }

    /// Checks `tool_choice` against the tools.
    ///
    /// # Errors
    /// An unknown function, or a required/named choice without tools.
    pub fn check_choice(&self, choice: &ToolChoice) -> Result<(), ToolError> {
        match choice {
            ToolChoice::Required if self.is_empty() => Err(ToolError::ChoiceWithoutTools("required".into())),
            ToolChoice::Function(name) if self.is_empty() => Err(ToolError::ChoiceWithoutTools(name.clone())),
            ToolChoice::Function(name) if !self.tools.iter().any(|t| &t.spec.name == name) => {
                Err(ToolError::UnknownChoice(name.clone()))
            }
            _ => Ok(()),
        }
    }

    /// Parses and validates a call's arguments against the tool's schema.
    ///
    /// # Errors
    /// An unknown function, arguments that are not JSON, or the first schema violation.
    pub fn check_arguments(&self, name: &str, arguments: &str) -> Result<Value, ArgumentsError> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.spec.name == name)
            .ok_or_else(|| ArgumentsError::UnknownTool { name: name.to_string() })?;
        let value: Value = serde_json::from_str(arguments).map_err(|e| ArgumentsError::NotJson {
            name: name.to_string(),
            reason: e.to_string(),
            arguments: arguments.to_string(),
        })?;
        tool.validator
            .validate(&value)
            .map_err(|e| ArgumentsError::SchemaMismatch { name: name.to_string(), reason: e.to_string() })?;
        Ok(value)
    }
}

/// Why a call's arguments are not usable ([`ToolSet::check_arguments`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    /// The model called a function that is not among the tools.
    #[error("the model called {name:?}, which is not among the tools")]
    UnknownTool {
        /// The function called.
        name: String,
    },
    /// The arguments do not parse as JSON.
    #[error("the arguments of {name:?} are not valid JSON ({reason}): {arguments}")]
    NotJson {
        /// The function called.
        name: String,
        /// The parser's complaint.
        reason: String,
        /// The arguments as written.
        arguments: String,
    },
    /// The arguments break the tool's parameters schema.
    #[error("the arguments of {name:?} do not match its schema: {reason}")]
    SchemaMismatch {
        /// The function called.
        name: String,
        /// The first violation.
        reason: String,
    },
}

/// Why a reply is not the JSON its `response_format` asks for ([`OutputSchema::check`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    /// The reply does not parse as JSON.
    #[error("the reply is not valid JSON ({reason}): {text}")]
    NotJson {
        /// The parser's complaint.
        reason: String,
        /// The reply.
        text: String,
    },
    /// The reply breaks the schema.
    #[error("the reply does not match the response_format schema: {reason}")]
    SchemaMismatch {
        /// The first violation.
        reason: String,
    },
}

/// A JSON Schema the whole reply must match (`response_format`). Clones share the compiled
/// validator.
#[derive(Clone, Debug)]
pub struct OutputSchema {
    validator: jsonschema::Validator,
    /// GBNF; rules prefixed so that its root is `fw-json-root`.
    pub(crate) grammar: String,
}

impl OutputSchema {
    /// Root rule of [`OutputSchema`] grammars.
    pub(crate) const ROOT: &'static str = "fw-json-root";

    /// Prepares a schema: `{"type": "object"}` for OpenAI's `json_object` mode.
    ///
    /// # Errors
    /// [`ToolError::UnusableOutputSchema`] for invalid or unconvertible schemas.
    pub fn new(schema: &Value) -> Result<Self, ToolError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| ToolError::UnusableOutputSchema(e.to_string()))?;
        let grammar = schema_grammar(schema, "fw-json-").map_err(ToolError::UnusableOutputSchema)?;
        Ok(Self { validator, grammar })
    }

    /// Parses and validates a complete reply.
    ///
    /// # Errors
    /// Why the text is not JSON or does not match the schema.
    pub fn check(&self, text: &str) -> Result<Value, ReplyError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ReplyError::NotJson { reason: e.to_string(), text: text.to_string() })?;
        self.validator.validate(&value).map_err(|e| ReplyError::SchemaMismatch { reason: e.to_string() })?;
        Ok(value)
    }
}

/// GBNF for a JSON Schema, by llama.cpp's converter, with rules prefixed and whitespace
/// between JSON tokens limited to one space: the converter allows newlines and 20 spaces of
/// indentation, on which small models spend (and loop) tokens.
fn schema_grammar(schema: &Value, prefix: &str) -> Result<String, String> {
    let grammar = llama_cpp_2::json_schema_to_grammar(&schema.to_string())
        .map_err(|_| "llama.cpp's JSON-Schema-to-grammar converter does not support it".to_string())?;
    let compact: String = grammar
        .lines()
        .map(|line| if line.starts_with("space ::=") { "space ::= \" \"?" } else { line })
        .collect::<Vec<_>>()
        .join("\n");
    Ok(gbnf::prefix_rules(&compact, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> ToolDefinition {
        ToolDefinition {
            name: "get_weather".into(),
            description: Some("Current weather".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
                "additionalProperties": false}),
        }
    }

    #[test]
    fn duplicate_and_invalid_names_are_refused_with_their_field() {
        let err = ToolSet::new(vec![weather(), weather()]).expect_err("duplicate");
        assert_eq!(err.param(), "tools[1].function.name");
        let bad = ToolDefinition { name: "get weather".into(), ..weather() };
        let err = ToolSet::new(vec![bad]).expect_err("space in name");
        assert!(matches!(err, ToolError::InvalidName { index: 0, .. }), "{err}");
    }

    #[test]
    fn unusable_schemas_are_refused() {
        let bad = ToolDefinition {
            parameters: json!({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}),
            ..weather()
        };
        let err = ToolSet::new(vec![bad]).expect_err("dangling $ref");
        assert_eq!(err.param(), "tools[0].function.parameters");
        let not_object = ToolDefinition { parameters: json!("string"), ..weather() };
        assert!(ToolSet::new(vec![not_object]).is_err());
        let invalid = ToolDefinition { parameters: json!({"type": 12}), ..weather() };
        assert!(ToolSet::new(vec![invalid]).is_err());
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let tools = ToolSet::new(vec![weather()]).expect("valid");
        assert!(tools.check_arguments("get_weather", r#"{"city": "Paris", "unit": "celsius"}"#).is_ok());
        let wrong_enum = tools.check_arguments("get_weather", r#"{"city": "Paris", "unit": "kelvin"}"#);
        let wrong_enum = wrong_enum.expect_err("enum");
        assert!(matches!(wrong_enum, ArgumentsError::SchemaMismatch { .. }), "{wrong_enum}");
        assert!(wrong_enum.to_string().contains("do not match"), "{wrong_enum}");
        let cut = tools.check_arguments("get_weather", r#"{"city": "Paris""#).expect_err("not JSON");
        assert!(matches!(cut, ArgumentsError::NotJson { .. }), "{cut}");
        assert_eq!(
            tools.check_arguments("set_timer", "{}"),
            Err(ArgumentsError::UnknownTool { name: "set_timer".into() })
        );
    }

    #[test]
    fn choices_must_name_a_tool_and_need_tools() {
        let tools = ToolSet::new(vec![weather()]).expect("valid");
        assert!(tools.check_choice(&ToolChoice::Function("get_weather".into())).is_ok());
        assert_eq!(
            tools.check_choice(&ToolChoice::Function("nope".into())),
            Err(ToolError::UnknownChoice("nope".into()))
        );
        assert!(ToolSet::default().check_choice(&ToolChoice::Required).is_err());
        assert!(ToolSet::default().check_choice(&ToolChoice::Auto).is_ok());
    }

    #[test]
    fn grammar_rules_are_prefixed_per_tool() {
        let tools = ToolSet::new(vec![weather()]).expect("valid");
        let grammar = &tools.checked()[0].arguments_grammar;
        assert!(grammar.contains("fw-t0-root ::="), "{grammar}");
        assert!(!grammar.lines().any(|l| l.starts_with("root ::=")), "{grammar}");
        assert!(grammar.contains("fw-t0-space ::= \" \"?"), "compact whitespace: {grammar}");
    }

    #[test]
    fn output_schema_validates_replies() {
        let schema =
            OutputSchema::new(&json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
                .expect("usable");
        assert!(schema.check(r#"{"n": 3}"#).is_ok());
        let wrong_type = schema.check(r#"{"n": "3"}"#).expect_err("a string");
        assert!(matches!(wrong_type, ReplyError::SchemaMismatch { .. }), "{wrong_type}");
        let prose = schema.check("three").expect_err("not JSON");
        assert!(matches!(prose, ReplyError::NotJson { .. }), "{prose}");
    }
}
