//! The model's tokenizer, shared by the inference thread and the handles: llama.cpp's
//! vocabulary is read-only once the model is loaded, so `/tokenize` and friends answer at once
//! instead of waiting for a running generation.

use std::sync::Arc;

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token_type::LlamaTokenAttr;
use llama_cpp_2::vocab::VocabType;
use parking_lot::Mutex;

use super::runs::Splitter;
use super::token_memo::{MemoTokens, SpecialTokens, TokenMemo};
use super::worker::PromptInput;
use super::{Engine, EngineError, Prompt, LARGE_STACK_BYTES};
use crate::chat::tools::ToolDefinition;
use crate::chat::{ChatMessage, TemplateKwargs};

/// Longest stretch a text may hold that one match of the vocabulary's pre-tokenizer could
/// span (see [`Splitter`]). With the reserved stack of the threads that tokenize, llama.cpp's
/// `std::regex` pre-tokenizers were measured to split far longer runs; real text has none
/// this long.
pub(crate) const MAX_PROMPT_RUN: usize = 65_536;

/// Tokenizes and detokenizes with the loaded model's vocabulary.
#[derive(Clone)]
pub(crate) struct Tokenizer {
    model: Arc<LlamaModel>,
    /// The BOS token's text: a template that writes it must not get a second one.
    bos_text: String,
    /// What one match of the vocabulary's pre-tokenizer can span.
    splitter: Splitter,
    /// Recent chat prompts' tokens; `None` for vocabularies whose tokenization cannot be cut.
    memo: Option<Arc<Memo>>,
}

/// The special tokens a text can be cut at, and the recent texts' tokens.
struct Memo {
    specials: SpecialTokens,
    texts: Mutex<TokenMemo<LlamaToken>>,
}

impl Memo {
    /// The memo for `model`'s vocabulary, if its tokenization can be cut at special tokens:
    /// llama.cpp tokenizes the stretches between them apart for these vocabulary types, and
    /// adds nothing at the end (no EOS) that a part would get too.
    fn of(model: &LlamaModel) -> Option<Self> {
        let vocab = model.vocab();
        let cuttable = matches!(vocab.vocab_type(), VocabType::SPM | VocabType::BPE | VocabType::UGM);
        if !cuttable || vocab.should_add_eos() {
            return None;
        }
        // The tokens llama.cpp splits a text at (its special-token cache).
        let split_at = LlamaTokenAttr::Control | LlamaTokenAttr::UserDefined | LlamaTokenAttr::Unknown;
        let specials = vocab.tokens().filter_map(|token| {
            let attrs = vocab.attr(token);
            attrs.intersects(split_at).then(|| {
                let text = vocab.text(token).map(|t| t.to_bytes().to_vec()).unwrap_or_default();
                (text, attrs.contains(LlamaTokenAttr::LStrip))
            })
        });
        match SpecialTokens::new(specials) {
            Ok(specials) => Some(Self { specials, texts: Mutex::new(TokenMemo::default()) }),
            Err(e) => {
                tracing::warn!("chat prompts are tokenized whole: {e}");
                None
            }
        }
    }
}

impl Tokenizer {
    /// The tokenizer of `model`.
    pub(crate) fn new(model: Arc<LlamaModel>) -> Self {
        let bos = model.vocab().bos();
        let bos_text = String::from_utf8_lossy(&model.vocab().token_to_piece(bos, true, None)).into_owned();
        let splitter = Splitter::of(&model.meta_val_str("tokenizer.ggml.pre").unwrap_or_default());
        let memo = Memo::of(&model).map(Arc::new);
        Self { model, bos_text, splitter, memo }
    }

    /// The model.
    pub(crate) fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// The BOS token's text.
    pub(crate) fn bos_text(&self) -> &str {
        &self.bos_text
    }

    /// A prompt's tokens as generation evaluates them: text with the model's BOS rule (none
    /// when the text already starts with it) and special tokens parsed; token ids checked
    /// against the vocabulary. Call it on a thread with [`LARGE_STACK_BYTES`] of stack.
    ///
    /// # Errors
    /// [`EngineError::PromptRunTooLong`], [`EngineError::InvalidToken`] or
    /// [`EngineError::EmptyPrompt`].
    pub(crate) fn prompt_tokens(&self, prompt: PromptInput) -> Result<Vec<LlamaToken>, EngineError> {
        let tokens = match prompt {
            PromptInput::Text(text) => self.tokenize(&text, self.adds_bos(&text), true)?,
            PromptInput::Tokens(ids) => self.check_ids(&ids)?,
            PromptInput::Tokenized { tokens, .. } => tokens,
        };
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        Ok(tokens)
    }

    /// `text`'s tokens; `add_special` adds the BOS (and EOS) the model asks for,
    /// `parse_special` reads special tokens written as text. Call it on a thread with
    /// [`LARGE_STACK_BYTES`] of stack.
    ///
    /// # Errors
    /// [`EngineError::PromptRunTooLong`] for text with a run too long to tokenize safely.
    pub(crate) fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<LlamaToken>, EngineError> {
        let run = self.splitter.longest_run(text);
        if run > MAX_PROMPT_RUN {
            return Err(EngineError::PromptRunTooLong { run, max: MAX_PROMPT_RUN });
        }
        Ok(self.model.vocab().tokenize(text.as_bytes(), add_special, parse_special))
    }

    /// A chat prompt's tokens as [`Tokenizer::prompt_tokens`] gives them for its text,
    /// keeping those of the beginning it shares with a recent prompt (see
    /// [`super::token_memo`]); whole where the vocabulary cannot be cut safely. Call it on a
    /// thread with [`LARGE_STACK_BYTES`] of stack.
    ///
    /// # Errors
    /// As [`Tokenizer::prompt_tokens`].
    pub(crate) fn chat_tokens(&self, text: &str) -> Result<MemoTokens<LlamaToken>, EngineError> {
        let bos = self.adds_bos(text);
        let memo = match &self.memo {
            Some(memo) => {
                let cuts = memo.specials.cuts(text.as_bytes());
                memo.texts.lock().tokenize(text, bos, &cuts, |part, bos| self.tokenize(part, bos, true))?
            }
            None => {
                let tokens = self.tokenize(text, bos, true)?;
                MemoTokens { tokens, kept: 0, tokenized_bytes: text.len() }
            }
        };
        if memo.tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        Ok(memo)
    }

    /// Whether the model's BOS goes before `text`: the model asks for one and the text does
    /// not start with it.
    pub(crate) fn adds_bos(&self, text: &str) -> bool {
        self.model.vocab().should_add_bos() && (self.bos_text.is_empty() || !text.starts_with(&self.bos_text))
    }

    /// `ids` as tokens, each checked against the vocabulary.
    ///
    /// # Errors
    /// [`EngineError::InvalidToken`] for the first id outside it.
    pub(crate) fn check_ids(&self, ids: &[i32]) -> Result<Vec<LlamaToken>, EngineError> {
        let n_vocab = self.model.n_vocab();
        match ids.iter().find(|&&t| t < 0 || t >= n_vocab) {
            Some(&token) => Err(EngineError::InvalidToken { token, n_vocab }),
            None => Ok(ids.iter().map(|&t| LlamaToken(t)).collect()),
        }
    }

    /// A token's bytes, special tokens written out.
    pub(crate) fn piece(&self, token: LlamaToken) -> Vec<u8> {
        self.model.vocab().token_to_piece(token, true, None)
    }
}

/// Tokenizing and rendering on the caller's side.
impl Engine {
    /// Tokenizes a prompt exactly as a generation would (template, BOS handling), without
    /// waiting for a running generation; blocks the current thread (not for use inside an async
    /// runtime). A chat prompt is tokenized as the API's requests are: the tokens of the
    /// beginning it shares with a recent chat prompt are kept, the rest tokenized.
    ///
    /// # Errors
    /// Not loaded, template rejection, an empty prompt, a run of text too long, a token id
    /// outside the vocabulary.
    pub fn tokenize_blocking(&self, prompt: &Prompt) -> Result<Vec<i32>, EngineError> {
        let loaded = self.loaded()?;
        let chat = matches!(prompt, Prompt::Chat { .. });
        let (prompt, _) = loaded.render(prompt)?;
        let tokenizer = loaded.tokenizer.clone();
        let tokens = on_large_stack_blocking(move || match prompt {
            PromptInput::Text(text) if chat => tokenizer.chat_tokens(&text).map(|memo| memo.tokens),
            other => tokenizer.prompt_tokens(other),
        })?;
        Ok(tokens.into_iter().map(|t| t.0).collect())
    }

    /// `text`'s token ids, as llama-server's `/tokenize` gives them: `add_special` adds the BOS
    /// (and EOS) the model asks for, `parse_special` reads special tokens written as text.
    /// Never waits for a running generation.
    ///
    /// # Errors
    /// Not loaded, or a run of text too long to tokenize safely.
    pub async fn tokenize(
        &self,
        text: String,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let tokenizer = self.loaded()?.tokenizer.clone();
        let tokens = on_large_stack(move || tokenizer.tokenize(&text, add_special, parse_special)).await?;
        Ok(tokens.into_iter().map(|t| t.0).collect())
    }

    /// [`Engine::tokenize`] on the calling thread, which must have [`LARGE_STACK_BYTES`] of
    /// stack (the API's conversion threads do).
    ///
    /// # Errors
    /// As [`Engine::tokenize`].
    pub(crate) fn tokenize_here(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<i32>, EngineError> {
        let tokens = self.loaded()?.tokenizer.tokenize(text, add_special, parse_special)?;
        Ok(tokens.into_iter().map(|t| t.0).collect())
    }

    /// Each token's bytes, special tokens written out; their concatenation is the text of
    /// `tokens`.
    ///
    /// # Errors
    /// Not loaded, or an id outside the vocabulary.
    pub fn token_pieces(&self, tokens: &[i32]) -> Result<Vec<Vec<u8>>, EngineError> {
        let loaded = self.loaded()?;
        let tokens = loaded.tokenizer.check_ids(tokens)?;
        Ok(tokens.into_iter().map(|t| loaded.tokenizer.piece(t)).collect())
    }

    /// The text the engine evaluates for a chat: the conversation rendered through the
    /// model's template, tools written in as the format needs.
    ///
    /// # Errors
    /// Not loaded, or the template rejected the messages.
    pub fn chat_prompt_text(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolDefinition],
        kwargs: &TemplateKwargs,
    ) -> Result<String, EngineError> {
        Ok(self.loaded()?.chat.render_with(messages, tools, kwargs)?.text)
    }
}

/// Runs `work` on a thread of its own with [`LARGE_STACK_BYTES`] of stack (tokenizing can
/// recurse deeply) and returns its result.
///
/// # Errors
/// [`EngineError::Internal`] if no thread can be started.
async fn on_large_stack<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    let (answer, result) = tokio::sync::oneshot::channel();
    spawn_large(move || {
        let _ = answer.send(work());
    })?;
    result.await.map_err(|_| EngineError::Internal("a tokenizing thread failed".into()))?
}

/// [`on_large_stack`] for callers outside an async runtime: blocks until `work` is done.
///
/// # Errors
/// As [`on_large_stack`].
fn on_large_stack_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, EngineError> + Send + 'static,
) -> Result<T, EngineError> {
    let (answer, result) = std::sync::mpsc::channel();
    spawn_large(move || {
        let _ = answer.send(work());
    })?;
    result.recv().map_err(|_| EngineError::Internal("a tokenizing thread failed".into()))?
}

fn spawn_large(work: impl FnOnce() + Send + 'static) -> Result<(), EngineError> {
    std::thread::Builder::new()
        .name("firstword-tokenize".into())
        .stack_size(LARGE_STACK_BYTES)
        .spawn(work)
        .map(drop)
        .map_err(|e| EngineError::Internal(format!("cannot start a thread: {e}")))
}
