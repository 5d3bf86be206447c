//! Recording through the `metrics` facade: every series' key built once, and its handle
//! kept once registered with the process's global recorder.
//!
//! A recorder hands out a new handle per registration (Prometheus's exporter allocates
//! one), so registering on every event would cost an allocation and a locked map lookup
//! each time. Handles are kept only for the recorder that [`super::describe`] finds on a
//! thread of its own, which has no local recorder: the global one (never freed, so no
//! other recorder can later sit at its address). A zero-sized recorder has no address
//! of its own, so none is kept for it. Under any other recorder (a local one, or none
//! yet) every event registers as the `counter!` macro would.

use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder};

use super::*;

/// What the `counter!` and `histogram!` macros would pass.
static META: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The address of the recorder whose handles the tables keep, once
/// [`keep_handles`] found one.
static KEPT_FOR: OnceLock<usize> = OnceLock::new();

fn address(recorder: &dyn Recorder) -> usize {
    std::ptr::from_ref(recorder).cast::<()>() as usize
}

/// Finds the recorder a thread without a local recorder records to (the global one,
/// once installed) and keeps handles for it from now on.
pub(crate) fn keep_handles() {
    // A thread that cannot be started keeps nothing: every event registers, as before.
    let global = std::thread::scope(|s| {
        std::thread::Builder::new()
            .spawn_scoped(s, || {
                metrics::with_recorder(|r| (std::mem::size_of_val(r) > 0).then(|| address(r)))
            })
            .ok()?
            .join()
            .ok()
            .flatten()
    });
    if let Some(global) = global {
        // Set once: the global recorder never changes once installed.
        let _ = KEPT_FOR.set(global);
    }
}

/// The series of one metric: their keys, and the handles registered for them.
struct Table<H> {
    keys: Vec<Key>,
    handles: Box<[OnceLock<H>]>,
}

impl<H> Table<H> {
    fn new(keys: Vec<Key>) -> Self {
        let handles = keys.iter().map(|_| OnceLock::new()).collect();
        Self { keys, handles }
    }
}

impl<H: Handle> Table<H> {
    /// Runs `f` on the handle of series `at`: the kept one under the recorder handles
    /// are kept for, else one registered now.
    fn with(&self, at: usize, f: impl FnOnce(&H)) {
        metrics::with_recorder(|r| {
            if KEPT_FOR.get() == Some(&address(r)) {
                f(self.handles[at].get_or_init(|| H::register(r, &self.keys[at])));
            } else {
                f(&H::register(r, &self.keys[at]));
            }
        });
    }
}

/// A kind of handle a table keeps, and how a recorder registers one.
trait Handle {
    fn register(r: &dyn Recorder, key: &Key) -> Self;
}

impl Handle for Counter {
    fn register(r: &dyn Recorder, key: &Key) -> Self {
        r.register_counter(key, &META)
    }
}

impl Handle for Histogram {
    fn register(r: &dyn Recorder, key: &Key) -> Self {
        r.register_histogram(key, &META)
    }
}

/// The keys of `name` for every store, for every primitive if `by_primitive`, and
/// for every `values` of the label `other` if any, in that order of nesting (see
/// [`Series::index`]): built once, so recording one neither allocates nor hashes
/// its labels.
fn keys(
    name: &'static str,
    by_primitive: bool,
    other: Option<(&'static str, &[&'static str])>,
) -> Vec<Key> {
    let primitives: &[Primitive] = if by_primitive {
        &Primitive::ALL
    } else {
        &[Primitive::Lock]
    };
    let mut keys = Vec::new();
    for s in StoreKind::ALL {
        for p in primitives {
            let mut labels = vec![Label::new("store", s.label())];
            if by_primitive {
                labels.push(Label::new("primitive", p.label()));
            }
            match other {
                Some((other, values)) => keys.extend(values.iter().map(|v| {
                    let mut labels = labels.clone();
                    labels.push(Label::new(other, *v));
                    Key::from_parts(name, labels)
                })),
                None => keys.push(Key::from_parts(name, labels)),
            }
        }
    }
    keys
}

/// The keys of `name` with one label `label`, one per value.
fn outcome_keys(name: &'static str, label: &'static str, values: &[&'static str]) -> Vec<Key> {
    values
        .iter()
        .map(|v| Key::from_parts(name, vec![Label::new(label, *v)]))
        .collect()
}

static ACQUISITION_SERIES: LazyLock<Table<Counter>> = LazyLock::new(|| {
    Table::new(keys(
        ACQUISITIONS,
        true,
        Some(("outcome", &Acquired::ALL.map(Acquired::label))),
    ))
});
static WAIT_SERIES: LazyLock<Table<Histogram>> =
    LazyLock::new(|| Table::new(keys(WAIT, true, None)));
static RELEASE_SERIES: LazyLock<Table<Counter>> = LazyLock::new(|| {
    let results = ReleaseOutcome::ALL.map(ReleaseOutcome::label);
    Table::new(keys(RELEASES, true, Some(("result", &results))))
});
static HOLD_SERIES: LazyLock<Table<Histogram>> =
    LazyLock::new(|| Table::new(keys(HOLD, true, None)));
static LOST_SERIES: LazyLock<Table<Counter>> = LazyLock::new(|| Table::new(keys(LOST, true, None)));
static RENEWAL_SERIES: LazyLock<Table<Counter>> = LazyLock::new(|| {
    let results = Renewal::ALL.map(Renewal::label);
    Table::new(keys(RENEWALS, false, Some(("result", &results))))
});
static RENEWAL_CALL_SERIES: LazyLock<Table<Histogram>> =
    LazyLock::new(|| Table::new(keys(RENEWAL_LATENCY, false, None)));
static RATE_LIMIT_SERIES: LazyLock<Table<Counter>> = LazyLock::new(|| {
    let outcomes = RateOutcome::ALL.map(RateOutcome::label);
    Table::new(outcome_keys(RATE_LIMIT_DECISIONS, "outcome", &outcomes))
});
static IDEMPOTENCY_SERIES: LazyLock<Table<Counter>> = LazyLock::new(|| {
    let outcomes = IdempotencyOutcome::ALL.map(IdempotencyOutcome::label);
    Table::new(outcome_keys(IDEMPOTENCY_OUTCOMES, "outcome", &outcomes))
});

/// `ended`: when the wait ended, if already read (a fresh grant's arrival).
pub(crate) fn acquired(
    series: Series,
    outcome: Acquired,
    started: Instant,
    ended: Option<Instant>,
) {
    let at = series.index() * Acquired::ALL.len() + outcome as usize;
    ACQUISITION_SERIES.with(at, |c| c.increment(1));
    if matches!(
        outcome,
        Acquired::Granted | Acquired::Busy | Acquired::TimedOut
    ) {
        let waited = ended.map_or_else(|| started.elapsed(), |at| at - started);
        WAIT_SERIES.with(series.index(), |h| h.record(waited));
    }
}

pub(crate) fn released(series: Series, result: ReleaseOutcome) {
    let at = series.index() * ReleaseOutcome::ALL.len() + result as usize;
    RELEASE_SERIES.with(at, |c| c.increment(1));
}

/// A grant granted at `from` whose last hold was let go at `to`.
pub(crate) fn held(series: Series, from: Instant, to: Instant) {
    let held = to.saturating_duration_since(from);
    HOLD_SERIES.with(series.index(), |h| h.record(held));
}

pub(crate) fn renewed(store: StoreKind, result: Renewal, locks: u64) {
    let at = store as usize * Renewal::ALL.len() + result as usize;
    RENEWAL_SERIES.with(at, |c| c.increment(locks));
}

pub(crate) fn renewal_call(store: StoreKind, took: Duration) {
    RENEWAL_CALL_SERIES.with(store as usize, |h| h.record(took));
}

pub(crate) fn lost(series: Series) {
    LOST_SERIES.with(series.index(), |c| c.increment(1));
}

pub(crate) fn rate_limit(outcome: RateOutcome) {
    RATE_LIMIT_SERIES.with(outcome as usize, |c| c.increment(1));
}

pub(crate) fn idempotency(outcome: IdempotencyOutcome) {
    IDEMPOTENCY_SERIES.with(outcome as usize, |c| c.increment(1));
}
