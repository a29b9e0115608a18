//! An audio clip's length as libmtmd's decoder will see it, read from its bytes before anything
//! decodes it. libmtmd hands a clip to miniaudio, which sizes its output from what the container
//! claims (a WAV's data size, an MP3's Xing frame count, a FLAC's sample count), converted to
//! the projector's rate, and allocates that many samples at once: a claim is an allocation.
//! So the bound computed here is of what the decoder will *claim*, not of what the file holds,
//! and it covers every decoder miniaudio may end up running on the bytes (it tries WAV, then
//! FLAC, then MP3, whatever the file name or the client's `format` say).
//!
//! Accepted: RIFF/WAVE holding PCM (8, 16, 24, 32 bits) or IEEE float (32, 64 bits), plain or
//! `WAVE_FORMAT_EXTENSIBLE`, 1 to 8 channels, at [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`] Hz;
//! MPEG audio (MP3, and layers I and II) at a fixed bit rate. Refused: FLAC, free-format MPEG
//! streams, everything else.

/// Lowest sample rate of a clip (telephone audio): a lower one stretches a few bytes into a
/// long clip once resampled.
pub const MIN_SAMPLE_RATE: u32 = 8_000;
/// Highest sample rate of a clip (studio audio).
pub const MAX_SAMPLE_RATE: u32 = 192_000;
/// Most channels of a WAV clip (7.1 surround).
const MAX_CHANNELS: u64 = 8;

/// The most a decoder will claim of a clip: `frames` samples per channel at `rate` Hz.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AudioBound {
    /// Sample frames.
    pub(crate) frames: u64,
    /// Their rate.
    pub(crate) rate: u32,
}

impl AudioBound {
    /// The clip's length in seconds.
    pub(crate) fn seconds(self) -> f64 {
        self.frames as f64 / f64::from(self.rate)
    }

    /// Bytes of the buffer libmtmd's decoder allocates for it: mono 32-bit float samples at
    /// `output_rate` (miniaudio's count after resampling, plus one). What the tests tie the
    /// inspector's verdict to.
    #[cfg(test)]
    pub(crate) fn decoded_bytes(self, output_rate: u32) -> u64 {
        let frames = u128::from(self.frames) * u128::from(output_rate) / u128::from(self.rate.max(1)) + 1;
        u64::try_from(frames.saturating_mul(4)).unwrap_or(u64::MAX)
    }
}

/// A little-endian integer of `N` bytes at `at`.
pub(super) fn le<const N: usize>(bytes: &[u8], at: usize) -> Option<u64> {
    let slice = bytes.get(at..at.checked_add(N)?)?;
    Some(slice.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

/// A big-endian integer of `N` bytes at `at`.
fn be<const N: usize>(bytes: &[u8], at: usize) -> Option<u64> {
    let slice = bytes.get(at..at.checked_add(N)?)?;
    Some(slice.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

/// The size of an ID3v2 tag starting at `at` (header and footer included), if one does.
fn id3_len(bytes: &[u8], at: usize) -> Option<usize> {
    let header = bytes.get(at..at + 10)?;
    if &header[..3] != b"ID3" {
        return None;
    }
    let size = header[6..10].iter().fold(0usize, |acc, &b| (acc << 7) | usize::from(b & 0x7F));
    let footer = if header[5] & 0x10 != 0 { 10 } else { 0 };
    Some(10 + size + footer)
}

/// Whether miniaudio's FLAC decoder would take the bytes: `fLaC` or an Ogg page, after any
/// number of ID3v2 tags (it skips them all).
pub(super) fn is_flac(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Some(len) = id3_len(bytes, at) {
        at = at.saturating_add(len);
    }
    matches!(bytes.get(at..at.saturating_add(4)), Some(b"fLaC" | b"OggS"))
}

/// The `KSDATAFORMAT_SUBTYPE_*` GUID's last 14 bytes, common to PCM and float.
const SUBTYPE_TAIL: [u8; 14] = [0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71];

/// A WAV clip's bound, as miniaudio's WAV decoder counts it: the first `data` chunk's size,
/// cut to what the file holds, in whole frames, at the last `fmt ` chunk's rate. Only a layout
/// that decoder is sure to accept passes: were it to refuse, miniaudio would try the MP3
/// decoder on the same bytes.
///
/// # Errors
/// Why it is refused, worded for the client.
pub(crate) fn wav_bound(bytes: &[u8]) -> Result<AudioBound, String> {
    let bad = |why: &str| format!("not a WAV file this server reads: {why}");
    if bytes.len() < 12 || &bytes[..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(bad("no RIFF/WAVE header"));
    }
    let mut at = 12;
    let mut format = None;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 8][..4];
        let size = le::<4>(bytes, at + 4).unwrap_or(0) as usize;
        let body = at + 8;
        if id == b"fmt " {
            format = Some(wav_format(bytes, body, size).map_err(|why| bad(&why))?);
        } else if id == b"fact" && size < 4 {
            // The decoder reads a count from it and would skip past the end.
            return Err(bad("a short fact chunk"));
        } else if id == b"data" {
            let (rate, frame) = format.ok_or_else(|| bad("data before its fmt chunk"))?;
            let held = size.min(bytes.len() - body) as u64;
            return Ok(AudioBound { frames: held / frame, rate });
        }
        // Chunks are padded to an even size.
        at = body.saturating_add(size).saturating_add(size & 1);
    }
    Err(bad("no data chunk"))
}

/// A `fmt ` chunk's sample rate and bytes per frame, from its `size` bytes at `body`.
fn wav_format(bytes: &[u8], body: usize, size: usize) -> Result<(u32, u64), String> {
    let field = |offset: usize, width: usize| {
        let value = if width == 2 { le::<2>(bytes, body + offset) } else { le::<4>(bytes, body + offset) };
        value.ok_or_else(|| "short fmt chunk".to_string())
    };
    let (tag, channels, rate) = (field(0, 2)?, field(2, 2)?, field(4, 4)?);
    let (block, bits) = (field(12, 2)?, field(14, 2)?);
    let extension = if size > 16 { field(16, 2)? } else { 0 };
    let sample = match (tag, size, extension) {
        (1 | 3, 16, _) | (1 | 3, 18, 0) => tag,
        (0xFFFE, 40, 22) => {
            let guid = bytes.get(body + 24..body + 40).ok_or("short fmt chunk")?;
            if guid[2..] != SUBTYPE_TAIL {
                return Err("an extensible format's subformat must be PCM or float".into());
            }
            u64::from(guid[0]) | (u64::from(guid[1]) << 8)
        }
        (1 | 3 | 0xFFFE, ..) => return Err(format!("a fmt chunk of {size} bytes")),
        _ => return Err("samples must be PCM or float (no compressed formats)".into()),
    };
    let sizes_ok = match sample {
        1 => matches!(bits, 8 | 16 | 24 | 32),
        3 => matches!(bits, 32 | 64),
        _ => return Err("an extensible format's subformat must be PCM or float".into()),
    };
    if !sizes_ok {
        return Err(format!("{bits}-bit samples"));
    }
    if channels == 0 || channels > MAX_CHANNELS {
        return Err(format!("{channels} channels; 1 to {MAX_CHANNELS}"));
    }
    if block != channels * bits / 8 {
        return Err("the frame size does not match the channels and sample size".into());
    }
    let rate = u32::try_from(rate).unwrap_or(u32::MAX);
    if !(MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&rate) {
        return Err(format!("a sample rate of {rate} Hz; {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz"));
    }
    Ok((rate, block))
}

/// One MPEG audio frame header, read as miniaudio's MP3 decoder reads it.
#[derive(Clone, Copy, Debug)]
pub(super) struct MpegHeader([u8; 4]);

impl MpegHeader {
    /// The header at `at`, if those four bytes are a valid one.
    pub(super) fn at(bytes: &[u8], at: usize) -> Option<Self> {
        let h: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        // MPEG 1 or 2 (any layer), or MPEG 2.5 layer III.
        let sync = h[0] == 0xFF && (h[1] & 0xF0 == 0xF0 || h[1] & 0xFE == 0xE2);
        let valid = sync && (h[1] >> 1) & 3 != 0 && h[2] >> 4 != 15 && (h[2] >> 2) & 3 != 3;
        valid.then_some(Self(h))
    }

    fn mpeg1(self) -> bool {
        self.0[1] & 0x08 != 0
    }

    /// 1, 2 or 3.
    fn layer(self) -> usize {
        4 - usize::from((self.0[1] >> 1) & 3)
    }

    /// A free-format frame: no bit rate, its length found by looking for the next header.
    pub(super) fn free_format(self) -> bool {
        self.0[2] >> 4 == 0
    }

    /// Samples per second.
    pub(super) fn rate(self) -> u32 {
        let base = [44_100, 48_000, 32_000][usize::from((self.0[2] >> 2) & 3)];
        let mpeg25 = self.0[1] & 0x10 == 0;
        base >> u32::from(!self.mpeg1()) >> u32::from(mpeg25)
    }

    /// Samples per channel it decodes to.
    pub(super) fn samples(self) -> u32 {
        match self.layer() {
            1 => 384,
            3 if !self.mpeg1() => 576,
            _ => 1152,
        }
    }

    fn kbps(self) -> u32 {
        const MPEG1: [[u32; 15]; 3] = [
            [0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448],
            [0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384],
            [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320],
        ];
        const MPEG2: [[u32; 15]; 2] = [
            [0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256],
            [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160],
        ];
        let index = usize::from(self.0[2] >> 4);
        if self.mpeg1() {
            MPEG1[self.layer() - 1][index]
        } else {
            MPEG2[usize::from(self.layer() != 1)][index]
        }
    }

    /// The padding its frame adds: a slot of 4 bytes (layer I) or 1.
    fn padding(self) -> usize {
        match (self.0[2] & 2 != 0, self.layer()) {
            (false, _) => 0,
            (true, 1) => 4,
            (true, _) => 1,
        }
    }

    /// Its frame's length in bytes, padding included (0 for a free-format frame).
    pub(super) fn len(self) -> usize {
        if self.free_format() {
            return 0;
        }
        let bytes = (self.samples() * self.kbps() * 125 / self.rate()) as usize;
        let slots = if self.layer() == 1 { bytes & !3 } else { bytes };
        slots + self.padding()
    }

    /// Whether `other` continues a stream of this header's kind (same version, layer, rate).
    fn continued_by(self, other: Option<Self>) -> bool {
        other.is_some_and(|o| {
            (self.0[1] ^ o.0[1]) & 0xFE == 0
                && (self.0[2] ^ o.0[2]) & 0x0C == 0
                && self.free_format() == o.free_format()
        })
    }

    /// Where a Xing/Info tag would start in its frame: after the header, the CRC if any, and
    /// layer III's side information.
    fn tag_offset(self) -> usize {
        let crc = if self.0[1] & 1 == 0 { 2 } else { 0 };
        let mono = self.0[3] & 0xC0 == 0xC0;
        let side = match (self.mpeg1(), mono) {
            (true, true) | (false, false) => 17,
            (true, false) => 32,
            (false, true) => 9,
        };
        4 + crc + side
    }
}

/// Most free-format-looking headers examined before the clip is refused: real streams at a
/// fixed bit rate hold a few by chance, and each costs a search.
const FREE_FORMAT_LOOKS: usize = 4_096;
/// Longest free-format frame miniaudio looks for.
const MAX_FREE_FORMAT_BYTES: usize = 2_304;
/// Longer than any MPEG frame (layer II at 384 kbit/s and 32 kHz: 1,729 bytes).
const MAX_FRAME_BYTES: usize = 2_048;

/// An MPEG audio clip's bound, as miniaudio's MP3 decoder counts it: a Xing or Info tag's frame
/// count where one is, else every frame it can find. Its search resynchronises anywhere, so
/// the bound is the longest run of non-overlapping frames, each followed by a header that
/// continues it (as the decoder requires) or by the stream's end: never shorter than what
/// it finds. Where a tag claims more, the claim is the bound. The lowest rate of those frames
/// is the rate (the decoder keeps its first frame's).
///
/// # Errors
/// Why it is refused, worded for the client.
pub(crate) fn mp3_bound(bytes: &[u8]) -> Result<AudioBound, String> {
    let start = match id3_len(bytes, 0) {
        Some(len) if len > bytes.len() => return Err("an ID3 tag longer than the file".into()),
        Some(len) => len,
        None => 0,
    };
    let end = stream_end(bytes)?;
    if bytes.len() < 10 || start >= end {
        return Err("not an MP3 file: no MPEG audio frames found".into());
    }
    let stream = &bytes[..end];
    refuse_free_format(stream, start)?;
    // best[p % MAX_FRAME_BYTES]: the most samples frames from p to the end can hold.
    let mut best = vec![0u64; MAX_FRAME_BYTES];
    let mut rate = u32::MAX;
    let mut claimed = 0u64;
    for at in (start..end).rev() {
        let after = best[(at + 1) % MAX_FRAME_BYTES];
        let mut here = after;
        if let Some(header) = MpegHeader::at(stream, at).filter(|h| !h.free_format()) {
            let next = at + header.len();
            if next == end || (next < end && header.continued_by(MpegHeader::at(stream, next))) {
                let tail = if next == end { 0 } else { best[next % MAX_FRAME_BYTES] };
                here = here.max(u64::from(header.samples()) + tail);
                rate = rate.min(header.rate());
                claimed = claimed.max(xing_frames(stream, at, header) * u64::from(header.samples()));
            }
        }
        best[at % MAX_FRAME_BYTES] = here;
    }
    let frames = best[start % MAX_FRAME_BYTES].max(claimed);
    if frames == 0 {
        return Err("not an MP3 file: no MPEG audio frames found".into());
    }
    Ok(AudioBound { frames, rate })
}

/// The frame count a Xing or Info tag in the frame at `at` claims (0 where none does).
fn xing_frames(stream: &[u8], at: usize, header: MpegHeader) -> u64 {
    let tag = at + header.tag_offset();
    match stream.get(tag..tag + 8) {
        Some([b'X', b'i', b'n', b'g', _, _, _, flags] | [b'I', b'n', b'f', b'o', _, _, _, flags]) if flags & 1 != 0 => {
            be::<4>(stream, tag + 8).unwrap_or(0)
        }
        _ => 0,
    }
}

/// Where the decoder's stream ends: before a trailing ID3v1 tag and an APE tag, which it cuts.
fn stream_end(bytes: &[u8]) -> Result<usize, String> {
    let mut end = bytes.len();
    if end > 128 && bytes[end - 128..].starts_with(b"TAG") {
        end -= 128;
    }
    if end > 32 && bytes[end - 32..end].starts_with(b"APETAGEX") {
        let size = le::<4>(bytes, end - 8).unwrap_or(0) as usize;
        match size.checked_add(32) {
            Some(tag) if tag < end && size <= u32::MAX as usize - 32 => end -= tag,
            Some(_) if size <= u32::MAX as usize - 32 => {}
            _ => return Err("a malformed APE tag".into()),
        }
    }
    Ok(end)
}

/// Refuses a stream where the decoder could lock onto free-format frames: their length is
/// wherever the next header is, so a few bytes could each decode into a whole frame.
fn refuse_free_format(stream: &[u8], start: usize) -> Result<(), String> {
    let refused = || Err("free-format MPEG streams are not supported".to_string());
    let mut looked = 0;
    for at in start..stream.len() {
        let Some(header) = MpegHeader::at(stream, at).filter(|h| h.free_format()) else { continue };
        looked += 1;
        if looked > FREE_FORMAT_LOOKS {
            return refused();
        }
        for k in 4..MAX_FREE_FORMAT_BYTES {
            let Some(next) = MpegHeader::at(stream, at + k).filter(|&n| header.continued_by(Some(n))) else {
                continue;
            };
            // The frame is k bytes, the next one as long less its own padding.
            let after = (at + k + k + next.padding()).checked_sub(header.padding());
            if after.is_some_and(|after| header.continued_by(MpegHeader::at(stream, after))) {
                return refused();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "audio_tests.rs"]
pub(super) mod tests;
