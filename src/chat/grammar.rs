//! The grammar type that constrains generation: what tool calls and `response_format` produce
//! and the engine enforces token by token.

/// A GBNF grammar constraining generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grammar {
    /// The grammar text (llama.cpp GBNF).
    pub gbnf: String,
    /// The rule the output must match.
    pub root: String,
    /// Lazy grammars: the texts that switch the grammar on. Until one appears, generation is
    /// free; from it on, the output must match `root`, which must itself begin with that text.
    /// Empty (and no `anchored_triggers`): the grammar applies from the first token.
    pub triggers: Vec<String>,
    /// Lazy grammars: texts that switch the grammar on only where they open the output, after
    /// optional whitespace (the whitespace is not fed to the grammar). Once other text was
    /// output they can no longer fire.
    pub anchored_triggers: Vec<String>,
}

impl Grammar {
    /// Whether the whole output must match the grammar from its first token (no triggers): a
    /// required call, a JSON reply.
    #[must_use]
    pub fn is_eager(&self) -> bool {
        self.triggers.is_empty() && self.anchored_triggers.is_empty()
    }

    /// The shortest text the grammar accepts (see [`crate::chat::tools::shortest_text`]).
    #[must_use]
    pub fn shortest_text(&self) -> Option<String> {
        crate::chat::tools::shortest_text(&self.gbnf, &self.root)
    }
}
