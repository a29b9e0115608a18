//! Prompts with media: their tokens (the text between markers tokenized, each media's tokens
//! from the projector), a reused prefix that never ends inside a media, and the load-time
//! probe that refuses a projector mapping different inputs to one output.

use std::sync::Arc;

use llama_cpp_2::token::LlamaToken;

use super::{PromptInput, Session};
use crate::engine::decoder::BatchKind;
use crate::engine::media::{
    is_placeholder, split_at_markers, whole_media_prefix, MediaInput, MediaKind, MediaSpan, Piece, MARKER_LEN,
};
use crate::engine::prefix::common_prefix_len;
use crate::engine::sequence::Reuse;
use crate::engine::{EngineError, PreparedMedia};

/// Largest difference between the first-token logits of two different probe inputs that still
/// counts as "the same output": far below what any working projector makes of a different
/// picture, above the rounding of a different thread split.
const PROBE_SAME_OUTPUT: f32 = 1e-3;

impl Session<'_> {
    /// `prompt`'s tokens and where its media lie. Without media (or markers) the tokenizer's;
    /// with them, the text between markers tokenized (the model's BOS first, where it takes
    /// one) and each marker replaced by its media's tokens.
    ///
    /// # Errors
    /// Tokenization errors; [`EngineError::Media`] for a marker naming media the request does
    /// not hold, a part the projector refuses, or a prompt that ends with a media.
    pub(super) fn prompt_tokens(
        &mut self,
        prompt: PromptInput,
        media: &[MediaInput],
    ) -> Result<(Vec<LlamaToken>, Vec<MediaSpan>), EngineError> {
        self.prompt_tokens_brought(prompt, media, &PreparedMedia::default())
    }

    /// [`Self::prompt_tokens`] for a job that is not the one the projector holds (one taking
    /// a lane): its media from `brought`, what the job prepared.
    ///
    /// # Errors
    /// As [`Self::prompt_tokens`].
    pub(super) fn prompt_tokens_brought(
        &mut self,
        prompt: PromptInput,
        media: &[MediaInput],
        brought: &PreparedMedia,
    ) -> Result<(Vec<LlamaToken>, Vec<MediaSpan>), EngineError> {
        let pieces = match prompt.text() {
            Some(text) if !media.is_empty() => split_at_markers(text),
            _ => return Ok((self.tokenizer.prompt_tokens(prompt)?, Vec::new())),
        };
        if !pieces.iter().any(|piece| matches!(piece, Piece::Media(_))) {
            return Ok((self.tokenizer.prompt_tokens(prompt)?, Vec::new()));
        }
        let refuse = |part: &str, reason: &str| EngineError::Media { part: part.into(), reason: reason.into() };
        let projector = self.projector.as_mut().ok_or_else(|| refuse(&media[0].part, "no projector is loaded"))?;
        let text = prompt.text().unwrap_or_default();
        let mut tokens = Vec::new();
        if self.tokenizer.adds_bos(text) {
            tokens.push(self.model.vocab().bos());
        }
        let mut spans = Vec::new();
        let mut last_part = "messages";
        for piece in pieces {
            match piece {
                Piece::Text(part) => tokens.extend(self.tokenizer.tokenize(part, false, true)?),
                Piece::Media(id) => {
                    let input = media
                        .iter()
                        .find(|input| input.id == id)
                        .ok_or_else(|| refuse("messages", "the text names a media part the request does not hold"))?;
                    let segment = projector.segment(input, brought)?;
                    last_part = &input.part;
                    spans.push(MediaSpan { start: tokens.len(), segment: Arc::clone(&segment) });
                    tokens.extend_from_slice(&segment.tokens);
                }
            }
        }
        if spans.last().is_some_and(|span| span.end() == tokens.len()) {
            return Err(refuse(last_part, "the prompt ends with this media; text must follow it"));
        }
        Ok((tokens, spans))
    }

    /// The bytes of the prompt's text each of `tokens` stands for: its piece; a media's first
    /// token its marker, the media's other tokens nothing.
    pub(super) fn text_lengths<'a>(
        &'a self,
        tokens: &'a [LlamaToken],
        media: &'a [MediaSpan],
    ) -> impl Iterator<Item = usize> + 'a {
        let vocab = self.model.vocab();
        tokens.iter().enumerate().map(move |(i, &token)| match media.iter().find(|s| s.start <= i && i < s.end()) {
            Some(span) if span.start == i => MARKER_LEN,
            Some(_) => 0,
            None => vocab.token_to_piece(token, true, None).len(),
        })
    }

    /// Whether `tokens` part from the live sequence where both hold a media (another picture
    /// or clip than the one the cache holds).
    pub(super) fn media_changed(&self, tokens: &[LlamaToken]) -> bool {
        let live = self.sequence.tokens();
        let at = common_prefix_len(live, tokens);
        live.get(at).is_some_and(|&t| is_placeholder(t)) && tokens.get(at).is_some_and(|&t| is_placeholder(t))
    }

    /// Cuts a reused prefix that ends inside one of the prompt's media back to where the
    /// media starts: a media is evaluated whole.
    pub(super) fn keep_media_whole(&mut self, reuse: &mut Reuse, media: &[MediaSpan]) {
        let bounds: Vec<(usize, usize)> = media.iter().map(|span| (span.start, span.end())).collect();
        let whole = whole_media_prefix(&bounds, reuse.keep);
        if whole == reuse.keep {
            return;
        }
        tracing::debug!(keep = reuse.keep, whole, "a reused prefix ended inside a media");
        if self.sequence.cut(whole) {
            reuse.keep = whole;
        } else {
            self.sequence.clear();
            reuse.keep = 0;
        }
    }

    /// Probes the projector, if one is loaded: two clearly different inputs of each kind it
    /// takes must give different first-token logits. Where they do not (a broken projector,
    /// or one made for another model), media input is refused with the reason, instead of
    /// answering every picture with the same fluent text.
    pub(super) fn probe_projector(&mut self) {
        let Some(name) = self.projector.as_ref().and_then(|p| p.support().projector.clone()) else { return };
        for kind in [MediaKind::Image, MediaKind::Audio] {
            let takes = self.projector.as_ref().is_some_and(|p| p.support().check(kind).is_ok());
            if !takes {
                continue;
            }
            let started = std::time::Instant::now();
            let outcome = self.probe_logits(kind, 1).and_then(|a| Ok((a, self.probe_logits(kind, 2)?)));
            self.sequence.clear();
            let reason = match outcome {
                Ok((a, b)) => {
                    let difference = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                    tracing::info!(
                        kind = kind.as_str(),
                        difference,
                        ms = started.elapsed().as_millis() as u64,
                        "projector probed with two different inputs"
                    );
                    (difference <= PROBE_SAME_OUTPUT).then(|| {
                        format!(
                            "the projector {name} gave the same output for two different {}s at load (a broken \
                             projector, or one made for another model)",
                            kind.as_str()
                        )
                    })
                }
                Err(e) => Some(format!("the projector {name} failed its load-time probe: {e}")),
            };
            if let Some(reason) = reason {
                tracing::error!("media input refused: {reason}");
                if let Some(projector) = self.projector.as_mut() {
                    projector.refuse(reason);
                }
                return;
            }
        }
    }

    /// The first-token logits after a synthetic input of `kind` (made from `seed`) and a line
    /// break, evaluated from an empty cache.
    fn probe_logits(&mut self, kind: MediaKind, seed: u32) -> Result<Vec<f32>, EngineError> {
        let projector = self.projector.as_mut().ok_or_else(|| EngineError::Internal("no projector".into()))?;
        let segment = projector.synthetic(kind, seed)?;
        self.sequence.clear();
        let vocab = self.model.vocab();
        if vocab.should_add_bos() {
            self.sequence.decode(&[vocab.bos()], BatchKind::Prompt)?;
        }
        self.sequence.decode_media(projector, &segment)?;
        let tail = self.tokenizer.tokenize("\n", false, true)?;
        let index = self.sequence.decode(&tail, BatchKind::PromptEnd)?;
        Ok(self.sequence.target().get_logits_ith(index).to_vec())
    }
}
