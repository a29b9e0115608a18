//! Media headers: arbitrary bytes as an image, a WAV clip and an MP3 clip, inspected as the API
//! inspects a media part before anything decodes it (`firstword::engine::media::check_media`).
//!
//! Input: the bytes.
//!
//! Checks: inspection never panics and stays linear (no loop on a chunk size of zero, no
//! overflow on sizes near `u32::MAX`); an accepted clip is no longer than the limit, and its
//! length is a finite number of seconds.

#![no_main]

use firstword::engine::media::{check_media, MediaKind, MAX_AUDIO_SECONDS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = check_media(MediaKind::Image, bytes, None);
    for format in [Some("wav"), Some("mp3"), None] {
        if let Ok(seconds) = check_media(MediaKind::Audio, bytes, format) {
            let seconds = seconds.expect("a clip has a length");
            assert!(seconds.is_finite() && (0.0..=MAX_AUDIO_SECONDS as f64).contains(&seconds), "{seconds}");
        }
    }
});
