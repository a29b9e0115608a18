//! A tool-call syntax as data: the markers around the calls and around each call, and how a
//! call's name and arguments are written between them. One description gives the grammar, the
//! streaming parser and the markers the engine must show; [`super::detect`] reads it off what a
//! chat template writes.

/// Stands for a call's position (0, 1, …) in markers that number the calls (Kimi K2's
/// `functions.NAME:0`).
pub(crate) const CALL_INDEX: &str = "{index}";
/// Stands for a call's number (1, 2, …) in markers that count the calls from one (Kimi K3's
/// `index="1"`).
pub(crate) const CALL_NUMBER: &str = "{number}";
/// Stands for the argument's name in markers that repeat it (MiniMax-M3's `</KEY>`).
pub(crate) const ARGUMENT_KEY: &str = "{key}";
/// Stands for the call's name in a parameter call's markers that repeat it (Muse Glimmer's
/// `to=NAME<|message|>…<atem:invoke name="NAME">`).
pub(crate) const CALL_NAME: &str = "{name}";
/// Stands for a call's id in markers that carry it (Solar's `<|tool_call:begin|>ID`).
pub(crate) const CALL_ID: &str = "{id}";

/// Where calls sit in a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Calls between markers: `open`, then each call as `call_open` CALL `call_close`, calls
    /// separated by `separator`, then `close`. Any of them may be empty.
    Markers(Markers),
    /// One bare JSON object `{"name": …, "parameters": …}` opening the reply, or the same after
    /// `<|python_tag|>` (Llama 3.x).
    BareJson,
}

/// The literal texts around calls, exactly as the template writes them (whitespace included).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Markers {
    /// Before the first call (`[TOOL_CALLS][`, `<｜tool▁calls▁begin｜>`).
    pub open: String,
    /// Before each call (`<tool_call>\n`).
    pub call_open: String,
    /// After each call (`\n</tool_call>`).
    pub call_close: String,
    /// Between two calls (`\n`, `, `).
    pub separator: String,
    /// After the last call (`]`, `<｜tool▁calls▁end｜>`).
    pub close: String,
}

impl Markers {
    /// What starts a section of calls (its open and the first call's open, up to a call id),
    /// whitespace around it left out: a call begins there wherever it appears in free text.
    pub(crate) fn opener(&self) -> String {
        let head = format!("{}{}", self.open, self.call_open);
        head.trim().split(CALL_ID).next().unwrap_or_default().trim_end().to_string()
    }

    /// Every literal piece of the markers (split at whitespace and placeholders).
    pub(crate) fn pieces(&self) -> Vec<String> {
        [&self.open, &self.call_open, &self.call_close, &self.separator, &self.close]
            .into_iter()
            .flat_map(|m| literal_pieces(m))
            .collect()
    }
}

/// How one call is written between its markers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// A JSON object holding the name and the arguments:
    /// `{"name": "get_weather", "arguments": {…}}` (`name_key` and `args_key` as the template
    /// names them).
    Json {
        /// `name`, `tool_name`.
        name_key: String,
        /// `arguments`, `parameters`.
        args_key: String,
    },
    /// The name, then `name_close`, then the arguments as a JSON object:
    /// `get_weather<｜tool▁sep｜>{…}`, `get_weather[ARGS]{…}`.
    NamedJson {
        /// Between the name and the arguments (may hold [`CALL_INDEX`]).
        name_close: String,
    },
    /// The name, then `name_close`, then each argument as `key_open` KEY `key_close` VALUE
    /// `value_close`: string values as raw text, others as JSON (Qwen3-Coder's
    /// `<parameter=city>\nParis\n</parameter>`, GLM's `<arg_key>city</arg_key><arg_value>…`).
    Params(Params),
    /// Gemma's `call:name{key:value,…}` with strings between `quote` markers.
    Gemma {
        /// The string delimiter.
        quote: &'static str,
    },
    /// Python call syntax: `name(key="text", n=1)`, calls in a list `[a(…), b(…)]` (LFM2).
    Pythonic,
}

/// The markers of [`Body::Params`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Params {
    /// Between the name and the first argument (or the call's close); may hold [`CALL_NAME`].
    pub name_close: String,
    /// Before an argument's name.
    pub key_open: String,
    /// After the name of an argument whose value is a string.
    pub key_close: String,
    /// After the name of an argument whose value is not a string (DeepSeek's DSML writes
    /// `string="false"` there).
    pub key_close_json: String,
    /// After a value (may hold [`ARGUMENT_KEY`]).
    pub value_close: String,
}

impl Params {
    /// Every literal piece of the markers.
    pub(crate) fn pieces(&self) -> Vec<String> {
        [&self.name_close, &self.key_open, &self.key_close, &self.key_close_json, &self.value_close]
            .into_iter()
            .flat_map(|m| literal_pieces(m))
            .collect()
    }
}

/// The pieces of `marker` between whitespace and placeholders: the texts that may be special
/// tokens.
pub(crate) fn literal_pieces(marker: &str) -> Vec<String> {
    marker
        .replace(CALL_INDEX, " ")
        .replace(CALL_NUMBER, " ")
        .replace(ARGUMENT_KEY, " ")
        .replace(CALL_ID, " ")
        .replace(CALL_NAME, " ")
        .split_whitespace()
        .flat_map(|piece| {
            let mut pieces = vec![piece.to_string()];
            pieces.extend(token_pieces(piece).into_iter().filter(|p| *p != piece).map(String::from));
            pieces
        })
        .collect()
}

/// The `<|…|>` special-token texts inside `text` (Harmony's `<|channel|>commentary` holds
/// `<|channel|>`), each of which a vocabulary may hold as one token.
pub(crate) fn token_pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<|") {
        let Some(end) = rest[start..].find("|>") else { break };
        pieces.push(&rest[start..start + end + 2]);
        rest = &rest[start + end + 2..];
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opener_is_the_head_of_the_section_up_to_a_call_id() {
        let hermes = Markers { call_open: "<tool_call>\n".into(), ..Markers::default() };
        assert_eq!(hermes.opener(), "<tool_call>");
        let qwen = Markers { call_open: "<tool_call>\n<function=".into(), ..Markers::default() };
        assert_eq!(qwen.opener(), "<tool_call>\n<function=");
        let solar = Markers {
            open: "<|tool_calls|>".into(),
            call_open: "<|tool_call:begin|>{id}<|tool_call:name|>".into(),
            ..Markers::default()
        };
        assert_eq!(solar.opener(), "<|tool_calls|><|tool_call:begin|>");
        let mistral =
            Markers { open: "[TOOL_CALLS][".into(), separator: ", ".into(), close: "]".into(), ..Markers::default() };
        assert_eq!(mistral.opener(), "[TOOL_CALLS][");
        let minimax =
            Markers { open: "<minimax:tool_call>\n".into(), call_open: "<invoke name=\"".into(), ..Markers::default() };
        assert_eq!(minimax.opener(), "<minimax:tool_call>\n<invoke name=\"");
    }

    #[test]
    fn pieces_leave_out_whitespace_and_placeholders() {
        assert_eq!(literal_pieces(":{index}<|tool_call_argument_begin|>"), [":", "<|tool_call_argument_begin|>"]);
        assert_eq!(literal_pieces("\n</parameter>\n"), ["</parameter>"]);
        assert_eq!(literal_pieces("<|channel|>commentary to="), ["<|channel|>commentary", "<|channel|>", "to="]);
    }
}
