//! Paged walks over one directory of the store, in key order, each one snapshot
//! ([`EtcdStore::scan`]): for reads that stop as soon as they have what they need (the
//! decision journal's), where [`EtcdStore::kv_list`] reads a whole directory.

use etcd_client::{GetOptions, KeyValue};
use serde::de::DeserializeOwned;

use super::kv::{Versioned, decode, range_end};
use super::{EtcdError, EtcdStore};

impl EtcdStore {
    /// A walk over the directory `rel` in pages, in key order, over the keys at or after
    /// `from` (relative to the directory) when given. Every page is read at the revision of
    /// the first, so the walk is one snapshot however long it takes; the caller stops when it
    /// has what it needs. Only upwards: etcd reads a whole range to sort it any other way.
    pub fn scan(&self, rel: &str, from: Option<&str>) -> Scan {
        let dir = self.dir_key(rel);
        let lo = match from {
            Some(f) => format!("{dir}{f}").into_bytes(),
            None => dir.as_bytes().to_vec(),
        };
        let hi = range_end(dir.as_bytes());
        Scan {
            store: self.clone(),
            dir,
            lo,
            hi,
            revision: 0,
            done: false,
        }
    }

    /// A walk like [`EtcdStore::scan`] over the keys from `from` (included) to `to`
    /// (excluded), both relative to the directory `rel`.
    pub fn scan_between(&self, rel: &str, from: &str, to: &str) -> Scan {
        let mut scan = self.scan(rel, Some(from));
        scan.hi = format!("{}{to}", scan.dir).into_bytes();
        scan
    }
}

/// A paged walk over one directory: [`EtcdStore::scan`].
#[derive(Debug)]
pub struct Scan {
    store: EtcdStore,
    dir: String,
    /// The range still to read: `[lo, hi)`.
    lo: Vec<u8>,
    hi: Vec<u8>,
    /// The revision every page is read at (0 until the first page).
    revision: i64,
    done: bool,
}

impl Scan {
    /// Reads at `revision` (0: at the first page's), so several walks make one snapshot.
    pub fn at_revision(mut self, revision: i64) -> Self {
        self.revision = revision;
        self
    }

    /// The revision the walk reads at (0 before its first page).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The next `limit` values (keys relative to the directory); empty when the walk is over.
    pub async fn next<T: DeserializeOwned>(
        &mut self,
        limit: i64,
    ) -> Result<Vec<(String, Versioned<T>)>, EtcdError> {
        let mut out = Vec::new();
        for kv in self.page(limit, false).await? {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let v = decode(&key, &kv)?;
            out.push((key[self.dir.len()..].to_string(), v));
        }
        Ok(out)
    }

    /// The next `limit` keys (relative to the directory), values not read.
    pub async fn next_keys(&mut self, limit: i64) -> Result<Vec<String>, EtcdError> {
        Ok(self
            .page(limit, true)
            .await?
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key()[self.dir.len()..]).into_owned())
            .collect())
    }

    async fn page(&mut self, limit: i64, keys_only: bool) -> Result<Vec<KeyValue>, EtcdError> {
        if self.done || self.lo >= self.hi {
            return Ok(Vec::new());
        }
        let mut opts = GetOptions::new()
            .with_range(self.hi.clone())
            .with_limit(limit.max(1))
            .with_revision(self.revision);
        if keys_only {
            opts = opts.with_keys_only();
        }
        let mut resp = self
            .store
            .range_page(&self.dir, self.lo.clone(), opts)
            .await?;
        if self.revision == 0 {
            self.revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        }
        let more = resp.more();
        let page = resp.take_kvs();
        if let Some(last) = page.last() {
            self.lo = last.key().to_vec();
            self.lo.push(0);
        }
        self.done = !more || page.is_empty();
        Ok(page)
    }
}
