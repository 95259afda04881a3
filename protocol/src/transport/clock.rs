//! A certificate refused for its dates, said in words a person can act on. rustls says it in
//! UNIX seconds (`certificate not valid yet: verification time 1764270000 (UNIX), but
//! certificate is not valid before 1764280800 (10800 seconds in future)`), and a peer's
//! refusal arrives as that text; both usually mean that two clocks differ, not that the
//! certificate is wrong. Pure text work: the callers say whose clock checked.

use super::expiry::{expiry_date, expiry_distance};

/// Two clocks closer than this are "the same" here: a handshake's round trip and the
/// seconds resolution of certificates make smaller differences noise, and real skew that
/// breaks certificates is hours (a dead RTC battery, a timezone set as UTC).
const SAME_CLOCK_SECS: i64 = 60;

/// What a verifier found wrong with a certificate's dates, read from rustls' text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DateRefusal {
    /// True: before its notBefore; false: after its notAfter.
    pub not_yet: bool,
    /// The verifier's clock when it checked (seconds since the Unix epoch).
    pub checked_at: i64,
    /// The bound it was checked against: notBefore when `not_yet`, else notAfter.
    pub bound: i64,
    /// Where in the text rustls' sentence starts and ends.
    span: (usize, usize),
}

/// Finds rustls' sentence about a certificate's dates in `text` (an error, a peer's close
/// reason); `None` when there is none.
pub fn date_refusal(text: &str) -> Option<DateRefusal> {
    for (head, not_yet, bound_word) in [
        ("certificate not valid yet: ", true, "not valid before "),
        ("certificate expired: ", false, "not valid after "),
    ] {
        let Some(start) = text.find(head) else {
            continue;
        };
        let rest = &text[start..];
        let checked_at = number_after(rest, "verification time ")?;
        let bound = number_after(rest, bound_word)?;
        // The sentence ends with "(N seconds in future)" / "(N seconds ago)".
        let end = rest
            .find(" seconds in future)")
            .map(|i| i + " seconds in future)".len())
            .or_else(|| {
                rest.find(" seconds ago)")
                    .map(|i| i + " seconds ago)".len())
            })
            .unwrap_or(rest.len());
        return Some(DateRefusal {
            not_yet,
            checked_at,
            bound,
            span: (start, start + end),
        });
    }
    None
}

fn number_after(text: &str, word: &str) -> Option<i64> {
    let i = text.find(word)? + word.len();
    let digits: String = text[i..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

impl DateRefusal {
    /// The refusal in words. `checker` is whose clock checked (`"this host"`, `"the
    /// coordinator"`); `now`, when the check was made elsewhere, is this host's clock, so
    /// the two clocks can be compared.
    pub fn sentence(&self, checker: &str, now: Option<i64>) -> String {
        let gap = (self.bound - self.checked_at).abs();
        let mut s = if self.not_yet {
            format!(
                "the certificate is not valid yet by the clock of {checker}: it is valid from {}, {} after that clock ({})",
                expiry_date(self.bound),
                distance(gap),
                expiry_date(self.checked_at)
            )
        } else {
            format!(
                "the certificate expired by the clock of {checker}: it was valid until {}, {} before that clock ({})",
                expiry_date(self.bound),
                distance(gap),
                expiry_date(self.checked_at)
            )
        };
        match now {
            Some(now) if (now - self.checked_at).abs() >= SAME_CLOCK_SECS => {
                s.push_str(&format!(
                    "; the clocks of this host and {checker} differ by {}: fix the wrong one (`timedatectl status` on both; NTP)",
                    distance((now - self.checked_at).abs())
                ));
            }
            _ if self.not_yet => {
                // A certificate is valid from (an hour before) the moment it was issued: a
                // verifier that finds it not valid yet runs behind the issuing host's clock.
                s.push_str(&format!(
                    "; so the clock of {checker} is behind the clock of the host that issued it by more than {}: fix the wrong clock (`timedatectl status` on both; NTP), not the certificate",
                    distance(gap)
                ));
            }
            _ => {}
        }
        s
    }
}

/// `text` with rustls' sentence about a certificate's dates (if any) replaced by
/// [`DateRefusal::sentence`]; unchanged otherwise.
pub fn explain_dates(text: &str, checker: &str, now: Option<i64>) -> String {
    match date_refusal(text) {
        Some(r) => format!(
            "{}{}{}",
            &text[..r.span.0],
            r.sentence(checker, now),
            &text[r.span.1..]
        ),
        None => text.to_string(),
    }
}

/// `3 hours`, `2 days`, `5 minutes`, `40 seconds`: a span, cut down to its unit.
fn distance(secs: i64) -> String {
    if secs < 120 {
        return format!("{secs} seconds");
    }
    // expiry_distance says "in N units" for a time ahead.
    expiry_distance(secs, 0)
        .trim_start_matches("in ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CertificateError;
    use rustls_pki_types::UnixTime;

    fn rustls_text(e: CertificateError) -> String {
        rustls::Error::InvalidCertificate(e).to_string()
    }

    const T: u64 = 1_764_270_000; // Nov 27 19:00:00 2025 UTC

    #[test]
    fn a_certificate_not_valid_yet_names_the_clocks_not_the_ca() {
        let text = format!(
            "TLS alert bad_certificate: {}",
            rustls_text(CertificateError::NotValidYetContext {
                time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(T)),
                not_before: UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                    T + 3 * 3600
                )),
            })
        );
        let r = date_refusal(&text).expect("rustls' sentence is recognised");
        assert!(r.not_yet);
        assert_eq!((r.checked_at, r.bound), (T as i64, T as i64 + 3 * 3600));
        // Checked here: the issuing host's clock is ahead.
        let here = explain_dates(&text, "this host", None);
        assert!(!here.contains("UNIX"), "{here}");
        assert!(here.starts_with("TLS alert bad_certificate: invalid peer certificate: the certificate is not valid yet by the clock of this host: it is valid from Nov 27 22:00:00 2025 +00:00, 3 hours after that clock (Nov 27 19:00:00 2025 +00:00); so the clock of this host is behind the clock of the host that issued it by more than 3 hours"), "{here}");
        // Checked by the coordinator, whose clock is 5 hours behind ours.
        let there = explain_dates(&text, "the coordinator", Some(T as i64 + 5 * 3600));
        assert!(
            there.ends_with("; the clocks of this host and the coordinator differ by 5 hours: fix the wrong one (`timedatectl status` on both; NTP)"),
            "{there}"
        );
    }

    #[test]
    fn an_expired_certificate_is_said_in_dates_and_skew_only_when_clocks_differ() {
        let text = rustls_text(CertificateError::ExpiredContext {
            time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(T)),
            not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(T - 2 * 86_400)),
        });
        let same = explain_dates(&text, "the coordinator", Some(T as i64 + 5));
        assert_eq!(
            same,
            "invalid peer certificate: the certificate expired by the clock of the coordinator: it was valid until Nov 25 19:00:00 2025 +00:00, 2 days before that clock (Nov 27 19:00:00 2025 +00:00)"
        );
        let skewed = explain_dates(&text, "the coordinator", Some(T as i64 - 3 * 86_400));
        assert!(
            skewed.ends_with(
                "differ by 3 days: fix the wrong one (`timedatectl status` on both; NTP)"
            ),
            "{skewed}"
        );
        assert_eq!(explain_dates("unknown issuer", "x", None), "unknown issuer");
    }
}
