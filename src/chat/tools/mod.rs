//! Tool calling that never fails silently.
//!
//! - [`ToolSet`] checks a request's tools (names, schemas the grammar converter accepts) and
//!   validates the arguments of every call before it is returned.
//! - [`ToolFormat`] is a model's call syntax, read off what its chat template writes for a
//!   call: one description gives the grammar ([`request_grammar`]), the streaming parser
//!   ([`ToolCallParser`]) and the text of earlier calls. Models whose templates know no tools
//!   get the generic format: [`prepare_messages`] describes the tools in the system message.
//!
//! Model-free: the engine only sees a grammar and produces text; this module turns the text
//! into calls.

mod detect;
mod format;
mod gbnf;
mod grammar;
mod memory;
mod parser;
mod prompt;
mod shortest;
mod syntax;
mod toolset;
mod write;

pub use format::{Family, ToolFormat};
pub use grammar::{allow_reasoning, request_grammar};
pub use memory::CallMemory;
pub use parser::{ParsedCall, ParsedPiece, ToolCallParser};
pub use prompt::prepare_messages;
pub use shortest::shortest_text;
pub(crate) use syntax::token_pieces;
pub use toolset::{ArgumentsError, OutputSchema, ReplyError, ToolChoice, ToolDefinition, ToolError, ToolSet};
