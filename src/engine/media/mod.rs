//! Images and audio in prompts (`--mmproj`, llama.cpp's libmtmd).
//!
//! A media part of a message becomes a marker in the message's text, naming the media by a
//! hash of its bytes ([`MediaInput::marker`]); the chat template renders it like any text, and
//! the rendered prompt is split at the markers ([`split_at_markers`]). Each marker is replaced
//! by the media's tokens as the projector makes them: the model's own text around the media
//! (e.g. `<start_of_image>`) and, for the embeddings themselves, placeholder tokens derived
//! from the hash ([`placeholder_tokens`]). Placeholders are negative, so no vocabulary token
//! and no token a client sends can equal them; the same media at the same place always gives
//! the same ones. The prefix cache, the RAM store, checkpoints and disk files then compare
//! prompts token by token as they always do: a turn that re-sends the same picture continues
//! the cache, a different one diverges at its first placeholder. A media's tokens are
//! evaluated whole ([`MediaSpan`]): a reused prefix that ends inside one is cut back to where
//! it starts.
//!
//! This module is pure; [`projector`] holds the libmtmd side.

use std::sync::Arc;

use llama_cpp_2::token::LlamaToken;
use sha2::{Digest, Sha256};

mod audio;
mod inspect;
pub(crate) mod projector;
mod segments;

pub use audio::{MAX_SAMPLE_RATE, MIN_SAMPLE_RATE};
pub use inspect::check_media;
pub use projector::MediaCacheStatus;
pub(crate) use segments::media_share;

/// Where a media's marker starts in a message's text.
const MARKER_OPEN: &str = "<__media_";
/// Where it ends.
const MARKER_CLOSE: &str = "__>";
/// Hex digits of the hash a marker carries.
const MARKER_HEX: usize = 32;
/// Bytes of a marker in a prompt's text.
pub(crate) const MARKER_LEN: usize = MARKER_OPEN.len() + MARKER_HEX + MARKER_CLOSE.len();

/// Most media parts in one request.
pub const MAX_MEDIA_PARTS: usize = 16;
/// Most bytes of one media part, once decoded from base64 (OpenAI's image limit).
pub const MAX_MEDIA_BYTES: usize = 20 * 1024 * 1024;
/// Most pixels of one image (width × height): its decoded RGB copy is three bytes a pixel.
pub const MAX_IMAGE_PIXELS: u64 = 50_000_000;
/// Longest audio clip, in seconds, as its decoder counts it: the decoder's buffer holds at most
/// this many seconds of samples at the projector's rate (4 bytes each).
pub const MAX_AUDIO_SECONDS: u64 = 600;

/// What a media part holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MediaKind {
    /// A picture (PNG, JPEG, GIF, BMP: what stb_image reads).
    Image,
    /// A sound clip (WAV or MP3, read by miniaudio; see [`check_media`] for what passes).
    Audio,
}

impl MediaKind {
    /// `image` or `audio`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::Audio => "audio",
        }
    }
}

/// A media's identity: the first 16 bytes of SHA-256 over its kind and bytes. Collision
/// resistant: two different pictures never share a cached state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MediaId([u8; 16]);

impl MediaId {
    /// The identity of `bytes` of `kind`.
    #[must_use]
    pub fn of(kind: MediaKind, bytes: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(kind.as_str().as_bytes());
        hasher.update([0]);
        hasher.update(bytes);
        let digest = hasher.finalize();
        let mut id = [0; 16];
        id.copy_from_slice(&digest[..16]);
        Self(id)
    }

    /// Lower-case hex, 32 digits.
    #[must_use]
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != MARKER_HEX || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return None;
        }
        let mut id = [0; 16];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(id))
    }
}

/// One media part of a request: its bytes as sent (after base64), checked only for size here;
/// the engine decodes it.
#[derive(Clone, Debug)]
pub struct MediaInput {
    /// Image or audio.
    pub kind: MediaKind,
    /// The file's bytes.
    pub bytes: Arc<[u8]>,
    /// Its identity.
    pub id: MediaId,
    /// Where the request holds it (`messages[1].content[0]`), for errors.
    pub part: String,
}

impl MediaInput {
    /// A media part of `kind` holding `bytes`, found at `part` of the request.
    #[must_use]
    pub fn new(kind: MediaKind, bytes: Vec<u8>, part: impl Into<String>) -> Self {
        let id = MediaId::of(kind, &bytes);
        Self { kind, bytes: bytes.into(), id, part: part.into() }
    }

    /// The text that stands for this media in a message: the chat template renders it, and
    /// the engine puts the media's tokens where it lands.
    #[must_use]
    pub fn marker(&self) -> String {
        format!("{MARKER_OPEN}{}{MARKER_CLOSE}", self.id.hex())
    }
}

/// What a loaded projector takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MediaSupport {
    /// The projector's file name (none without `--mmproj`).
    pub projector: Option<String>,
    /// It takes images.
    pub image: bool,
    /// It takes audio.
    pub audio: bool,
    /// Why media input is refused although a projector is loaded (the load-time probe found
    /// different inputs giving identical outputs).
    pub refused: Option<String>,
}

impl MediaSupport {
    /// Whether a part of `kind` can be served, or why not.
    ///
    /// # Errors
    /// The reason, worded for the client.
    pub fn check(&self, kind: MediaKind) -> Result<(), String> {
        let Some(projector) = &self.projector else {
            return Err(format!(
                "this server has no backend for {} input; start it with --mmproj and a projector that takes it",
                kind.as_str()
            ));
        };
        if let Some(reason) = &self.refused {
            return Err(format!("media input is refused: {reason}"));
        }
        let takes = match kind {
            MediaKind::Image => self.image,
            MediaKind::Audio => self.audio,
        };
        if takes {
            Ok(())
        } else {
            Err(format!("the loaded projector ({projector}) takes no {} input", kind.as_str()))
        }
    }
}

/// A piece of a rendered prompt: text, or the media a marker names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece<'t> {
    /// Text to tokenize.
    Text(&'t str),
    /// A media's place.
    Media(MediaId),
}

/// `text` split at its media markers (anything that is not a whole marker stays text).
pub(crate) fn split_at_markers(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = text;
    let mut text_start = 0;
    let mut offset = 0;
    while let Some(found) = rest.find(MARKER_OPEN) {
        let at = offset + found;
        let after = &text[at + MARKER_OPEN.len()..];
        let id = after
            .get(..MARKER_HEX)
            .filter(|_| after[MARKER_HEX..].starts_with(MARKER_CLOSE))
            .and_then(MediaId::from_hex);
        match id {
            Some(id) => {
                pieces.push(Piece::Text(&text[text_start..at]));
                pieces.push(Piece::Media(id));
                text_start = at + MARKER_OPEN.len() + MARKER_HEX + MARKER_CLOSE.len();
                offset = text_start;
            }
            None => offset = at + MARKER_OPEN.len(),
        }
        rest = &text[offset..];
    }
    pieces.push(Piece::Text(&text[text_start..]));
    pieces.retain(|piece| !matches!(piece, Piece::Text(t) if t.is_empty()));
    pieces
}

/// The tokens standing for `n` embeddings of the media `id`'s chunk number `chunk`: negative,
/// so never a vocabulary token; the same for the same media, chunk and position.
pub(crate) fn placeholder_tokens(id: MediaId, chunk: usize, n: usize) -> Vec<LlamaToken> {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&id.0);
    key[16..24].copy_from_slice(&(chunk as u64).to_le_bytes());
    (0..n)
        .map(|position| {
            key[24..].copy_from_slice(&(position as u64).to_le_bytes());
            let mixed = xxhash_rust::xxh3::xxh3_64(&key);
            // -2 ..= -(2^30 + 1): never -1 (llama.cpp's "no token").
            LlamaToken(-2 - (mixed & 0x3FFF_FFFF) as i32)
        })
        .collect()
}

/// Whether `token` stands for a media embedding rather than a vocabulary token.
pub(crate) fn is_placeholder(token: LlamaToken) -> bool {
    token.0 < 0
}

/// A media's tokens in a prompt, evaluated whole.
#[derive(Clone)]
pub(crate) struct MediaSpan {
    /// The prompt position of its first token.
    pub(crate) start: usize,
    /// What the projector made of it.
    pub(crate) segment: Arc<projector::Segment>,
}

impl MediaSpan {
    /// The position after its last token.
    pub(crate) fn end(&self) -> usize {
        self.start + self.segment.tokens.len()
    }
}

impl std::fmt::Debug for MediaSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaSpan").field("start", &self.start).field("len", &self.segment.tokens.len()).finish()
    }
}

/// Where a prefix of `keep` tokens must end so no media of `spans` is split: the start of the
/// span `keep` falls inside, else `keep`.
pub(crate) fn whole_media_prefix(spans: &[(usize, usize)], keep: usize) -> usize {
    spans.iter().find(|&&(start, end)| start < keep && keep < end).map_or(keep, |&(start, _)| start)
}

#[cfg(test)]
mod tests;
