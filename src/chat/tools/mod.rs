//! Tool calling that never fails silently.
//!
//! - [`ToolSet`] checks a request's tools (names, schemas the grammar converter accepts) and
//!   validates the arguments of every call before it is returned.
//! - [`ToolFormat`] is a model family's call format, detected from its chat template: its
//!   opener, its grammar envelope ([`request_grammar`]) and its streaming parser
//!   ([`ToolCallParser`]). Models whose templates know no tools get the generic format:
//!   [`prepare_messages`] describes the tools in the system message.
//!
//! Model-free: the engine only sees a grammar and produces text; this module turns the text
//! into calls.

mod format;
mod gbnf;
mod grammar;
mod parser;
mod prompt;
mod toolset;

pub use format::ToolFormat;
pub use grammar::{allow_reasoning, request_grammar};
pub use parser::{ParsedCall, ParsedPiece, ToolCallParser};
pub use prompt::prepare_messages;
pub use toolset::{ArgumentsError, OutputSchema, ReplyError, ToolChoice, ToolDefinition, ToolError, ToolSet};
