//! Length-delimited frames carrying postcard-encoded messages.
//!
//! A frame is a 4-byte big-endian payload length followed by the payload. The length is
//! checked against a limit *before* any byte of the payload is buffered, so a peer cannot
//! make us allocate more than the limit. Decoding errors are values, never panics.
//!
//! This module is sans-IO: [`FrameDecoder`] is fed bytes and yields payloads; the async
//! helpers in `transport` drive it from QUIC streams.

use serde::{Serialize, de::DeserializeOwned};

/// Size of the length prefix in bytes.
pub const HEADER_LEN: usize = 4;

/// Largest frame an agent or gateway exchange may carry.
///
/// A health report with a few dozen checks is well under 4 KiB; 64 KiB leaves room for
/// long check details while bounding what an unauthenticated-until-hello peer can make
/// the coordinator buffer.
pub const MAX_FRAME_LEN: usize = 64 * 1024;

/// Largest frame on the admin API, whose listings of a whole fleet (tens of thousands of
/// machines or queue entries) are much larger than any report.
pub const MAX_ADMIN_FRAME_LEN: usize = 32 * 1024 * 1024;

/// Why a frame could not be produced or understood.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The declared or actual payload length exceeds the limit for this stream.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    Oversized {
        /// Declared length.
        len: usize,
        /// Limit in force.
        max: usize,
    },
    /// The payload is not a valid encoding of the expected message.
    #[error("undecodable frame: {0}")]
    Decode(#[from] postcard::Error),
    /// The stream ended in the middle of a frame.
    #[error("stream ended after {got} of {expected} bytes of a frame")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes the frame header announced (including the header).
        expected: usize,
    },
}

/// Serialises `msg` into a complete frame (header + payload), refusing to produce a frame
/// larger than `max`.
pub fn encode_frame<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = postcard::to_extend(msg, vec![0u8; HEADER_LEN])?;
    let len = out.len() - HEADER_LEN;
    if len > max {
        return Err(FrameError::Oversized { len, max });
    }
    let len32 = u32::try_from(len).map_err(|_| FrameError::Oversized { len, max })?;
    out[..HEADER_LEN].copy_from_slice(&len32.to_be_bytes());
    Ok(out)
}

/// Decodes one payload (without header) as a `T`. Trailing bytes are an error: a frame
/// carries exactly one message.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (msg, rest) = postcard::take_from_bytes::<T>(payload)?;
    if !rest.is_empty() {
        return Err(FrameError::Decode(postcard::Error::DeserializeBadEncoding));
    }
    Ok(msg)
}

/// Reads the payload length from a frame header and checks it against `max`.
pub fn payload_len(header: [u8; HEADER_LEN], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::Oversized { len, max });
    }
    Ok(len)
}

/// Incremental frame decoder: push bytes as they arrive, pop complete payloads.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max: usize,
}

impl FrameDecoder {
    /// A decoder refusing payloads larger than `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            max,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Returns the next complete payload, `Ok(None)` if more bytes are needed, or an error
    /// as soon as a header announces an oversized payload.
    pub fn next_payload(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&self.buf[..HEADER_LEN]);
        let len = payload_len(header, self.max)?;
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.buf.drain(..HEADER_LEN + len);
        Ok(Some(payload))
    }

    /// Called at end of stream: an error if a partial frame is left over.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let expected = if self.buf.len() >= HEADER_LEN {
            let mut header = [0u8; HEADER_LEN];
            header.copy_from_slice(&self.buf[..HEADER_LEN]);
            HEADER_LEN + u32::from_be_bytes(header) as usize
        } else {
            HEADER_LEN
        };
        Err(FrameError::Truncated {
            got: self.buf.len(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{CheckKind, CheckResult, CheckStatus, HealthReport};

    fn report() -> HealthReport {
        HealthReport {
            seq: 7,
            time_unix_ms: 1_700_000_000_000,
            boot_id: "b1".into(),
            checks: vec![CheckResult {
                kind: CheckKind::Nic,
                subject: "eth0".into(),
                status: CheckStatus::Fail,
                detail: "carrier down".into(),
            }],
            report_interval_ms: 5_000,
        }
    }

    #[test]
    fn round_trip_through_decoder_byte_by_byte() {
        let frame = encode_frame(&report(), MAX_FRAME_LEN).unwrap();
        let mut dec = FrameDecoder::new(MAX_FRAME_LEN);
        let mut got = None;
        for b in &frame {
            assert!(got.is_none());
            dec.push(&[*b]);
            got = dec.next_payload().unwrap();
        }
        let back: HealthReport = decode_payload(&got.unwrap()).unwrap();
        assert_eq!(back, report());
        dec.finish().unwrap();
    }

    #[test]
    fn oversized_header_is_refused_before_buffering() {
        let mut dec = FrameDecoder::new(16);
        dec.push(&1000u32.to_be_bytes());
        match dec.next_payload() {
            Err(FrameError::Oversized { len: 1000, max: 16 }) => {}
            other => panic!("expected oversized, got {other:?}"),
        }
    }

    #[test]
    fn encoder_refuses_oversized_message() {
        let mut r = report();
        r.checks[0].detail = "x".repeat(100);
        assert!(matches!(
            encode_frame(&r, 50),
            Err(FrameError::Oversized { .. })
        ));
    }

    #[test]
    fn random_bytes_are_an_error_not_a_panic() {
        // A deterministic pseudo-random sweep: every result must be Ok or Err, never a panic.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let mut buf = vec![0u8; (x % 64) as usize];
            for b in buf.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let _ = decode_payload::<HealthReport>(&buf);
            let _ = decode_payload::<crate::messages::ClientHello>(&buf);
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut frame = encode_frame(&report(), MAX_FRAME_LEN).unwrap();
        frame.push(0);
        assert!(decode_payload::<HealthReport>(&frame[HEADER_LEN..]).is_err());
    }

    #[test]
    fn truncated_stream_is_reported() {
        let frame = encode_frame(&report(), MAX_FRAME_LEN).unwrap();
        let mut dec = FrameDecoder::new(MAX_FRAME_LEN);
        dec.push(&frame[..frame.len() - 1]);
        assert!(dec.next_payload().unwrap().is_none());
        assert!(matches!(dec.finish(), Err(FrameError::Truncated { .. })));
    }
}
