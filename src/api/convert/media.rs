//! Media parts of a request (images, audio clips) into the engine's media inputs, each
//! replaced in its message's text by the marker that stands for it. Checked here, before
//! anything is queued: the projector takes the kind, the count, the bytes, and what the
//! headers say (an image's pixels, a clip's seconds). URLs are never fetched: a prompt must
//! not make the server read the network.

use base64::Engine as _;
use serde_json::Value;

use crate::api::error::{ApiError, Refusal};
use crate::engine::media::{check_media, MediaInput, MediaKind, MediaSupport, MAX_MEDIA_BYTES, MAX_MEDIA_PARTS};

/// The media parts of one request, in the order they appear.
pub(crate) struct MediaParts<'s> {
    support: &'s MediaSupport,
    inputs: Vec<MediaInput>,
    /// Parts seen (a picture sent twice counts twice: each costs its tokens).
    parts: usize,
    /// Seconds of audio in them.
    audio_seconds: f64,
}

impl<'s> MediaParts<'s> {
    /// None yet, for a server whose projector takes `support`.
    pub(crate) fn new(support: &'s MediaSupport) -> Self {
        Self { support, inputs: Vec::new(), parts: 0, audio_seconds: 0.0 }
    }

    /// The media's marker for a content part of type `kind` (`image_url`, `input_image`,
    /// `input_audio`), whose fields are in `part`; `None` for parts that are not media.
    ///
    /// # Errors
    /// A 400 naming the part: a kind the server cannot take, a malformed or oversized part.
    pub(crate) fn marker(&mut self, kind: &str, part: &Value, param: &str) -> Result<Option<String>, ApiError> {
        let kind = match kind {
            "image_url" | "input_image" | "image" => MediaKind::Image,
            "input_audio" | "audio" => MediaKind::Audio,
            _ => return Ok(None),
        };
        self.admit(kind, param, &format!("{param}.type"))?;
        let (bytes, format) = match kind {
            MediaKind::Image => (image_bytes(part, param)?, None),
            MediaKind::Audio => audio_bytes(part, param)?,
        };
        self.add(kind, bytes, format.as_deref(), param).map(Some)
    }

    /// The marker of a clip sent as a file (`/v1/audio/transcriptions`): `format` is `wav` or
    /// `mp3` (`None`: as its bytes look).
    ///
    /// # Errors
    /// As [`MediaParts::marker`].
    pub(crate) fn audio_file(&mut self, bytes: Vec<u8>, format: Option<&str>, param: &str) -> Result<String, ApiError> {
        self.admit(MediaKind::Audio, param, param)?;
        self.add(MediaKind::Audio, bytes, format, param)
    }

    /// Counts one more part of `kind`: refused where the projector does not take it (naming
    /// `type_param`) or past the most parts a request may hold.
    fn admit(&mut self, kind: MediaKind, param: &str, type_param: &str) -> Result<(), ApiError> {
        self.support
            .check(kind)
            .map_err(|reason| ApiError::refused(Refusal::UnsupportedContent, type_param, reason))?;
        self.parts += 1;
        if self.parts > MAX_MEDIA_PARTS {
            return Err(ApiError::refused(
                Refusal::Limit,
                param,
                format!("a request may hold at most {MAX_MEDIA_PARTS} image and audio parts"),
            ));
        }
        Ok(())
    }

    /// Checks `bytes` on their headers and keeps them (once per identity); returns their marker.
    fn add(&mut self, kind: MediaKind, bytes: Vec<u8>, format: Option<&str>, param: &str) -> Result<String, ApiError> {
        if bytes.len() > MAX_MEDIA_BYTES {
            return Err(ApiError::refused(
                Refusal::Limit,
                param,
                format!("a media part may hold at most {} MiB", MAX_MEDIA_BYTES >> 20),
            ));
        }
        let seconds = check_media(kind, &bytes, format).map_err(|reason| ApiError::invalid(param, reason))?;
        self.audio_seconds += seconds.unwrap_or(0.0);
        let input = MediaInput::new(kind, bytes, param);
        let marker = input.marker();
        if !self.inputs.iter().any(|held| held.id == input.id) {
            self.inputs.push(input);
        }
        Ok(marker)
    }

    /// Seconds of audio the parts hold.
    pub(crate) fn audio_seconds(&self) -> f64 {
        self.audio_seconds
    }

    /// The parts collected.
    pub(crate) fn into_inputs(self) -> Vec<MediaInput> {
        self.inputs
    }
}

/// An image part's bytes: `image_url` as `{"url": "data:…"}` (chat completions) or as the URL
/// itself (the Responses API, and some chat clients).
fn image_bytes(part: &Value, param: &str) -> Result<Vec<u8>, ApiError> {
    let url = match part.get("image_url") {
        Some(Value::String(url)) => url.as_str(),
        Some(Value::Object(object)) => object
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("{param}.image_url.url"), "an image part needs a 'url'"))?,
        _ => {
            let why = if part.get("file_id").is_some() { "file ids are not supported; " } else { "" };
            return Err(ApiError::invalid(
                format!("{param}.image_url"),
                format!("{why}an image part needs an 'image_url' holding a data URL (data:image/png;base64,…)"),
            ));
        }
    };
    let Some(data) = url.strip_prefix("data:") else {
        let reason = if url.starts_with("http://") || url.starts_with("https://") {
            "this server does not fetch URLs (a prompt must not make it read the network); send the image as a data \
             URL (data:image/png;base64,…)"
        } else {
            "the image must be a data URL (data:image/png;base64,…)"
        };
        return Err(ApiError::invalid(format!("{param}.image_url"), reason));
    };
    let (header, payload) = data
        .split_once(',')
        .ok_or_else(|| ApiError::invalid(format!("{param}.image_url"), "a data URL needs a ',' before its data"))?;
    if !header.ends_with(";base64") {
        return Err(ApiError::invalid(format!("{param}.image_url"), "the data URL must be base64 (data:…;base64,…)"));
    }
    decode_base64(payload, &format!("{param}.image_url"))
}

/// An audio part's bytes and format: `input_audio` as `{"data": base64, "format": "wav"|"mp3"}`.
fn audio_bytes(part: &Value, param: &str) -> Result<(Vec<u8>, Option<String>), ApiError> {
    let field = format!("{param}.input_audio");
    let audio = part
        .get("input_audio")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::invalid(&field, "an audio part needs 'input_audio': {\"data\": …, \"format\": …}"))?;
    let data = audio
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{field}.data"), "the clip's base64 'data' is missing"))?;
    let format = match audio.get("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(format)) if matches!(format.as_str(), "wav" | "mp3") => Some(format.clone()),
        Some(other) => {
            return Err(ApiError::invalid(
                format!("{field}.format"),
                format!("format {other} is not \"wav\" or \"mp3\""),
            ))
        }
    };
    Ok((decode_base64(data, &format!("{field}.data"))?, format))
}

/// Standard base64 (line breaks allowed), refused unread above [`MAX_MEDIA_BYTES`].
fn decode_base64(payload: &str, param: &str) -> Result<Vec<u8>, ApiError> {
    if payload.len() / 4 * 3 > MAX_MEDIA_BYTES + 3 {
        return Err(ApiError::refused(
            Refusal::Limit,
            param,
            format!("a media part may hold at most {} MiB", MAX_MEDIA_BYTES >> 20),
        ));
    }
    let compact: String = payload.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| ApiError::invalid(param, format!("not valid base64: {e}")))?;
    if bytes.is_empty() {
        return Err(ApiError::invalid(param, "the media part is empty"));
    }
    Ok(bytes)
}
