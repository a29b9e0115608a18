//! What a media part's bytes are and what decoding them would cost, read before anything
//! decodes them. libmtmd decides how to decode a buffer by its first bytes alone, whatever the
//! part says it is: a WAV, MP3 or FLAC signature goes to miniaudio, anything else to
//! stb_image. So the same signatures are read here, a part whose bytes are not what it says
//! is refused, and the limits are checked on what those decoders will allocate: a small file
//! can decode into a huge one (a PNG declaring 30,000 × 30,000 pixels, a WAV at 1 Hz, an MP3
//! whose Xing tag claims millions of frames).

use super::audio::{is_flac, le, mp3_bound, wav_bound, AudioBound};
use super::{MediaKind, MAX_AUDIO_SECONDS, MAX_IMAGE_PIXELS};

/// What libmtmd will take a buffer for, judged as it judges: by its signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sniffed {
    /// RIFF/WAVE (miniaudio's WAV decoder).
    Wav,
    /// An ID3 tag or an MPEG frame sync (miniaudio's MP3 decoder).
    Mp3,
    /// `fLaC`, also after ID3 tags (miniaudio's FLAC decoder; refused).
    Flac,
    /// A picture stb_image reads: `png`, `jpeg`, `gif`, `bmp`.
    Image(&'static str),
    /// Neither.
    Unknown,
}

/// What `bytes` are to libmtmd.
pub(crate) fn sniff(bytes: &[u8]) -> Sniffed {
    // libmtmd's test: at least 12 bytes, then RIFF....WAVE, ID3, an MPEG sync or fLaC.
    if bytes.len() >= 12 {
        if bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WAVE" {
            return Sniffed::Wav;
        }
        if bytes.starts_with(b"fLaC") {
            return Sniffed::Flac;
        }
        if bytes.starts_with(b"ID3") || (bytes[0] == 0xFF && bytes[1] & 0xE0 == 0xE0) {
            // miniaudio tries its FLAC decoder before its MP3 one, and it skips ID3 tags.
            return if is_flac(bytes) { Sniffed::Flac } else { Sniffed::Mp3 };
        }
    }
    // stb_image's signatures.
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Sniffed::Image("png")
    } else if bytes.starts_with(&[0xFF, 0xD8]) {
        Sniffed::Image("jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Sniffed::Image("gif")
    } else if bytes.starts_with(b"BM") {
        Sniffed::Image("bmp")
    } else {
        Sniffed::Unknown
    }
}

/// Checks `bytes` of `kind` against the limits. `format` is the client's word for an audio
/// clip's format (`wav`, `mp3`), which must match its bytes. Returns a clip's length in
/// seconds as the decoder will count it (none for an image).
///
/// # Errors
/// Why it is refused, worded for the client.
pub fn check_media(kind: MediaKind, bytes: &[u8], format: Option<&str>) -> Result<Option<f64>, String> {
    let found = sniff(bytes);
    match (kind, found) {
        (MediaKind::Image, Sniffed::Image(format)) => check_image(format, bytes).map(|()| None),
        (MediaKind::Image, Sniffed::Wav | Sniffed::Mp3 | Sniffed::Flac) => {
            Err("sent as an image but holds audio".into())
        }
        (MediaKind::Image, Sniffed::Unknown) => Err("not a PNG, JPEG, GIF or BMP image".into()),
        (MediaKind::Audio, Sniffed::Image(_)) => Err("sent as audio but holds an image".into()),
        (MediaKind::Audio, _) => audio_bound(found, bytes, format).map(|bound| Some(bound.seconds())),
    }
}

/// A clip's bound, refused past [`MAX_AUDIO_SECONDS`] (the decoder's buffer is then at most
/// that many seconds of samples at the projector's rate).
pub(crate) fn audio_bound(found: Sniffed, bytes: &[u8], format: Option<&str>) -> Result<AudioBound, String> {
    let name = match found {
        Sniffed::Wav => "wav",
        Sniffed::Mp3 => "mp3",
        Sniffed::Flac => return Err("FLAC audio is not supported; send wav or mp3".into()),
        Sniffed::Image(_) | Sniffed::Unknown => return Err("not a WAV or MP3 file".into()),
    };
    match format {
        Some(said @ ("wav" | "mp3")) if said != name => {
            return Err(format!("the bytes are {} audio, not {said} as the part says", name.to_uppercase()))
        }
        Some("wav" | "mp3") | None => {}
        Some(other) => return Err(format!("audio format '{other}' is not supported; send wav or mp3")),
    }
    let bound = if found == Sniffed::Wav { wav_bound(bytes)? } else { mp3_bound(bytes)? };
    let seconds = bound.seconds();
    if seconds > MAX_AUDIO_SECONDS as f64 {
        return Err(format!("{seconds:.0} s of audio; at most {MAX_AUDIO_SECONDS} s"));
    }
    Ok(bound)
}

/// An image's width and height as stb_image will read them: its own reading of each header,
/// since a reader that disagrees with the decoder (fill bytes before a JPEG's frame header, a
/// PNG's `CgBI` chunk before its `IHDR`) would check a size the decoder never uses.
pub(crate) fn image_size(format: &str, bytes: &[u8]) -> Result<(u64, u64), String> {
    let size = match format {
        "png" => png_size(bytes),
        "jpeg" => jpeg_size(bytes),
        "gif" => Some((le::<2>(bytes, 6).unwrap_or(0), le::<2>(bytes, 8).unwrap_or(0))),
        _ => bmp_size(bytes),
    };
    size.ok_or_else(|| format!("not a {} image stb_image reads", format.to_uppercase()))
}

/// A big-endian integer of `N` bytes at `at`.
fn be<const N: usize>(bytes: &[u8], at: usize) -> Option<u64> {
    let slice = bytes.get(at..at.checked_add(N)?)?;
    Some(slice.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

/// A PNG's size: its `IHDR`, the first chunk after any `CgBI` ones (Apple's, which stb_image
/// skips).
fn png_size(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut at = 8;
    loop {
        let len = usize::try_from(be::<4>(bytes, at)?).ok()?;
        match bytes.get(at + 4..at + 8)? {
            b"CgBI" => at = at.checked_add(len)?.checked_add(12)?,
            b"IHDR" if len == 13 => return Some((be::<4>(bytes, at + 8)?, be::<4>(bytes, at + 12)?)),
            _ => return None,
        }
    }
}

/// A JPEG's size: the first baseline, extended or progressive frame header (SOF0 to SOF2),
/// found by walking the segments as stb_image does (fill bytes, and junk after a segment,
/// skipped); none where stb_image would stop before one.
fn jpeg_size(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut at = 0;
    // A marker: 0xFF, any fill 0xFFs, its code; `Some(None)` where the byte is no marker.
    let marker = |at: &mut usize| -> Option<Option<u8>> {
        let first = *bytes.get(*at)?;
        *at += 1;
        if first != 0xFF {
            return Some(None);
        }
        loop {
            let code = *bytes.get(*at)?;
            *at += 1;
            if code != 0xFF {
                return Some(Some(code));
            }
        }
    };
    if marker(&mut at)? != Some(0xD8) {
        return None;
    }
    let mut code = marker(&mut at)?;
    loop {
        match code? {
            0xC0..=0xC2 => return Some((be::<2>(bytes, at + 5)?, be::<2>(bytes, at + 3)?)),
            0xDD if be::<2>(bytes, at)? == 4 => at += 4,
            0xC4 | 0xDB | 0xE0..=0xEF | 0xFE => {
                let len = usize::try_from(be::<2>(bytes, at)?).ok().filter(|&len| len >= 2)?;
                at += len;
            }
            _ => return None,
        }
        code = marker(&mut at)?;
        while code.is_none() && at < bytes.len() {
            code = marker(&mut at)?;
        }
    }
}

/// A BMP's size as stb_image reads it: 16-bit sizes in an OS/2 header (12 bytes), else a
/// 32-bit width and a signed height (negative: the rows run top-down).
fn bmp_size(bytes: &[u8]) -> Option<(u64, u64)> {
    match le::<4>(bytes, 14)? {
        12 => Some((le::<2>(bytes, 18)?, le::<2>(bytes, 20)?)),
        40 | 56 | 108 | 124 => {
            let height = i32::from_le_bytes(bytes.get(22..26)?.try_into().ok()?);
            Some((le::<4>(bytes, 18)?, u64::from(height.unsigned_abs())))
        }
        _ => None,
    }
}

fn check_image(format: &str, bytes: &[u8]) -> Result<(), String> {
    let (width, height) = image_size(format, bytes)?;
    if width == 0 || height == 0 {
        return Err("the image has no pixels".into());
    }
    if width.saturating_mul(height) > MAX_IMAGE_PIXELS {
        return Err(format!("{width} × {height} pixels; at most {MAX_IMAGE_PIXELS} pixels"));
    }
    Ok(())
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
