//! When certificates stop being valid, read from the certificates themselves, and how to
//! say it. Every Fleetmend certificate expires (a year by default, the CA in ten): past its
//! `notAfter` a component's every connection is refused, so each program says so ahead of
//! time (its log at start and reload, `coordinator check`) and the daemons export it for the
//! "expires soon" alerts.

use std::time::Duration;

use quinn::Connection;
use rustls_pki_types::CertificateDer;

use crate::identity::IdentityError;

/// Certificates that expire within this are said so (logs, `coordinator check`) and counted
/// in the metrics the "expires soon" alerts read: a month to renew and roll out.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// When our certificate and our CA stop being valid (their `notAfter`), seconds since the
/// Unix epoch. Past it every peer refuses us (our certificate) or everyone (the CA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// Our certificate (the leaf).
    pub certificate: i64,
    /// The CA file's first certificate to expire.
    pub ca: i64,
}

impl Expiry {
    /// What to say of these expiries at `now` (seconds since the Unix epoch): `None` when
    /// both are further away than [`EXPIRY_WARNING`].
    pub fn warning(&self, now: i64) -> Option<String> {
        let parts: Vec<String> = [("the certificate", self.certificate), ("the CA", self.ca)]
            .into_iter()
            .filter(|(_, t)| soon(*t, now))
            .map(|(what, t)| {
                let verb = if t < now { "expired" } else { "expires" };
                format!(
                    "{what} {verb} {} ({})",
                    expiry_distance(t, now),
                    expiry_date(t)
                )
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Expiry {
    /// A `check` command's words on these expiries at `now`: the warning with what to do
    /// (`renew`), or how far away both are.
    pub fn summary(&self, now: i64, renew: &str) -> String {
        match self.warning(now) {
            Some(w) => format!("RENEW: {w} ({renew})"),
            None => format!(
                "expires {}, the CA {}",
                expiry_distance(self.certificate, now),
                expiry_distance(self.ca, now),
            ),
        }
    }

    /// Appends the gauge `name` in Prometheus text format: one sample for our certificate
    /// (labelled `certificate="<own>"`) and one for the CA (`certificate="ca"`).
    pub fn render_metric(&self, out: &mut String, name: &str, help: &str, own: &str) {
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n\
             {name}{{certificate=\"{own}\"}} {}\n{name}{{certificate=\"ca\"}} {}",
            self.certificate, self.ca
        );
    }
}

/// Seconds since the Unix epoch, now: the clock every expiry is read against.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Whether `not_after` is within [`EXPIRY_WARNING`] of `now`, or past.
pub fn soon(not_after: i64, now: i64) -> bool {
    not_after.saturating_sub(now) < EXPIRY_WARNING.as_secs() as i64
}

/// When a DER certificate stops being valid (its `notAfter`), seconds since the Unix epoch.
pub fn not_after_from_cert_der(der: &[u8]) -> Result<i64, IdentityError> {
    use x509_parser::prelude::*;
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
    Ok(cert.validity().not_after.timestamp())
}

/// When the certificate the peer of an established connection presented expires (its
/// `notAfter`, seconds since the Unix epoch); `None` when it cannot be read.
pub fn peer_not_after(conn: &Connection) -> Option<i64> {
    let any = conn.peer_identity()?;
    let certs = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    not_after_from_cert_der(certs.first()?).ok()
}

/// `in 12 days` / `in 5 hours` / `3 days ago`: `not_after` seen from `now` (both seconds
/// since the Unix epoch), cut down to the unit.
pub fn expiry_distance(not_after: i64, now: i64) -> String {
    let d = not_after.saturating_sub(now);
    let (n, unit) = match d.unsigned_abs() {
        s if s >= 2 * 86_400 => (s / 86_400, "day"),
        s if s >= 2 * 3600 => (s / 3600, "hour"),
        s => (s / 60, "minute"),
    };
    let s = if n == 1 { "" } else { "s" };
    if d >= 0 {
        format!("in {n} {unit}{s}")
    } else {
        format!("{n} {unit}{s} ago")
    }
}

/// The date and time of `t` (seconds since the Unix epoch) as certificates print it,
/// `Nov 24 06:27:31 2027 +00:00`.
pub fn expiry_date(t: i64) -> String {
    x509_parser::time::ASN1Time::from_timestamp(t)
        .map(|a| a.to_string())
        .unwrap_or_else(|_| format!("{t} s after the epoch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    #[test]
    fn the_metric_has_one_sample_for_each_certificate() {
        let mut out = String::new();
        Expiry {
            certificate: 10,
            ca: 20,
        }
        .render_metric(&mut out, "x_expiry", "When.", "gateway");
        assert_eq!(
            out,
            "# HELP x_expiry When.\n# TYPE x_expiry gauge\nx_expiry{certificate=\"gateway\"} 10\nx_expiry{certificate=\"ca\"} 20\n"
        );
    }

    #[test]
    fn distances_read_in_the_largest_whole_unit() {
        assert_eq!(expiry_distance(1000 + 12 * DAY + 5, 1000), "in 12 days");
        assert_eq!(expiry_distance(1000 + 5 * 3600, 1000), "in 5 hours");
        assert_eq!(expiry_distance(1000 + 90, 1000), "in 1 minute");
        assert_eq!(expiry_distance(1000 + 30, 1000), "in 0 minutes");
        assert_eq!(expiry_distance(1000, 1000 + 3 * DAY), "3 days ago");
    }

    #[test]
    fn only_what_expires_within_a_month_is_said() {
        let now = 1_800_000_000;
        let far = Expiry {
            certificate: now + 300 * DAY,
            ca: now + 3000 * DAY,
        };
        assert_eq!(far.warning(now), None);
        let leaf_soon = Expiry {
            certificate: now + 12 * DAY,
            ..far
        };
        let w = leaf_soon.warning(now).unwrap();
        assert!(w.starts_with("the certificate expires in 12 days ("), "{w}");
        assert!(!w.contains("the CA"), "{w}");
        let both_gone = Expiry {
            certificate: now - 2 * DAY - 1,
            ca: now + 29 * DAY,
        };
        let w = both_gone.warning(now).unwrap();
        assert!(w.contains("the certificate expired 2 days ago"), "{w}");
        assert!(w.contains("; the CA expires in 29 days ("), "{w}");
    }

    #[cfg(feature = "pki")]
    #[test]
    fn a_certificate_gives_its_not_after() {
        let ca = crate::pki::Ca::generate("fleet.test").unwrap();
        let issued = ca
            .issue(
                crate::Role::Node,
                "n1",
                &crate::pki::IssueOptions {
                    validity_days: 40,
                    ..Default::default()
                },
            )
            .unwrap();
        use rustls_pki_types::pem::PemObject as _;
        let der = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let t = not_after_from_cert_der(&der).unwrap();
        assert!((t - (now + 40 * DAY)).abs() < 120, "{t} vs {now}");
        assert!(expiry_date(t).contains(' '), "{}", expiry_date(t));
    }
}
