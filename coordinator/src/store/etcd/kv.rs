//! The key-value moves the etcd-backed areas are built from, each one bounded by the store's
//! request timeout and each read-modify-write a compare-and-swap.
//!
//! - [`EtcdStore::kv_get`] / [`EtcdStore::kv_list`]: one JSON value, or a directory's values in key
//!   order, read in pages at one revision (a consistent snapshot however large), each with
//!   its `mod_revision` ([`Versioned`]).
//! - [`Txn`]: compares (`mod_revision` equal, key absent) and writes in one etcd transaction;
//!   [`EtcdStore::kv_create`] (create-if-absent), [`EtcdStore::kv_put_if`] (compare-and-swap on
//!   `mod_revision`) and [`EtcdStore::kv_update`] (read, change, swap, retried on a lost race)
//!   are built on it.
//! - [`Sequence`]: an append-only numbered list with its write index, as CKE keeps its repair
//!   queue: appending compares the index's `mod_revision`, writes index + 1 and the item in
//!   one transaction, so two writers never get one number; with `keep`, the same transaction
//!   deletes the item that falls out, so a history stays bounded without a sweeper.
//!
//! Every write of the store goes through [`Txn`] (the helpers above and
//! [`EtcdStore::kv_delete_dir`] included), so a leader's fence ([`super::fence`]) is in each
//! one: its compare on the leader key's create revision is added at commit, and a commit
//! that failed on it (told apart from the write's own compares by reading the leader key in
//! the transaction's else branch) is [`EtcdError::Deposed`], which ends the term.
//!
//! Numbers in keys are zero-padded to 20 digits so that etcd's byte order is numeric order.
//! Not here: what any area stores.

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, TxnOp, TxnOpResponse, TxnResponse};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{EtcdError, EtcdStore};

/// The largest value this store writes. etcd refuses requests over 1.5 MiB by default
/// (`--max-request-bytes`); a transaction carries a value and its neighbours (an entry and a
/// history record), so half a mebibyte each leaves room. Diagnostics bundles (up to 256 KiB)
/// fit.
pub const MAX_VALUE_BYTES: usize = 512 * 1024;

/// How many keys one range request returns: 10,000 repair entries of about 600 bytes are
/// 6 MB, over gRPC's 4 MiB message limit, so directories are read in pages of 500 (about
/// 300 KB each).
const PAGE: i64 = 500;

/// How often a compare-and-swap is tried before [`EtcdError::Contended`]: one coordinator
/// writes each key, so a lost race is rare (a second tool writing); eight tries ride out a
/// burst without spinning on a real conflict.
const CAS_ATTEMPTS: u32 = 8;

/// A value with the revisions etcd keeps for its key.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// The revision of its last write: what a compare-and-swap compares.
    pub mod_revision: i64,
    /// The revision that created the key.
    pub create_revision: i64,
}

/// A key's number, zero-padded so that byte order is numeric order.
pub fn num_key(n: u64) -> String {
    format!("{n:020}")
}

/// The end of etcd's range for every key starting with `prefix` (the prefix with its last
/// byte incremented).
pub(super) fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

pub(super) fn decode<T: DeserializeOwned>(
    key: &str,
    kv: &KeyValue,
) -> Result<Versioned<T>, EtcdError> {
    let value = serde_json::from_slice(kv.value()).map_err(|source| EtcdError::Json {
        key: key.to_string(),
        source,
    })?;
    Ok(Versioned {
        value,
        mod_revision: kv.mod_revision(),
        create_revision: kv.create_revision(),
    })
}

fn encode<T: Serialize>(key: &str, value: &T) -> Result<Vec<u8>, EtcdError> {
    let bytes = serde_json::to_vec(value).map_err(|source| EtcdError::Json {
        key: key.to_string(),
        source,
    })?;
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(EtcdError::TooLarge {
            key: key.to_string(),
            size: bytes.len(),
            limit: MAX_VALUE_BYTES,
        });
    }
    Ok(bytes)
}

impl EtcdStore {
    /// The full key of the directory `rel`, with its trailing slash (`""`: the whole prefix).
    pub fn dir_key(&self, rel: &str) -> String {
        let rel = rel.trim_matches('/');
        if rel.is_empty() {
            format!("{}/", self.prefix())
        } else {
            format!("{}/{rel}/", self.prefix())
        }
    }

    /// One key's raw value (a linearizable read).
    pub(crate) async fn get_raw(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let mut resp = self
            .bounded("get", key, |c| {
                let mut kv = c.kv_client();
                async move { kv.get(key, None).await }
            })
            .await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// The JSON value at `rel`, with its revisions; `None` when the key is absent.
    pub async fn kv_get<T: DeserializeOwned>(
        &self,
        rel: &str,
    ) -> Result<Option<Versioned<T>>, EtcdError> {
        let key = self.key(rel);
        self.get_raw(&key)
            .await?
            .map(|kv| decode(&key, &kv))
            .transpose()
    }

    /// Every value under the directory `rel` (keys starting with `rel/`), in key order, with
    /// each key relative to the directory. Read in pages at one revision, so the listing is
    /// a snapshot even while others write.
    pub async fn kv_list<T: DeserializeOwned>(
        &self,
        rel: &str,
    ) -> Result<Vec<(String, Versioned<T>)>, EtcdError> {
        let dir = self.dir_key(rel);
        let mut out = Vec::new();
        for kv in self.range(&dir, false).await? {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let v = decode(&key, &kv)?;
            out.push((key[dir.len()..].to_string(), v));
        }
        Ok(out)
    }

    /// The last `limit` values under the directory `rel` in key order, last first (the
    /// newest of a numbered directory), with keys relative to the directory. etcd reads the
    /// whole directory to sort it this way: for small directories (a machine's own, the
    /// bounded fence flows), not for a long journal.
    pub async fn kv_list_last<T: DeserializeOwned>(
        &self,
        rel: &str,
        limit: u32,
    ) -> Result<Vec<(String, Versioned<T>)>, EtcdError> {
        let dir = self.dir_key(rel);
        let opts = GetOptions::new()
            .with_range(range_end(dir.as_bytes()))
            .with_sort(
                etcd_client::SortTarget::Key,
                etcd_client::SortOrder::Descend,
            )
            .with_limit(i64::from(limit));
        let mut resp = self.get_bounded("list", &dir, dir.as_bytes(), opts).await?;
        let mut out = Vec::new();
        for kv in resp.take_kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let v = decode(&key, &kv)?;
            out.push((key[dir.len()..].to_string(), v));
        }
        Ok(out)
    }

    /// How many keys are under the directory `rel` (values not read).
    pub async fn kv_count(&self, rel: &str) -> Result<i64, EtcdError> {
        let dir = self.dir_key(rel);
        let opts = GetOptions::new()
            .with_range(range_end(dir.as_bytes()))
            .with_count_only();
        let resp = self
            .get_bounded("count", &dir, dir.as_bytes(), opts)
            .await?;
        Ok(resp.count())
    }

    /// One etcd transaction as it is, under [`EtcdStore::bounded`]: [`Txn`]'s, with the
    /// fence added, and the election's own, which are not fenced (they make the leader key).
    pub(crate) async fn txn_raw(
        &self,
        key: &str,
        txn: etcd_client::Txn,
    ) -> Result<TxnResponse, EtcdError> {
        self.bounded("txn", key, |c| {
            let (mut kv, txn) = (c.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// One range read of the directory `dir` from `from` ([`super::scan`]'s pages).
    pub(super) async fn range_page(
        &self,
        dir: &str,
        from: Vec<u8>,
        opts: GetOptions,
    ) -> Result<etcd_client::GetResponse, EtcdError> {
        self.get_bounded("list", dir, &from, opts).await
    }

    /// A range read from `from` with `opts`, as [`EtcdStore::bounded`] runs it.
    async fn get_bounded(
        &self,
        op: &'static str,
        dir: &str,
        from: &[u8],
        opts: GetOptions,
    ) -> Result<etcd_client::GetResponse, EtcdError> {
        self.bounded(op, dir, |c| {
            let (mut kv, opts) = (c.kv_client(), opts.clone());
            async move { kv.get(from, Some(opts)).await }
        })
        .await
    }

    /// The keys under the directory `rel`, relative to it, in key order (values not read).
    pub async fn kv_keys(&self, rel: &str) -> Result<Vec<String>, EtcdError> {
        let dir = self.dir_key(rel);
        Ok(self
            .range(&dir, true)
            .await?
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key()[dir.len()..]).into_owned())
            .collect())
    }

    async fn range(&self, dir: &str, keys_only: bool) -> Result<Vec<KeyValue>, EtcdError> {
        let end = range_end(dir.as_bytes());
        let mut start = dir.as_bytes().to_vec();
        let mut at_revision = 0;
        let mut out = Vec::new();
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_revision(at_revision);
            if keys_only {
                opts = opts.with_keys_only();
            }
            let mut resp = self.get_bounded("list", dir, &start, opts).await?;
            if at_revision == 0 {
                at_revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = resp.more();
            let page = resp.take_kvs();
            if let Some(last) = page.last() {
                start = last.key().to_vec();
                start.push(0);
            }
            let empty = page.is_empty();
            out.extend(page);
            if !more || empty {
                return Ok(out);
            }
        }
    }

    /// etcd's current revision (which moves with every write anywhere in the cluster).
    pub async fn revision(&self) -> Result<i64, EtcdError> {
        let key = self.key("");
        let resp = self
            .get_bounded(
                "get",
                &key,
                key.as_bytes(),
                GetOptions::new().with_count_only(),
            )
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// A transaction on this store's keys.
    pub fn txn(&self) -> Txn {
        Txn {
            store: self.clone(),
            compares: Vec::new(),
            ops: Vec::new(),
            first_key: None,
        }
    }

    /// Writes `value` at `rel` only if the key does not exist; true when it was written.
    pub async fn kv_create<T: Serialize>(&self, rel: &str, value: &T) -> Result<bool, EtcdError> {
        self.txn().if_absent(rel).put(rel, value)?.commit().await
    }

    /// Writes `value` at `rel` only if the key's `mod_revision` is still `mod_revision`
    /// (compare-and-swap); true when it was written, false when someone wrote in between.
    pub async fn kv_put_if<T: Serialize>(
        &self,
        rel: &str,
        value: &T,
        mod_revision: i64,
    ) -> Result<bool, EtcdError> {
        self.txn()
            .if_mod_revision(rel, mod_revision)
            .put(rel, value)?
            .commit()
            .await
    }

    /// Reads `rel`, applies `f` to its value (`None` when absent) and writes the result with
    /// a compare-and-swap, again from a fresh read when another writer got in between.
    /// `f` returning `None` writes nothing. Returns what was written, or `None`.
    pub async fn kv_update<T, F>(&self, rel: &str, mut f: F) -> Result<Option<T>, EtcdError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(Option<T>) -> Option<T>,
    {
        for _ in 0..CAS_ATTEMPTS {
            let cur = self.kv_get::<T>(rel).await?;
            let rev = cur.as_ref().map(|v| v.mod_revision).unwrap_or(0);
            let Some(new) = f(cur.map(|v| v.value)) else {
                return Ok(None);
            };
            if self.kv_put_if(rel, &new, rev).await? {
                return Ok(Some(new));
            }
        }
        Err(EtcdError::Contended {
            key: self.key(rel),
            attempts: CAS_ATTEMPTS,
        })
    }

    /// Deletes every key under the directory `rel`; how many were deleted. A transaction
    /// like every write, so a leader's fence holds here too.
    pub async fn kv_delete_dir(&self, rel: &str) -> Result<i64, EtcdError> {
        let resp = self.txn().delete_dir(rel).run().await?;
        Ok(resp
            .map(|r| {
                r.op_responses()
                    .into_iter()
                    .map(|op| match op {
                        TxnOpResponse::Delete(d) => d.deleted(),
                        _ => 0,
                    })
                    .sum()
            })
            .unwrap_or(0))
    }
}

/// Compares and writes that commit together or not at all. Built with [`EtcdStore::txn`];
/// keys are relative to the store's prefix.
#[derive(Debug)]
pub struct Txn {
    store: EtcdStore,
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
    first_key: Option<String>,
}

impl Txn {
    fn note(&mut self, key: &str) {
        if self.first_key.is_none() {
            self.first_key = Some(key.to_string());
        }
    }

    /// Only if `rel`'s `mod_revision` is `rev` (0: only if it is absent).
    pub fn if_mod_revision(mut self, rel: &str, rev: i64) -> Self {
        let key = self.store.key(rel);
        self.note(&key);
        self.compares
            .push(Compare::mod_revision(key, CompareOp::Equal, rev));
        self
    }

    /// Only if `rel` does not exist.
    pub fn if_absent(mut self, rel: &str) -> Self {
        let key = self.store.key(rel);
        self.note(&key);
        self.compares
            .push(Compare::create_revision(key, CompareOp::Equal, 0));
        self
    }

    /// Only if `rel` exists.
    pub fn if_present(mut self, rel: &str) -> Self {
        let key = self.store.key(rel);
        self.note(&key);
        self.compares
            .push(Compare::create_revision(key, CompareOp::Greater, 0));
        self
    }

    /// Writes `value` (JSON) at `rel`.
    pub fn put<T: Serialize>(mut self, rel: &str, value: &T) -> Result<Self, EtcdError> {
        let key = self.store.key(rel);
        let bytes = encode(&key, value)?;
        self.note(&key);
        self.ops.push(TxnOp::put(key, bytes, None));
        Ok(self)
    }

    /// Deletes `rel` (nothing when absent).
    pub fn delete(mut self, rel: &str) -> Self {
        let key = self.store.key(rel);
        self.note(&key);
        self.ops.push(TxnOp::delete(key, None));
        self
    }

    /// Deletes every key under the directory `rel`.
    pub fn delete_dir(mut self, rel: &str) -> Self {
        let dir = self.store.dir_key(rel);
        self.note(&dir);
        self.ops.push(TxnOp::delete(
            dir,
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        ));
        self
    }

    /// Deletes every key from `from` (included) to `to` (excluded), both relative: a
    /// numbered directory's oldest items in one operation.
    pub fn delete_range(mut self, from: &str, to: &str) -> Self {
        let from = self.store.key(from);
        let to = self.store.key(to);
        self.note(&from);
        self.ops.push(TxnOp::delete(
            from,
            Some(etcd_client::DeleteOptions::new().with_range(to)),
        ));
        self
    }

    /// How many writes it holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when it holds no write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Commits: true when every compare held and the writes were made, false when one did
    /// not hold and nothing was written.
    pub async fn commit(self) -> Result<bool, EtcdError> {
        Ok(self.commit_at().await?.is_some())
    }

    /// Commits like [`Txn::commit`]; the revision it made (every key it wrote now has that
    /// `mod_revision`), or `None` when a compare did not hold.
    pub async fn commit_at(self) -> Result<Option<i64>, EtcdError> {
        Ok(self
            .run()
            .await?
            .map(|resp| resp.header().map(|h| h.revision()).unwrap_or(0)))
    }

    /// Sends the transaction, with the leader's fence when the store carries one; etcd's
    /// answer when every compare held, `None` when one of the transaction's own did not,
    /// [`EtcdError::Deposed`] when the fence did not (or the term was already over).
    async fn run(self) -> Result<Option<TxnResponse>, EtcdError> {
        let key = self.first_key.unwrap_or_default();
        let mut compares = self.compares;
        let mut otherwise = Vec::new();
        let fence = self.store.fence().cloned();
        if let Some(f) = &fence {
            f.term.check().map_err(|why| deposed(f, why, &key))?;
            compares.push(Compare::create_revision(
                f.key.clone(),
                CompareOp::Equal,
                f.epoch(),
            ));
            // Read back when a compare fails: which one it was is in the answer.
            otherwise.push(TxnOp::get(f.key.clone(), None));
        }
        let txn = etcd_client::Txn::new()
            .when(compares)
            .and_then(self.ops)
            .or_else(otherwise);
        let resp = self.store.txn_raw(&key, txn).await?;
        // A transaction that reached etcd's quorum (either branch) shows writes work.
        self.store.wrote();
        if resp.succeeded() {
            return Ok(Some(resp));
        }
        if let Some(f) = &fence {
            let holder = resp.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(g) => Some(g.kvs().first().map(|kv| kv.create_revision())),
                _ => None,
            });
            let why = match holder {
                Some(Some(epoch)) if epoch == f.epoch() => None,
                Some(Some(other)) => Some(format!(
                    "the leader key {} now has epoch {other}: another coordinator leads",
                    f.key
                )),
                Some(None) => Some(format!(
                    "the leader key {} is gone: its lease expired or was revoked",
                    f.key
                )),
                None => Some("etcd's answer did not show the leader key".to_string()),
            };
            if let Some(why) = why {
                f.term.end(why.clone());
                return Err(deposed(f, why, &key));
            }
        }
        Ok(None)
    }
}

pub(super) fn deposed(f: &super::fence::Fence, why: String, key: &str) -> EtcdError {
    EtcdError::Deposed {
        epoch: f.epoch(),
        why,
        key: key.to_string(),
        leader_key: f.key.clone(),
    }
}

/// An append-only numbered list under `items` with its write index at `index`: items are
/// `items/<n>` (n from 1, zero-padded), the index holds the next n. With `keep`, only the
/// newest `keep` items are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// The write index's key (relative).
    pub index: String,
    /// The items' directory (relative).
    pub items: String,
    /// How many items to keep (`None`: all).
    pub keep: Option<u64>,
}

impl Sequence {
    /// A sequence with its index at `index` and its items under `items`.
    pub fn new(index: impl Into<String>, items: impl Into<String>) -> Self {
        Self {
            index: index.into(),
            items: items.into(),
            keep: None,
        }
    }

    /// Keeping only the newest `n` items.
    pub fn keeping(mut self, n: u64) -> Self {
        self.keep = Some(n.max(1));
        self
    }

    /// Item `n`'s key (relative).
    pub fn item(&self, n: u64) -> String {
        format!("{}/{}", self.items, num_key(n))
    }

    /// Appends: `build(n, txn)` adds the item (and whatever else must commit with it) for
    /// number `n` to `txn`; the write index moves to `n + 1` in the same transaction, which
    /// commits only if nobody appended in between (else it is built again with the next
    /// number). Returns `n`.
    pub async fn append<F>(&self, store: &EtcdStore, mut build: F) -> Result<u64, EtcdError>
    where
        F: FnMut(u64, Txn) -> Result<Txn, EtcdError>,
    {
        for _ in 0..CAS_ATTEMPTS {
            let cur = store.kv_get::<u64>(&self.index).await?;
            let (n, rev) = cur.map(|v| (v.value, v.mod_revision)).unwrap_or((1, 0));
            let mut txn = store
                .txn()
                .if_mod_revision(&self.index, rev)
                .put(&self.index, &(n + 1))?;
            if let Some(keep) = self.keep
                && n > keep
            {
                txn = txn.delete(&self.item(n - keep));
            }
            let txn = build(n, txn)?;
            if txn.commit().await? {
                return Ok(n);
            }
        }
        Err(EtcdError::Contended {
            key: store.key(&self.index),
            attempts: CAS_ATTEMPTS,
        })
    }

    /// Appends `value` as the next item; its number.
    pub async fn push<T: Serialize>(&self, store: &EtcdStore, value: &T) -> Result<u64, EtcdError> {
        self.append(store, |n, txn| txn.put(&self.item(n), value))
            .await
    }

    /// The items kept, oldest first, with their numbers.
    pub async fn items<T: DeserializeOwned>(
        &self,
        store: &EtcdStore,
    ) -> Result<Vec<(u64, Versioned<T>)>, EtcdError> {
        let mut out = Vec::new();
        for (k, v) in store.kv_list::<T>(&self.items).await? {
            let n = k.parse::<u64>().map_err(|_| EtcdError::Json {
                key: store.key(&format!("{}/{k}", self.items)),
                source: serde::de::Error::custom("not a sequence number"),
            })?;
            out.push((n, v));
        }
        Ok(out)
    }

    /// The number the next item will get (1 when nothing was ever appended).
    pub async fn next(&self, store: &EtcdStore) -> Result<u64, EtcdError> {
        Ok(store
            .kv_get::<u64>(&self.index)
            .await?
            .map(|v| v.value)
            .unwrap_or(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_keys_sort_as_numbers() {
        let mut keys: Vec<String> = [10u64, 9, 100, 1].iter().map(|n| num_key(*n)).collect();
        keys.sort();
        assert_eq!(
            keys,
            [1u64, 9, 10, 100].map(num_key).to_vec(),
            "byte order is numeric order"
        );
    }

    #[test]
    fn a_directory_range_ends_past_every_key_under_it() {
        assert_eq!(range_end(b"/f/a/"), b"/f/a0".to_vec());
        assert_eq!(range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(range_end(b"\xff"), vec![0]);
    }

    /// The fence holds only if every write goes through [`Txn`]: no file of the coordinator
    /// but this one opens etcd's KV client, except the election, whose writes are the leader
    /// key itself (campaign, resign). A new area that wrote past `Txn` would write unfenced:
    /// this test names it.
    #[test]
    fn no_etcd_write_bypasses_the_fenced_transaction() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let allowed = [src.join("store/etcd/kv.rs"), src.join("ha/election.rs")];
        let mut files = Vec::new();
        walk(&src, &mut files);
        assert!(files.len() > 50, "found the sources: {}", files.len());
        let needle = ["kv_", "client()"].concat();
        let offenders: Vec<String> = files
            .iter()
            .filter(|f| !allowed.contains(f))
            .filter(|f| std::fs::read_to_string(f).unwrap().contains(&needle))
            .map(|f| f.display().to_string())
            .collect();
        assert!(
            offenders.is_empty(),
            "etcd's KV client used outside kv.rs (write through EtcdStore::txn so the \
             leader's fence is in it): {offenders:?}"
        );
    }

    #[test]
    fn a_value_too_large_for_etcd_is_refused_before_sending() {
        let big = "x".repeat(MAX_VALUE_BYTES);
        let e = encode("/fleetmend/k", &big).unwrap_err();
        assert!(
            matches!(e, EtcdError::TooLarge { .. }) && e.to_string().contains("/fleetmend/k"),
            "{e}"
        );
    }
}
