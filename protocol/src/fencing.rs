//! Fencing tokens: the (store identity, epoch) a coordinator puts on every power request and
//! agent action, and the rule a gateway and an agent apply to them.
//!
//! A coordinator that leads holds an **epoch** that only grows for its store: on SQLite a
//! counter the coordinator bumps durably at each start, on etcd (with high availability) the
//! leader key's create revision. The hands (a bmc-gateway, a node-agent) keep the highest
//! epoch they have seen per store identity, durably, and refuse a lower one before acting:
//! a deposed coordinator that has not noticed yet cannot power off, power on, reboot or
//! restart anything once its successor has spoken to that hand.
//!
//! Tokens of different store identities are never compared: a restored store has a new
//! identity (and a test install next to production has its own), so each starts its own
//! history of epochs.
//!
//! Version: tokens travel only on connections whose hello spoke protocol version
//! [`FENCING_VERSION`] or later, as [`crate::gateway::FencedPowerRequest`] and
//! [`crate::actions::FencedActionRequest`]; a peer of an older release talks version 1 and
//! sends (and reads) the requests without a token. This module does no I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The first protocol version whose power requests and agent actions carry a token.
pub const FENCING_VERSION: u16 = 2;

/// How the detail of a refusal for an older epoch begins, in a gateway's
/// [`crate::gateway::PowerOutcome::Failed`] and an agent's
/// [`crate::actions::ActionStatus::Failed`].
pub const REFUSED_EPOCH: &str = "refused: epoch ";

/// Who sends a request, and in which term of leadership.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FencingToken {
    /// The coordinator's store identity (32 hex digits).
    pub store: String,
    /// The sender's epoch for that store: larger is newer.
    pub epoch: u64,
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "epoch {} of store {}", self.epoch, self.store)
    }
}

/// What [`Epochs::judge`] says about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The token's epoch is the highest seen for its store: act.
    Current,
    /// The token's epoch is higher than any seen for its store: record it durably, then
    /// act ([`Epochs::raise`]).
    Newer,
    /// The token's epoch is older than one seen: refuse, with these words.
    Older(String),
}

/// The highest epoch seen per store identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Epochs {
    highest: BTreeMap<String, u64>,
}

impl Epochs {
    /// No epoch seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// Judges `token` against what was seen. Pure: nothing is recorded.
    pub fn judge(&self, token: &FencingToken) -> Verdict {
        match self.highest.get(&token.store) {
            Some(&seen) if token.epoch < seen => Verdict::Older(refusal(token, seen)),
            Some(&seen) if token.epoch == seen => Verdict::Current,
            _ => Verdict::Newer,
        }
    }

    /// Records `epoch` for `store` when it is higher than the one kept; never lowers it.
    pub fn raise(&mut self, store: &str, epoch: u64) {
        let e = self.highest.entry(store.to_string()).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    /// The highest epoch seen for `store`.
    pub fn get(&self, store: &str) -> Option<u64> {
        self.highest.get(store).copied()
    }

    /// Every store identity with its highest epoch, sorted by identity.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.highest.iter().map(|(s, e)| (s.as_str(), *e))
    }

    /// The number of store identities seen.
    pub fn len(&self) -> usize {
        self.highest.len()
    }

    /// True when no epoch was seen.
    pub fn is_empty(&self) -> bool {
        self.highest.is_empty()
    }
}

/// The words of a refusal for `token` when `seen` is the highest epoch of its store.
pub fn refusal(token: &FencingToken, seen: u64) -> String {
    format!(
        "{REFUSED_EPOCH}{} is older than {seen} for store {}; a newer coordinator leads \
         (this request comes from a coordinator that lost the lead and has not noticed yet: \
         nothing was done)",
        token.epoch, token.store
    )
}

/// True when `detail` is a refusal for an older epoch ([`refusal`]).
pub fn is_refused_epoch(detail: &str) -> bool {
    detail.starts_with(REFUSED_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(store: &str, epoch: u64) -> FencingToken {
        FencingToken {
            store: store.into(),
            epoch,
        }
    }

    #[test]
    fn an_older_epoch_of_the_same_store_is_refused_and_others_are_not_compared() {
        let mut e = Epochs::new();
        assert_eq!(e.judge(&t("a", 41)), Verdict::Newer);
        e.raise("a", 42);
        assert_eq!(e.judge(&t("a", 42)), Verdict::Current);
        assert_eq!(e.judge(&t("a", 43)), Verdict::Newer);
        let Verdict::Older(words) = e.judge(&t("a", 41)) else {
            panic!("41 after 42 was not refused");
        };
        assert!(
            words.starts_with(
                "refused: epoch 41 is older than 42 for store a; a newer coordinator leads"
            ),
            "{words}"
        );
        assert!(is_refused_epoch(&words));
        // Another store's history is its own.
        assert_eq!(e.judge(&t("b", 1)), Verdict::Newer);
        // Raising never lowers.
        e.raise("a", 7);
        assert_eq!(e.get("a"), Some(42));
        assert_eq!(e.iter().collect::<Vec<_>>(), vec![("a", 42)]);
        assert_eq!(e.len(), 1);
        assert!(Epochs::new().is_empty());
    }

    #[test]
    fn a_token_reads_for_a_person() {
        assert_eq!(t("ab", 3).to_string(), "epoch 3 of store ab");
    }
}
