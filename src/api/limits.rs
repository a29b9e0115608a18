//! The documented limits on what one request may ask for, checked before any work is done.
//!
//! Each bounds a cost that grows with the request and is paid by every client: llama.cpp's
//! JSON-Schema-to-grammar converter is cubic in optional properties and recursive in `$ref`
//! chains (a hostile schema aborts the process or takes minutes), a large `enum` costs
//! seconds per generated character inside the grammar sampler, and the stop-string matcher
//! and logit-bias sampler cost per token what their lists hold; rendering the chat template,
//! tokenizing and building token pieces cost what the conversation and the texts hold, and
//! stored responses keep what they were given. Requests above a limit get a 400 that names
//! the limit; OpenAI's own limits are used where it has one.

use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::error::{ApiError, Refusal};

/// Most stop strings (OpenAI's limit).
pub(crate) const MAX_STOP_STRINGS: usize = 4;
/// Longest stop string, in bytes.
pub(crate) const MAX_STOP_BYTES: usize = 256;
/// Most `logit_bias` entries (OpenAI's limit).
pub(crate) const MAX_LOGIT_BIAS: usize = 300;
/// Most tools per request (OpenAI's limit).
pub(crate) const MAX_TOOLS: usize = 128;

/// Most messages of one chat request (of a Responses request: its instructions, the stored
/// conversation it continues and its input together). Rendering costs what they hold.
pub(crate) const MAX_MESSAGES: usize = 4_096;
/// `/tokenize` and `/detokenize` take at most this many contexts' worth of input: token ids
/// for `/detokenize`, [`TOKENIZE_BYTES_PER_TOKEN`] bytes of text per token for `/tokenize`.
pub(crate) const TOKENIZER_CONTEXTS: usize = 4;
/// Bytes of `/tokenize` text per token of its allowance (ordinary text averages about 4).
pub(crate) const TOKENIZE_BYTES_PER_TOKEN: usize = 4;
/// Longest Responses `user`, in characters.
pub(crate) const MAX_USER_CHARS: usize = 256;
/// Most responses in one `previous_response_id` chain (the new one included).
pub(crate) const MAX_RESPONSE_CHAIN: usize = 1_024;

/// Limits on a Responses request's `metadata` (OpenAI's): string keys and values.
pub(crate) mod metadata {
    /// Key-value pairs.
    pub(crate) const MAX_PAIRS: usize = 16;
    /// Longest key, in characters.
    pub(crate) const MAX_KEY_CHARS: usize = 64;
    /// Longest value, in characters.
    pub(crate) const MAX_VALUE_CHARS: usize = 512;
}

/// Limits on one JSON schema (a tool's parameters, or `response_format`).
pub(crate) mod schema {
    /// Size of the schema as JSON text.
    pub(crate) const MAX_BYTES: usize = 65_536;
    /// Nesting of JSON objects and arrays in the schema document.
    pub(crate) const MAX_DEPTH: usize = 64;
    /// JSON values in the schema document.
    pub(crate) const MAX_NODES: usize = 10_000;
    /// `$ref` occurrences.
    pub(crate) const MAX_REFS: usize = 100;
    /// Properties of one object.
    pub(crate) const MAX_PROPERTIES: usize = 256;
    /// Properties of one object that are not `required` (the converter's cost is cubic in them).
    pub(crate) const MAX_OPTIONAL_PROPERTIES: usize = 64;
    /// Entries of one `enum`, `anyOf`, `oneOf`, `allOf` or `prefixItems` list.
    pub(crate) const MAX_ALTERNATIVES: usize = 500;
    /// Entries of all such lists together.
    pub(crate) const MAX_TOTAL_ALTERNATIVES: usize = 1_000;
    /// Largest `minLength`/`maxLength`/`minItems`/`maxItems`/`minProperties`/`maxProperties`,
    /// and largest repetition count in a `pattern` (each becomes that many grammar rules).
    pub(crate) const MAX_REPETITION: u64 = 10_000;
    /// Longest `pattern`, in bytes.
    pub(crate) const MAX_PATTERN_BYTES: usize = 1_000;
}

/// Checks stop strings against [`MAX_STOP_STRINGS`] and [`MAX_STOP_BYTES`].
pub(crate) fn check_stops(stops: &[String]) -> Result<(), ApiError> {
    if stops.len() > MAX_STOP_STRINGS {
        return Err(too_many("stop", "stop strings", stops.len(), MAX_STOP_STRINGS));
    }
    if let Some(long) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::refused(
            Refusal::Limit,
            "stop",
            format!("a stop string may be at most {MAX_STOP_BYTES} bytes long, got {}", long.len()),
        ));
    }
    Ok(())
}

/// A JSON list read up to a limit: the first `max` items are kept, the rest only counted (so
/// a huge list costs no memory before it is refused).
#[derive(Debug)]
pub(crate) struct BoundedList<T> {
    /// The first items, at most the limit.
    pub items: Vec<T>,
    /// How many the list held.
    pub total: usize,
}

impl<T> BoundedList<T> {
    /// The items, or a 400 naming `param` when the list held more than `max`.
    pub(crate) fn within(self, param: &str, what: &str, max: usize) -> Result<Vec<T>, ApiError> {
        if self.total > max {
            return Err(too_many(param, what, self.total, max));
        }
        Ok(self.items)
    }
}

/// Reads a [`BoundedList`] keeping at most `max` items.
pub(crate) struct ListSeed<T> {
    max: usize,
    item: PhantomData<T>,
}

impl<T> ListSeed<T> {
    /// A reader keeping at most `max` items.
    pub(crate) fn new(max: usize) -> Self {
        Self { max, item: PhantomData }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for ListSeed<T> {
    type Value = BoundedList<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ListSeed<T> {
    type Value = BoundedList<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        let mut total = 0;
        while total < self.max {
            match seq.next_element()? {
                Some(item) => items.push(item),
                None => return Ok(BoundedList { items, total }),
            }
            total += 1;
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {
            total += 1;
        }
        Ok(BoundedList { items, total })
    }
}

/// Chat `messages`, read up to [`MAX_MESSAGES`] (for `deserialize_with`).
pub(crate) fn bounded_messages<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<BoundedList<T>, D::Error> {
    ListSeed::new(MAX_MESSAGES).deserialize(deserializer)
}

/// Checks a Responses request's `metadata` (OpenAI's rules: an object of at most 16 string
/// values, keys of at most 64 characters, values of at most 512) and `user`.
pub(crate) fn check_metadata(metadata: Option<&Value>, user: Option<&str>) -> Result<(), ApiError> {
    use metadata::*;
    if let Some(user) = user {
        let chars = user.chars().count();
        if chars > MAX_USER_CHARS {
            return Err(ApiError::refused(
                Refusal::Limit,
                "user",
                format!("'user' may be at most {MAX_USER_CHARS} characters long, got {chars}"),
            ));
        }
    }
    let pairs = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(pairs)) => pairs,
        Some(_) => return Err(ApiError::invalid("metadata", "'metadata' must be an object of string values")),
    };
    if pairs.len() > MAX_PAIRS {
        return Err(too_many("metadata", "metadata pairs", pairs.len(), MAX_PAIRS));
    }
    for (key, value) in pairs {
        let limit = |what: &str, got: usize, max: usize| {
            ApiError::refused(
                Refusal::Limit,
                format!("metadata.{}", key.chars().take(MAX_KEY_CHARS).collect::<String>()),
                format!("a metadata {what} may be at most {max} characters long, got {got}"),
            )
        };
        let key_chars = key.chars().count();
        if key_chars > MAX_KEY_CHARS {
            return Err(limit("key", key_chars, MAX_KEY_CHARS));
        }
        let Value::String(text) = value else {
            return Err(ApiError::invalid(format!("metadata.{key}"), "metadata values must be strings"));
        };
        let value_chars = text.chars().count();
        if value_chars > MAX_VALUE_CHARS {
            return Err(limit("value", value_chars, MAX_VALUE_CHARS));
        }
    }
    Ok(())
}

/// A 400 for a list longer than its limit.
pub(crate) fn too_many(param: &str, what: &str, got: usize, max: usize) -> ApiError {
    ApiError::refused(Refusal::Limit, param, format!("at most {max} {what} are accepted, got {got}"))
}

/// Checks a JSON schema against the [`schema`] limits before it reaches the grammar converter.
/// `param` names the schema's field in the request.
pub(crate) fn check_schema(param: &str, value: &Value) -> Result<(), ApiError> {
    let bytes = value.to_string().len();
    if bytes > schema::MAX_BYTES {
        return Err(schema_limit(
            param,
            format!("the schema is {bytes} bytes long; at most {} are accepted", schema::MAX_BYTES),
        ));
    }
    let mut walk = SchemaWalk::default();
    walk.visit(value, 1).map_err(|reason| schema_limit(param, reason))
}

fn schema_limit(param: &str, reason: String) -> ApiError {
    ApiError::refused(Refusal::SchemaTooComplex, param, format!("schema too complex: {reason}"))
}

/// Counts what a schema holds while walking it.
#[derive(Default)]
struct SchemaWalk {
    nodes: usize,
    refs: usize,
    alternatives: usize,
}

impl SchemaWalk {
    fn visit(&mut self, value: &Value, depth: usize) -> Result<(), String> {
        use schema::*;
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(format!("more than {MAX_NODES} JSON values"));
        }
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        match value {
            Value::Array(items) => items.iter().try_for_each(|item| self.visit(item, depth + 1)),
            Value::Object(object) => {
                if object.contains_key("$ref") {
                    self.refs += 1;
                    if self.refs > MAX_REFS {
                        return Err(format!("more than {MAX_REFS} '$ref's"));
                    }
                }
                if let Some(Value::Object(properties)) = object.get("properties") {
                    let required: Vec<&str> = object
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|r| r.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let optional = properties.keys().filter(|k| !required.contains(&k.as_str())).count();
                    if optional > MAX_OPTIONAL_PROPERTIES {
                        return Err(format!(
                            "an object has {optional} optional properties; at most {MAX_OPTIONAL_PROPERTIES} are accepted (list the others in 'required')"
                        ));
                    }
                    if properties.len() > MAX_PROPERTIES {
                        return Err(format!(
                            "an object has {} properties; at most {MAX_PROPERTIES} are accepted",
                            properties.len()
                        ));
                    }
                }
                for key in ["enum", "anyOf", "oneOf", "allOf", "prefixItems"] {
                    if let Some(Value::Array(list)) = object.get(key) {
                        if list.len() > MAX_ALTERNATIVES {
                            return Err(format!(
                                "'{key}' has {} entries; at most {MAX_ALTERNATIVES} are accepted",
                                list.len()
                            ));
                        }
                        self.alternatives += list.len();
                        if self.alternatives > MAX_TOTAL_ALTERNATIVES {
                            return Err(format!(
                                "more than {MAX_TOTAL_ALTERNATIVES} enum/anyOf/oneOf/allOf/prefixItems entries in all"
                            ));
                        }
                    }
                }
                for key in ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"] {
                    if let Some(n) = object.get(key).and_then(Value::as_f64) {
                        if n > MAX_REPETITION as f64 {
                            return Err(format!("'{key}' is {n}; at most {MAX_REPETITION} is accepted"));
                        }
                    }
                }
                // Nothing matches a range that ends before it starts, and llama.cpp's grammar
                // parser loops forever (allocating) on the string repetition `{2,1}` the
                // converter writes for `minLength` 2, `maxLength` 1.
                for (low, high) in
                    [("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")]
                {
                    let bound = |key| object.get(key).and_then(Value::as_f64);
                    if let (Some(min), Some(max)) = (bound(low), bound(high)) {
                        if min > max {
                            return Err(format!("'{low}' ({min}) is above '{high}' ({max}): no value matches"));
                        }
                    }
                }
                if let Some(Value::String(pattern)) = object.get("pattern") {
                    check_pattern(pattern)?;
                }
                object.values().try_for_each(|item| self.visit(item, depth + 1))
            }
            _ => Ok(()),
        }
    }
}

/// A `pattern` must be short and repeat nothing more than [`schema::MAX_REPETITION`] times
/// (`{n}`, `{n,}`, `{n,m}`; nested repetitions multiply).
fn check_pattern(pattern: &str) -> Result<(), String> {
    use schema::*;
    if pattern.len() > MAX_PATTERN_BYTES {
        return Err(format!("a 'pattern' is {} bytes long; at most {MAX_PATTERN_BYTES} are accepted", pattern.len()));
    }
    // The product of all counts bounds any nesting of them.
    let mut product: u64 = 1;
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let counts: Vec<u64> =
            after.split('}').next().unwrap_or_default().split(',').filter_map(|n| n.trim().parse().ok()).collect();
        if let Some(&largest) = counts.iter().max() {
            product = product.saturating_mul(largest.max(1));
            if product > MAX_REPETITION {
                return Err(format!("a 'pattern' repeats more than {MAX_REPETITION} times"));
            }
        }
        rest = after;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn optional_properties(n: usize) -> Value {
        let properties: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
        json!({"type": "object", "properties": properties})
    }

    fn ref_chain(n: usize) -> Value {
        let defs: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}))).collect();
        json!({"$ref": "#/$defs/d0", "$defs": defs})
    }

    #[test]
    fn ordinary_schemas_pass() {
        let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 100},
            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]});
        assert!(check_schema("tools[0].function.parameters", &weather).is_ok());
        assert!(check_schema("x", &optional_properties(schema::MAX_OPTIONAL_PROPERTIES)).is_ok());
        assert!(check_schema("x", &json!({"type": "string", "pattern": "^[a-z]{2,8}-[0-9]{4}$"})).is_ok());
    }

    #[test]
    fn each_limit_is_named_in_its_error() {
        let many_enum = json!({"enum": (0..20_000).map(|i| format!("v{i}")).collect::<Vec<_>>()});
        let deep = (0..100).fold(json!({"type": "string"}), |inner, _| json!({"type": "array", "items": inner}));
        let cases = [
            (optional_properties(1_000), "optional properties"),
            (optional_properties(6_000), "bytes long"),
            (ref_chain(3_000), "bytes long"),
            (ref_chain(150), "'$ref'"),
            (many_enum, "bytes long"),
            (json!({"enum": (0..600).collect::<Vec<_>>()}), "'enum' has 600 entries"),
            (deep, "nested deeper"),
            (json!({"type": "string", "maxLength": 1_000_000}), "'maxLength'"),
            (json!({"type": "string", "pattern": "^(a{200}){100}$"}), "repeats more than"),
            // Found by fuzz/fuzz_targets/schema_grammar.rs: llama.cpp's grammar parser hung on it.
            (json!({"type": "string", "minLength": 2, "maxLength": 1}), "'minLength' (2) is above 'maxLength' (1)"),
            (json!({"type": "array", "minItems": 3, "maxItems": 0}), "'minItems' (3) is above 'maxItems' (0)"),
        ];
        for (schema, expected) in cases {
            let error = check_schema("response_format.json_schema.schema", &schema).expect_err(expected);
            assert!(error.to_string().contains(expected), "{expected}: {error}");
            assert_eq!(error.param().as_deref(), Some("response_format.json_schema.schema"));
            assert_eq!(error.code(), Some("schema_too_complex"));
        }
    }

    #[test]
    fn stop_lists_are_bounded() {
        assert!(check_stops(&vec!["a".to_string(); 4]).is_ok());
        assert!(check_stops(&vec!["a".to_string(); 5]).expect_err("five").to_string().contains("at most 4"));
        assert!(check_stops(&["x".repeat(300)]).is_err());
    }
}
