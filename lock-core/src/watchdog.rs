//! One renewal scheduler per client: renews every watched lock in batches (one script
//! call per batch) and fires the lost signal of any lock whose lease ran out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::client::Inner;
use crate::held::Held;
use crate::scripts::RENEW;

/// At most this many locks per renewal call, so one script never blocks Redis for long.
const MAX_BATCH: usize = 512;

#[derive(Debug, Default)]
pub(crate) struct Watchdog {
    wake: Arc<Notify>,
    /// When the scheduler plans to wake next (`None`: idle, or not started).
    planned: Mutex<Option<Instant>>,
    started: AtomicBool,
}

impl Watchdog {
    /// Makes sure the scheduler will look at a lock that needs attention at `due`.
    pub(crate) fn schedule(&self, inner: &Arc<Inner>, due: Instant) {
        let started_now = !self.started.swap(true, Ordering::AcqRel);
        if started_now {
            tokio::spawn(run(Arc::downgrade(inner), self.wake.clone()));
        }
        let planned = *self.planned.lock().unwrap_or_else(|e| e.into_inner());
        if started_now || planned.is_none_or(|p| due < p) {
            self.wake.notify_one();
        }
    }
}

impl Watchdog {
    pub(crate) fn stop(&self) {
        self.wake.notify_one();
    }
}

async fn run(client: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let next = tick(&inner).await;
        *inner
            .watchdog
            .planned
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = next;
        // Wait without keeping the client alive.
        let woken = wake.notified();
        drop(inner);
        match next {
            Some(at) => {
                tokio::select! {
                    _ = woken => {}
                    _ = tokio::time::sleep_until(at.into()) => {}
                }
            }
            None => woken.await,
        }
        if client.strong_count() == 0 {
            return;
        }
    }
}

/// One pass: fire lost signals, renew what is due; returns when to look again.
async fn tick(inner: &Arc<Inner>) -> Option<Instant> {
    let now = Instant::now();
    let period = inner.config.watchdog_period();
    let mut due = Vec::new();
    let mut next: Option<Instant> = None;
    let mut earliest = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
    for held in inner.registry.snapshot() {
        let mut st = held.state();
        if st.detached || st.holds == 0 {
            continue;
        }
        if now >= st.valid_until {
            drop(st);
            lose(inner, &held, "lease ran out before it was renewed");
            continue;
        }
        earliest(st.valid_until);
        if st.renew_until.is_some_and(|cap| now >= cap) {
            // Max hold reached: stop renewing, the lease runs out on its own.
            st.next_renewal = None;
        }
        if let Some(at) = st.next_renewal {
            // Renew a little early to batch with locks that are nearly due.
            if at <= now + period / 4 {
                due.push(held.clone());
            } else {
                earliest(at);
            }
        }
    }
    let batches = batches(&due, inner.conn.is_cluster());
    let renewals = batches.iter().map(|b| renew(inner, b, period));
    for at in futures_util::future::join_all(renewals)
        .await
        .into_iter()
        .flatten()
    {
        earliest(at);
    }
    if !due.is_empty() {
        // Renewed locks have new due times: compute them in the next pass.
        earliest(Instant::now());
    }
    next
}

/// Splits the due locks into script calls of at most [`MAX_BATCH`] keys; on a cluster,
/// one call per hash slot (a script's keys must share a slot), run in parallel.
fn batches(due: &[Arc<Held>], cluster: bool) -> Vec<Vec<Arc<Held>>> {
    if !cluster {
        return due.chunks(MAX_BATCH).map(<[_]>::to_vec).collect();
    }
    let mut by_slot: std::collections::BTreeMap<u16, Vec<Arc<Held>>> = Default::default();
    for held in due {
        by_slot
            .entry(crate::key::cluster_slot(&held.keys.hash))
            .or_default()
            .push(held.clone());
    }
    by_slot
        .into_values()
        .flat_map(|locks| {
            locks
                .chunks(MAX_BATCH)
                .map(<[_]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Renews one batch; on a Redis failure returns when to retry.
async fn renew(inner: &Arc<Inner>, batch: &[Arc<Held>], period: Duration) -> Option<Instant> {
    let start = Instant::now();
    let mut inv = RENEW.prepare_invoke();
    for held in batch {
        inv.key(&held.keys.hash);
    }
    for held in batch {
        inv.arg(&held.owner);
    }
    for held in batch {
        inv.arg(held.state().lease.as_millis() as u64);
    }
    match inner.conn.invoke::<Vec<i64>>("renew", &inv).await {
        Ok(results) if results.len() == batch.len() => {
            tracing::trace!(locks = batch.len(), "watchdog renewed");
            for (held, r) in batch.iter().zip(results) {
                match r {
                    1 => {
                        let mut st = held.state();
                        if !st.detached {
                            st.valid_until = start + st.lease;
                            st.next_renewal = st.next_renewal.map(|_| start + period);
                        }
                    }
                    0 => lose(inner, held, "lock expired before renewal"),
                    _ => lose(inner, held, "lock taken over by another owner"),
                }
            }
            None
        }
        outcome => {
            let why = match outcome {
                Err(e) => e.to_string(),
                Ok(r) => format!("{} results for {} locks", r.len(), batch.len()),
            };
            tracing::warn!(locks = batch.len(), error = %why, "watchdog renewal failed; retrying");
            let retry = start + (period / 4).min(Duration::from_secs(1));
            for held in batch {
                let mut st = held.state();
                if st.next_renewal.is_some() {
                    st.next_renewal = Some(retry);
                }
            }
            Some(retry)
        }
    }
}

fn lose(inner: &Inner, held: &Arc<Held>, why: &str) {
    inner.registry.detach(held);
    if held.mark_lost() {
        tracing::warn!(lock = %held.keys.name, owner = %held.owner, reason = why, "lock lost");
    }
}
