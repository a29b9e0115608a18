//! What a media part's headers say, read before anything decodes it: an image's format and
//! size, an audio clip's format and length. A small file can decode into a huge one (a PNG
//! declaring 30,000 × 30,000 pixels, an MP3 of silence at 8 kbit/s), so the limits are checked
//! on the headers, and the decoders (stb_image, miniaudio) see only what passed.

use super::{MediaKind, MAX_AUDIO_SECONDS, MAX_IMAGE_PIXELS};

/// Checks `bytes` of `kind` against the limits. `format` is the client's word for an audio
/// clip's format (`wav`, `mp3`), which must match its bytes. Returns a clip's length in
/// seconds (none for an image).
///
/// # Errors
/// Why it is refused, worded for the client.
pub fn check_media(kind: MediaKind, bytes: &[u8], format: Option<&str>) -> Result<Option<f64>, String> {
    match kind {
        MediaKind::Image => check_image(bytes).map(|()| None),
        MediaKind::Audio => {
            let seconds = match format.unwrap_or_else(|| audio_format(bytes)) {
                "wav" => wav_seconds(bytes)?,
                "mp3" => mp3_seconds(bytes)?,
                other => return Err(format!("audio format '{other}' is not supported; send wav or mp3")),
            };
            if seconds > MAX_AUDIO_SECONDS as f64 {
                return Err(format!("{seconds:.0} s of audio; at most {MAX_AUDIO_SECONDS} s"));
            }
            Ok(Some(seconds))
        }
    }
}

fn check_image(bytes: &[u8]) -> Result<(), String> {
    let unsupported = || "not a PNG, JPEG, GIF or BMP image".to_string();
    imagesize::image_type(bytes).map_err(|_| unsupported())?;
    let size = imagesize::blob_size(bytes).map_err(|_| unsupported())?;
    let pixels = (size.width as u64).saturating_mul(size.height as u64);
    if size.width == 0 || size.height == 0 {
        return Err("the image has no pixels".into());
    }
    if pixels > MAX_IMAGE_PIXELS {
        return Err(format!("{} × {} pixels; at most {MAX_IMAGE_PIXELS} pixels", size.width, size.height));
    }
    Ok(())
}

/// `wav` or `mp3` as the bytes look, for clips sent without a format.
fn audio_format(bytes: &[u8]) -> &'static str {
    if bytes.starts_with(b"RIFF") {
        "wav"
    } else {
        "mp3"
    }
}

/// A little-endian integer of `N` bytes at `at`.
fn le<const N: usize>(bytes: &[u8], at: usize) -> Option<u64> {
    let slice = bytes.get(at..at + N)?;
    Some(slice.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

/// A WAV clip's length, as its decoder will see it: the frames its data holds (no more than
/// the file holds) at its sample rate. PCM and float samples only.
fn wav_seconds(bytes: &[u8]) -> Result<f64, String> {
    let bad = |why: &str| format!("not a WAV file this server reads: {why}");
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(bad("no RIFF/WAVE header"));
    }
    let mut at = 12;
    let mut format = None;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let size = le::<4>(bytes, at + 4).unwrap_or(0) as usize;
        let body = at + 8;
        if id == b"fmt " {
            let tag = le::<2>(bytes, body).ok_or_else(|| bad("short fmt chunk"))?;
            let rate = le::<4>(bytes, body + 4).ok_or_else(|| bad("short fmt chunk"))?;
            let block = le::<2>(bytes, body + 12).ok_or_else(|| bad("short fmt chunk"))?;
            if !matches!(tag, 1 | 3 | 0xFFFE) {
                return Err(bad("samples must be PCM or float"));
            }
            if rate == 0 || block == 0 {
                return Err(bad("no sample rate or frame size"));
            }
            format = Some((rate, block));
        } else if id == b"data" {
            let (rate, block) = format.ok_or_else(|| bad("data before its fmt chunk"))?;
            let held = size.min(bytes.len() - body) as u64;
            return Ok((held / block) as f64 / rate as f64);
        }
        // Chunks are padded to an even size.
        at = body.saturating_add(size).saturating_add(size & 1);
    }
    Err(bad("no data chunk"))
}

/// An MP3 clip's length: the frames found, each with the samples its header declares. Where a
/// frame does not follow the last, the search goes on byte by byte (as decoders resynchronise),
/// so nothing a decoder would play is left out of the count.
fn mp3_seconds(bytes: &[u8]) -> Result<f64, String> {
    let mut at = 0;
    // An ID3v2 tag: 10 bytes, then a size in 7-bit bytes (and a 10-byte footer if flagged).
    if bytes.len() >= 10 && &bytes[..3] == b"ID3" {
        let size = bytes[6..10].iter().fold(0usize, |acc, &b| (acc << 7) | usize::from(b & 0x7F));
        let footer = if bytes[5] & 0x10 != 0 { 10 } else { 0 };
        at = 10 + size + footer;
    }
    let mut seconds = 0.0;
    let mut frames = 0u64;
    while at + 4 <= bytes.len() {
        match mp3_frame(&bytes[at..at + 4]) {
            Some(frame) => {
                seconds += f64::from(frame.samples) / f64::from(frame.rate);
                frames += 1;
                at += frame.len;
            }
            None => at += 1,
        }
    }
    if frames == 0 {
        return Err("not an MP3 file: no MPEG audio frames found".into());
    }
    Ok(seconds)
}

/// One MPEG audio frame, from its 4-byte header.
struct Mp3Frame {
    /// Its length in bytes, header included.
    len: usize,
    /// Samples per channel it decodes to.
    samples: u32,
    /// Samples per second.
    rate: u32,
}

fn mp3_frame(header: &[u8]) -> Option<Mp3Frame> {
    const MPEG1: [[u32; 15]; 3] = [
        [0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448],
        [0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384],
        [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],
    ];
    const MPEG2: [[u32; 15]; 2] = [
        [0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256],
        [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
    ];
    if header[0] != 0xFF || header[1] & 0xE0 != 0xE0 {
        return None;
    }
    let version = (header[1] >> 3) & 3; // 0: MPEG 2.5, 2: MPEG 2, 3: MPEG 1
    let layer = match (header[1] >> 1) & 3 {
        3 => 1,
        2 => 2,
        1 => 3,
        _ => return None,
    };
    let bitrate_index = usize::from(header[2] >> 4);
    let rate_index = usize::from((header[2] >> 2) & 3);
    if version == 1 || bitrate_index == 0 || bitrate_index == 15 || rate_index == 3 {
        return None;
    }
    let padding = u32::from((header[2] >> 1) & 1);
    let mpeg1 = version == 3;
    let kbps = if mpeg1 { MPEG1[layer - 1][bitrate_index] } else { MPEG2[usize::from(layer != 1)][bitrate_index] };
    let rate = [44_100, 48_000, 32_000][rate_index]
        >> match version {
            3 => 0,
            2 => 1,
            _ => 2,
        };
    let samples = match layer {
        1 => 384,
        3 if !mpeg1 => 576,
        _ => 1152,
    };
    let len =
        if layer == 1 { (12 * kbps * 1000 / rate + padding) * 4 } else { samples / 8 * kbps * 1000 / rate + padding };
    (len >= 4).then_some(Mp3Frame { len: len as usize, samples, rate })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mono 16-bit PCM WAV of `frames` frames at `rate`.
    fn wav(frames: u32, rate: u32) -> Vec<u8> {
        let data = frames * 2;
        let mut out = Vec::new();
        out.extend_from_slice(b"RIFF");
        out.extend_from_slice(&(36 + data).to_le_bytes());
        out.extend_from_slice(b"WAVEfmt ");
        out.extend_from_slice(&16u32.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&rate.to_le_bytes());
        out.extend_from_slice(&(rate * 2).to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(b"data");
        out.extend_from_slice(&data.to_le_bytes());
        out.resize(out.len() + data as usize, 0);
        out
    }

    #[test]
    fn a_wav_is_as_long_as_the_frames_it_holds() {
        assert!((wav_seconds(&wav(16_000, 16_000)).expect("accepted") - 1.0).abs() < 1e-9);
        // A data size larger than the file counts only what the file holds.
        let mut lying = wav(8_000, 16_000);
        lying[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!((wav_seconds(&lying).expect("accepted") - 0.5).abs() < 1e-9);
        // A tiny declared rate makes a long clip, which the limit refuses.
        let slow = wav(8_000, 1);
        assert!(check_media(MediaKind::Audio, &slow, Some("wav")).expect_err("refused").contains("at most"));
        assert!(check_media(MediaKind::Audio, &wav(16_000, 16_000), Some("wav")).is_ok());
        assert!(check_media(MediaKind::Audio, b"RIFF....WAVE", Some("wav")).is_err());
        assert!(check_media(MediaKind::Audio, &wav(16, 16_000), Some("flac"))
            .expect_err("refused")
            .contains("wav or mp3"));
    }

    /// `n` MPEG-1 layer III frames at 32 kHz, of the bit rate at `kbps_index`, after an ID3 tag.
    fn mp3(n: usize, kbps_index: u8) -> Vec<u8> {
        let header = [0xFF, 0xFB, (kbps_index << 4) | (2 << 2), 0xC4];
        let frame = mp3_frame(&header).expect("accepted");
        let mut out = b"ID3\x04\x00\x00\x00\x00\x00\x05hello".to_vec();
        for _ in 0..n {
            out.extend_from_slice(&header);
            out.resize(out.len() + frame.len - 4, 0);
        }
        out
    }

    #[test]
    fn an_mp3_is_as_long_as_its_frames() {
        // MPEG-1 layer III, 128 kbit/s at 32 kHz: 1152 samples a frame.
        let clip = mp3(100, 9);
        let seconds = mp3_seconds(&clip).expect("accepted");
        assert!((seconds - 100.0 * 1152.0 / 32_000.0).abs() < 1e-9, "{seconds}");
        // Junk between frames is skipped, the frames after it still count.
        let mut junk = mp3(10, 9);
        junk.extend_from_slice(&[0u8; 37]);
        junk.extend_from_slice(&mp3(10, 9)[15..]);
        assert!((mp3_seconds(&junk).expect("accepted") - 20.0 * 1152.0 / 32_000.0).abs() < 1e-9);
        assert!(mp3_seconds(b"no frames here at all").is_err());
        // 32 kbit/s frames: a small file that plays for long is refused on its headers.
        let long = mp3(25_000, 1);
        assert!(long.len() < 5_000_000);
        assert!(check_media(MediaKind::Audio, &long, Some("mp3")).expect_err("refused").contains("at most"));
    }

    proptest::proptest! {
        /// The fuzz target `media_headers` in short, on every test run: arbitrary bytes, and
        /// valid headers with bytes changed, never panic, and an accepted clip's length is
        /// finite and within the limit.
        #[test]
        fn any_bytes_are_inspected_without_panicking(
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048),
            flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 0..8),
        ) {
            let mut seeds = vec![noise, wav(400, 16_000), mp3(20, 9)];
            for seed in &mut seeds[1..] {
                for &(at, byte) in &flips {
                    let len = seed.len();
                    seed[at % len] = byte;
                }
            }
            for bytes in &seeds {
                let _ = check_media(MediaKind::Image, bytes, None);
                for format in [Some("wav"), Some("mp3"), None] {
                    if let Ok(seconds) = check_media(MediaKind::Audio, bytes, format) {
                        let seconds = seconds.expect("a clip has a length");
                        proptest::prop_assert!(seconds.is_finite() && seconds <= MAX_AUDIO_SECONDS as f64);
                    }
                }
            }
        }
    }

    #[test]
    fn images_are_checked_on_their_headers() {
        // A PNG header declaring 40,000 × 40,000 pixels, with no pixel data.
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&40_000u32.to_be_bytes());
        png.extend_from_slice(&40_000u32.to_be_bytes());
        png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
        assert!(check_media(MediaKind::Image, &png, None).expect_err("refused").contains("at most"));
        png[16..20].copy_from_slice(&64u32.to_be_bytes());
        png[20..24].copy_from_slice(&64u32.to_be_bytes());
        assert!(check_media(MediaKind::Image, &png, None).is_ok());
        assert!(check_media(MediaKind::Image, b"RIFF\x00\x00\x00\x00WEBPVP8 ", None).is_err());
        assert!(check_media(MediaKind::Image, b"plain text", None).is_err());
    }
}
