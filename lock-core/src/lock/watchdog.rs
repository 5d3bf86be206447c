//! One lease scheduler per client: renews every watched grant in batches (one script
//! call per batch, per hash slot on a Cluster) and fires the lost signal of any of them
//! whose lease ran out by the local clock. A grant left to its fixed lease is not
//! queued: its end is read off the clock where it is asked for (`Core::schedule`).
//!
//! The scheduler never waits on Redis: renewals run as their own tasks, so a renewal
//! stuck on a paused server or a silent network cannot delay the lost signal, which
//! fires at the end of the lease the client can prove (`valid_until`), on the
//! scheduler's own timer. Each renewal call is bounded by the time left on the leases
//! it would extend.
//!
//! The queue holds one entry per renewed grant (its next due time: the renewal, or the
//! end of the lease), in two parts. Most grants are placed one period after they were
//! granted, no earlier than anything placed before them: they join the back of a line
//! kept in due order, and a release leaves its entry there (the grant's `queued` says
//! which entry is current), so taking and releasing a lock costs the queue one push.
//! Entries of grants gone are dropped from the front as others join, or as they come
//! due, and the line is compacted when it doubles, so it stays bounded by what is held.
//! A placement that would break the line's order (a grant renewed, a renewal retried
//! soon) goes in an ordered map instead, and is taken out when released.
//!
//! The task and its renewals run on the process's background runtime
//! (`cleanup::background`), not on the caller's: a lock outlives the runtime it was
//! taken on (a client shared by several runtimes), and its renewals and lost signal
//! must go on. A renewal dropped before its reply puts its grants back in the queue.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::registry::{Grant, Loss, Queued, Registry};
use super::seam::{Held, Seam};
use crate::client::cleanup::{self, OnDrop};
use crate::metrics::{self, Renewal, StoreKind};

/// At most this many locks per renewal call, so one script never blocks Redis for long.
const MAX_BATCH: usize = 512;

/// The line is compacted when it grows past twice its live entries, or this.
const MIN_COMPACT_AT: usize = 1024;

pub(crate) struct Watchdog<B: Seam> {
    shared: Arc<Shared<B>>,
}

struct Shared<B: Seam> {
    backend: Arc<B>,
    /// The `store` label of the connection's renewal calls.
    kind: StoreKind,
    registry: Arc<Registry<B>>,
    /// The lease renewals apply.
    lease: Duration,
    period: Duration,
    wake: Arc<Notify>,
    queue: Mutex<Queue<B>>,
}

/// When a grant is due, and its number (two grants may be due at one instant).
type Due = (Instant, u64);

struct Queue<B: Seam> {
    /// Entries in due order; those of released grants stay until they come due.
    line: VecDeque<(Due, Weak<Grant<B>>)>,
    /// Entries due before the line's last one.
    early: BTreeMap<Due, Weak<Grant<B>>>,
    /// When the line's length reaches this, it is compacted.
    compact_at: usize,
    /// When the task plans to wake next (`None`: idle).
    planned: Option<Instant>,
    /// The latest due time ever placed.
    latest: Option<Instant>,
    task: Option<JoinHandle<()>>,
}

impl<B: Seam> Watchdog<B> {
    pub(crate) fn new(backend: Arc<B>, registry: Arc<Registry<B>>) -> Self {
        let config = backend.config();
        let (kind, lease, period) = (
            backend.kind(),
            config.watchdog_lease,
            config.watchdog_period(),
        );
        Self {
            shared: Arc::new(Shared {
                backend,
                kind,
                registry,
                lease,
                period,
                wake: Arc::new(Notify::new()),
                queue: Mutex::new(Queue {
                    line: VecDeque::new(),
                    early: BTreeMap::new(),
                    compact_at: MIN_COMPACT_AT,
                    planned: None,
                    latest: None,
                    task: None,
                }),
            }),
        }
    }

    /// The renewal period.
    pub(crate) fn period(&self) -> Duration {
        self.shared.period
    }

    /// (Re)places `grant` in the queue at its next due time, and makes sure the task
    /// runs and wakes for it.
    pub(crate) fn schedule(&self, grant: &Arc<Grant<B>>) {
        let mut q = self.shared.queue();
        self.shared.place_in(&mut q, grant);
        if q.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        match cleanup::lasting_runtime() {
            Some(rt) => {
                let weak = Arc::downgrade(&self.shared);
                q.task = Some(rt.spawn(run(weak, self.shared.wake.clone())));
                self.shared.wake.notify_one();
            }
            None => tracing::warn!("lock watchdog: no tokio runtime to run on"),
        }
    }

    /// Takes `grant` out of the queue (released: it has ended, so it is not placed
    /// again). A grant never queued (a fixed lease), or queued in the line, leaves the
    /// queue's lock alone.
    pub(crate) fn unschedule(&self, grant: &Grant<B>) {
        let Some(Queued { at, in_line: false }) = grant.state().queued.take() else {
            return;
        };
        self.shared.queue().early.remove(&(at, grant.seq));
    }

    /// Entries in the queue, stale ones included.
    pub(crate) fn entries(&self) -> usize {
        let q = self.shared.queue();
        q.line.len() + q.early.len()
    }

    pub(crate) fn stop(&self) {
        self.shared.wake.notify_one();
    }
}

impl<B: Seam> Drop for Shared<B> {
    fn drop(&mut self) {
        // The task can no longer upgrade its handle: wake it so it sees that and exits.
        self.wake.notify_one();
    }
}

impl<B: Seam> Shared<B> {
    fn queue(&self) -> MutexGuard<'_, Queue<B>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One pass: fire lost signals, start the renewals that are due; returns when to
    /// look again.
    fn tick(self: &Arc<Self>) -> Option<Instant> {
        let now = Instant::now();
        let slack = self.period / 4;
        let horizon = (now + slack, u64::MAX);
        let mut q = self.queue();
        let mut renew: Vec<Arc<Grant<B>>> = Vec::new();
        let mut reschedule: Vec<Arc<Grant<B>>> = Vec::new();
        // Everything due now, plus renewals due soon (batched with these). The line's
        // entries are taken out as they are looked at; the map's only when done with.
        let mut candidates: Vec<(Due, Weak<Grant<B>>, bool)> = q
            .early
            .range(..=horizon)
            .map(|(k, v)| (*k, v.clone(), false))
            .collect();
        while q.line.front().is_some_and(|(at, _)| *at <= horizon) {
            if let Some((at, weak)) = q.line.pop_front() {
                candidates.push((at, weak, true));
            }
        }
        for (at, weak, in_line) in candidates {
            let current = Some(Queued { at: at.0, in_line });
            let Some(grant) = weak.upgrade() else {
                q.forget(at, in_line);
                continue;
            };
            let mut st = grant.state();
            if in_line && st.queued != current {
                // Released, or placed again since: a stale entry.
                continue;
            }
            if st.ended {
                q.forget(at, in_line);
                st.queued = None;
                continue;
            }
            if now >= st.valid_until {
                q.forget(at, in_line);
                st.queued = None;
                drop(st);
                if self.registry.lose(&grant, Loss::Expired) {
                    tracing::warn!(lock = %grant.keys.name(), "lock lost: its lease ran out before a renewal confirmed more");
                }
                continue;
            }
            if st.renew_until.is_some_and(|cap| now >= cap) {
                // Max hold reached: stop renewing, the lease runs out on its own.
                st.next_renewal = None;
            }
            let renewal_due = !st.renewing && st.next_renewal.is_some_and(|r| r <= now + slack);
            if renewal_due {
                st.renewing = true;
                q.forget(at, in_line);
                st.queued = None;
                drop(st);
                renew.push(grant.clone());
                reschedule.push(grant);
            } else if at.0 <= now || in_line {
                // Due, but neither expired nor up for renewal (e.g. a renewal in
                // flight), or taken out of the line before its time: placed again, at
                // its real next time.
                q.forget(at, in_line);
                st.queued = None;
                drop(st);
                reschedule.push(grant);
            }
        }
        drop(q);
        for grant in &reschedule {
            self.place(grant);
        }
        if !renew.is_empty() {
            for batch in self.batches(renew) {
                let shared = self.clone();
                tokio::spawn(async move { shared.renew(batch).await });
            }
        }
        let mut q = self.queue();
        // With nothing queued, the task still looks again when the latest grant placed
        // would have been due: a grant placed after it with no shorter lease is due
        // later, so it needs no wake-up (a client taking and releasing one lock after
        // another would otherwise wake this task every time).
        let first = [
            q.line.front().map(|e| e.0.0),
            q.early.first_key_value().map(|e| e.0.0),
        ];
        let next = first
            .into_iter()
            .flatten()
            .min()
            .or(q.latest.filter(|&at| at > now));
        q.planned = next;
        next
    }

    /// Queues `grant` at its next due time (the task is running: it calls this).
    fn place(&self, grant: &Arc<Grant<B>>) {
        self.place_in(&mut self.queue(), grant);
    }

    fn place_in(&self, q: &mut Queue<B>, grant: &Arc<Grant<B>>) {
        let mut st = grant.state();
        let at = match st.next_renewal {
            _ if st.ended => None,
            Some(at) if !st.renewing => Some(at.min(st.valid_until)),
            _ => Some(st.valid_until),
        };
        if at.is_some() && st.queued.map(|q| q.at) == at {
            // Queued there already (a hold re-entering a watched grant).
            return;
        }
        if let Some(Queued { at, in_line: false }) = st.queued.take() {
            q.early.remove(&(at, grant.seq));
        }
        let Some(at) = at else {
            return;
        };
        let due = (at, grant.seq);
        let in_line = q.line.back().is_none_or(|(last, _)| *last <= due);
        st.queued = Some(Queued { at, in_line });
        drop(st);
        if in_line {
            // Grants mostly end in the order they were placed: the entries of those
            // gone at the front go now, so that their memory is freed while it is
            // still warm rather than a thousand at a time.
            let mut dropped = 0;
            while dropped < 2 && q.line.front().is_some_and(|(_, w)| w.strong_count() == 0) {
                q.line.pop_front();
                dropped += 1;
            }
            q.line.push_back((due, Arc::downgrade(grant)));
            if q.line.len() >= q.compact_at {
                q.compact();
            }
        } else {
            q.early.insert(due, Arc::downgrade(grant));
        }
        q.latest = q.latest.max(Some(at));
        if q.planned.is_none_or(|p| at < p) {
            q.planned = Some(at);
            self.wake.notify_one();
        }
    }

    /// Splits the due grants into script calls of at most [`MAX_BATCH`] keys, one group
    /// per hash slot on a Cluster (a script's keys must share a slot).
    fn batches(&self, due: Vec<Arc<Grant<B>>>) -> Vec<Vec<Arc<Grant<B>>>> {
        let mut by_group: BTreeMap<u16, Vec<Arc<Grant<B>>>> = BTreeMap::new();
        for grant in due {
            by_group
                .entry(self.backend.group(&grant.keys.key))
                .or_default()
                .push(grant);
        }
        let mut out = Vec::new();
        for (_, mut grants) in by_group {
            while grants.len() > MAX_BATCH {
                let rest = grants.split_off(MAX_BATCH);
                out.push(std::mem::replace(&mut grants, rest));
            }
            out.push(grants);
        }
        out
    }

    /// Renews one batch; the call is bounded by the longest lease left in it.
    async fn renew(self: Arc<Self>, batch: Vec<Arc<Grant<B>>>) {
        let sent = Instant::now();
        // The store never shortens a lease, so the watchdog lease is safe to send
        // whatever longer lease a grant's other holds were told.
        let lease = self.lease;
        let left = batch
            .iter()
            .map(|g| g.state().valid_until.saturating_duration_since(sent))
            .max()
            .unwrap_or_default();
        let unanswered = OnDrop::new(|| self.retry_soon(&batch));
        let grants: Vec<_> = batch.iter().map(|g| (&*g.keys, &g.record)).collect();
        let within = left.max(Duration::from_millis(1));
        let reply = self.backend.renew(&grants, lease, within).await;
        unanswered.disarm();
        metrics::renewal_call(self.kind, sent.elapsed());
        match reply {
            Ok(answers) => {
                tracing::trace!(locks = batch.len(), "watchdog renewed");
                for (grant, answer) in batch.iter().zip(answers) {
                    let outcome = match answer {
                        Ok(outcome) => outcome,
                        Err(e) => {
                            // This grant alone: the others' answers stand.
                            tracing::warn!(lock = %grant.keys.name(), error = %e, "watchdog renewal failed; retrying");
                            metrics::renewed(self.kind, Renewal::Error, 1);
                            self.retry_soon(std::slice::from_ref(grant));
                            continue;
                        }
                    };
                    {
                        let mut st = grant.state();
                        if st.ended {
                            // Released (or lost) while this renewal was asked: its answer
                            // says nothing of a hold, and is not counted as a renewal's
                            // outcome. A release answers for itself.
                            st.renewing = false;
                            drop(st);
                            self.place(grant);
                            continue;
                        }
                    }
                    metrics::renewed(self.kind, renewal_outcome(&outcome), 1);
                    match outcome {
                        Ok(valid_until) => {
                            let mut st = grant.state();
                            st.renewing = false;
                            if !grant.lengthen(&mut st, valid_until) {
                                drop(st);
                                if self.registry.lose(grant, Loss::Expired) {
                                    tracing::warn!(lock = %grant.keys.name(), "lock lost: renewed only after its lease ran out");
                                }
                            } else if st.lost.is_none() && st.next_renewal.is_some() {
                                st.next_renewal = Some(sent + self.period);
                            }
                        }
                        Err(Loss::TakenOver) => {
                            grant.state().renewing = false;
                            if self.registry.lose(grant, Loss::TakenOver) {
                                tracing::warn!(lock = %grant.keys.name(), "lock lost: taken over by another owner");
                            }
                        }
                        Err(Loss::Expired) => {
                            grant.state().renewing = false;
                            if self.registry.lose(grant, Loss::Expired) {
                                tracing::warn!(lock = %grant.keys.name(), "lock lost: it expired before renewal");
                            }
                        }
                    }
                    self.place(grant);
                }
            }
            Err(e) => {
                tracing::warn!(locks = batch.len(), error = %e, "watchdog renewal failed; retrying");
                metrics::renewed(self.kind, Renewal::Error, batch.len() as u64);
                self.retry_soon(&batch);
            }
        }
    }

    /// A renewal of `batch` failed or never finished: try again soon.
    fn retry_soon(&self, batch: &[Arc<Grant<B>>]) {
        let retry = Instant::now() + (self.period / 4).min(Duration::from_secs(1));
        for grant in batch {
            let mut st = grant.state();
            st.renewing = false;
            if st.next_renewal.is_some() {
                st.next_renewal = Some(retry);
            }
            drop(st);
            self.place(grant);
        }
    }
}

impl<B: Seam> Queue<B> {
    /// Takes out the entry at `at` that the tick looked at (one of the line's is out
    /// already).
    fn forget(&mut self, at: Due, in_line: bool) {
        if !in_line {
            self.early.remove(&at);
        }
    }

    /// Drops the line's stale entries (released grants, or placed again since), and
    /// lets it grow to twice what is left before the next compaction.
    fn compact(&mut self) {
        self.line.retain(|(at, weak)| {
            weak.upgrade().is_some_and(|grant| {
                grant.state().queued
                    == Some(Queued {
                        at: at.0,
                        in_line: true,
                    })
            })
        });
        self.compact_at = (2 * self.line.len()).max(MIN_COMPACT_AT);
    }
}

async fn run<B: Seam>(shared: Weak<Shared<B>>, wake: Arc<Notify>) {
    loop {
        let Some(s) = shared.upgrade() else {
            return;
        };
        let next = s.tick();
        // Wait without keeping the client alive.
        drop(s);
        match next {
            Some(at) => {
                tokio::select! {
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// The metrics label of a renewal's answer for one lock.
fn renewal_outcome(reply: &Held<Instant>) -> Renewal {
    match reply {
        Ok(_) => Renewal::Renewed,
        Err(Loss::Expired) => Renewal::Expired,
        Err(Loss::TakenOver) => Renewal::NotOwner,
    }
}
