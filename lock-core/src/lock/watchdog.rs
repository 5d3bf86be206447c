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
//! end of the lease); entries are removed when a grant is released, so the queue is bounded
//! by what is held. The task and its renewals run on the process's background runtime
//! (`cleanup::background`), not on the caller's: a lock outlives the runtime it was
//! taken on (a client shared by several runtimes), and its renewals and lost signal
//! must go on. A renewal dropped before its reply puts its grants back in the queue.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::registry::{Grant, Loss, Registry};
use super::seam::{Held, Seam};
use crate::client::cleanup::{self, OnDrop};
use crate::metrics::{self, Renewal, StoreKind};

/// At most this many locks per renewal call, so one script never blocks Redis for long.
const MAX_BATCH: usize = 512;

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
    due: BTreeMap<Due, Weak<Grant<B>>>,
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
                    due: BTreeMap::new(),
                    planned: None,
                    latest: None,
                    task: None,
                }),
            }),
        }
    }

    /// (Re)places `grant` in the queue at its next due time, and makes sure the task
    /// runs and wakes for it.
    pub(crate) fn schedule(&self, grant: &Arc<Grant<B>>) {
        let mut q = self.shared.queue();
        self.shared.place_in(&mut q, grant);
        if q.task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let runtime = cleanup::background()
            .cloned()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        match runtime {
            Some(rt) => {
                let weak = Arc::downgrade(&self.shared);
                q.task = Some(rt.spawn(run(weak, self.shared.wake.clone())));
                self.shared.wake.notify_one();
            }
            None => tracing::warn!("lock watchdog: no tokio runtime to run on"),
        }
    }

    /// Takes `grant` out of the queue (released: it has ended, so it is not placed
    /// again). A grant never queued (a fixed lease) leaves the queue's lock alone.
    pub(crate) fn unschedule(&self, grant: &Grant<B>) {
        let Some(at) = grant.state().queued.take() else {
            return;
        };
        self.shared.queue().due.remove(&(at, grant.seq));
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
        let mut q = self.queue();
        let mut renew: Vec<Arc<Grant<B>>> = Vec::new();
        let mut reschedule: Vec<Arc<Grant<B>>> = Vec::new();
        // Everything due now, plus renewals due soon (batched with these).
        let candidates: Vec<(Due, Weak<Grant<B>>)> = q
            .due
            .range(..=(now + slack, u64::MAX))
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        for (at, weak) in candidates {
            let Some(grant) = weak.upgrade() else {
                q.due.remove(&at);
                continue;
            };
            let mut st = grant.state();
            if st.ended {
                q.due.remove(&at);
                st.queued = None;
                continue;
            }
            if now >= st.valid_until {
                q.due.remove(&at);
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
                q.due.remove(&at);
                st.queued = None;
                drop(st);
                renew.push(grant.clone());
                reschedule.push(grant);
            } else if at.0 <= now {
                // Due, but neither expired nor up for renewal (e.g. a renewal in
                // flight): move to its real next time.
                q.due.remove(&at);
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
        let next = match q.due.first_key_value() {
            Some(((at, _), _)) => Some(*at),
            None => q.latest.filter(|&at| at > now),
        };
        q.planned = next;
        next
    }

    /// Queues `grant` at its next due time (the task is running: it calls this).
    fn place(&self, grant: &Arc<Grant<B>>) {
        self.place_in(&mut self.queue(), grant);
    }

    fn place_in(&self, q: &mut Queue<B>, grant: &Arc<Grant<B>>) {
        let mut st = grant.state();
        if let Some(old) = st.queued.take() {
            q.due.remove(&(old, grant.seq));
        }
        if st.ended {
            return;
        }
        let due = match st.next_renewal {
            Some(at) if !st.renewing => at.min(st.valid_until),
            _ => st.valid_until,
        };
        st.queued = Some(due);
        drop(st);
        q.due.insert((due, grant.seq), Arc::downgrade(grant));
        q.latest = q.latest.max(Some(due));
        if q.planned.is_none_or(|p| due < p) {
            q.planned = Some(due);
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
                for (grant, outcome) in batch.iter().zip(answers) {
                    metrics::renewed(self.kind, renewal_outcome(&outcome), 1);
                    match outcome {
                        Ok(valid_until) => {
                            let mut st = grant.state();
                            st.renewing = false;
                            if st.lost.is_none() {
                                st.valid_until = st.valid_until.max(valid_until);
                                if st.next_renewal.is_some() {
                                    st.next_renewal = Some(sent + self.period);
                                }
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
