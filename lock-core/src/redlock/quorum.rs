//! The Redlock arithmetic as pure functions (what N answers mean), and the one
//! fan-out helper every Redlock operation asks its nodes with.
//!
//! Kept apart from the I/O so that each rule is a table in the tests below.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::join_all;

use crate::client::config::drift;

/// Nodes that must agree out of `nodes`: a strict majority.
pub(crate) fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// What the answers to one acquire round mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// A quorum granted with `validity` left: the lock is ours for that long.
    Granted { validity: Duration },
    /// A quorum granted, but the round took the whole lease (less the drift).
    TooLate,
    /// The quorum was missed only because other owners hold copies: contention, as on
    /// one node (busy, or a timeout once the wait budget is spent).
    Contended,
    /// Too few nodes answered usefully (down, timed out, failing).
    NoQuorum,
}

/// Judges one acquire round over `nodes` nodes: `granted` copies granted, `busy` held
/// by other owners, `elapsed` from before the first request to the last answer.
/// Validity = lease - elapsed - drift (drift = lease / 100 + 2 ms).
pub(crate) fn acquire_verdict(
    nodes: usize,
    granted: usize,
    busy: usize,
    lease: Duration,
    elapsed: Duration,
) -> Acquired {
    let q = quorum(nodes);
    if granted >= q {
        return match lease.checked_sub(elapsed + drift(lease)) {
            Some(validity) if !validity.is_zero() => Acquired::Granted { validity },
            _ => Acquired::TooLate,
        };
    }
    if busy > 0 && granted + busy >= q {
        Acquired::Contended
    } else {
        Acquired::NoQuorum
    }
}

/// How long a quorum of copies is known to last: the quorum-th longest of the copies'
/// own validities, less `drift`; zero with fewer copies than the quorum.
pub(crate) fn quorum_validity(
    mut copies: Vec<Duration>,
    quorum: usize,
    drift: Duration,
) -> Duration {
    if quorum == 0 || copies.len() < quorum {
        return Duration::ZERO;
    }
    copies.sort_unstable_by(|a, b| b.cmp(a));
    copies[quorum - 1].saturating_sub(drift)
}

/// Whether an extension answered by `ok` nodes within `elapsed` gives `lease` on a
/// quorum of `nodes`.
pub(crate) fn extended(nodes: usize, ok: usize, lease: Duration, elapsed: Duration) -> bool {
    ok >= quorum(nodes) && elapsed + drift(lease) < lease
}

/// The answers to a release so far.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReleaseTally {
    /// Copies deleted.
    pub(crate) unlocked: usize,
    /// Copies already gone.
    pub(crate) expired: usize,
    /// Copies another owner holds now.
    pub(crate) taken: usize,
    /// Copies that failed or did not answer in time.
    pub(crate) failed: usize,
}

/// What a release's answers mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseVerdict {
    /// A quorum of copies was deleted (the lock is free).
    Unlocked,
    /// A quorum answered, some copies were already taken by another owner.
    NotOwner,
    /// A quorum answered, some copies had expired (none taken).
    Expired,
    /// Too few copies answered.
    NoQuorum,
}

impl ReleaseTally {
    fn answered(&self) -> usize {
        self.unlocked + self.expired + self.taken + self.failed
    }

    /// The verdict once it is certain, given `copies` released on `nodes` nodes: as
    /// soon as a quorum was unlocked, else once every copy answered.
    pub(crate) fn verdict(&self, nodes: usize, copies: usize) -> Option<ReleaseVerdict> {
        let q = quorum(nodes);
        if self.unlocked >= q {
            return Some(ReleaseVerdict::Unlocked);
        }
        if self.answered() < copies {
            return None;
        }
        let gone = self.expired + self.taken;
        Some(if gone > 0 && self.unlocked + gone >= q {
            if self.taken > 0 {
                ReleaseVerdict::NotOwner
            } else {
                ReleaseVerdict::Expired
            }
        } else {
            ReleaseVerdict::NoQuorum
        })
    }
}

/// Asks every item at once, each within `timeout` of the call; the answers in item
/// order, `None` for an item that had not answered by then (its future is dropped).
///
/// One timer serves the whole fan-out: every answer lands in its own slot, and what
/// has not answered when the time is up is left empty.
pub(crate) async fn each_within<I, F, Fut>(
    timeout: Duration,
    items: I,
    ask: F,
) -> Vec<Option<Fut::Output>>
where
    I: IntoIterator,
    F: FnMut(I::Item) -> Fut,
    Fut: Future,
{
    let asks: Vec<Fut> = items.into_iter().map(ask).collect();
    // A slot per item, each filled once, by its own future (a lock, not a `Cell`, so
    // that the fan-out's future stays `Send`).
    let slots: Vec<Mutex<Option<Fut::Output>>> = asks.iter().map(|_| Mutex::new(None)).collect();
    let fill = asks.into_iter().zip(&slots).map(|(f, slot)| async move {
        let answer = f.await;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(answer);
    });
    // Elapsed or not, each slot holds what answered in time.
    let _ = tokio::time::timeout(timeout, join_all(fill)).await;
    slots
        .into_iter()
        .map(|s| s.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn quorum_is_a_strict_majority() {
        for (nodes, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)] {
            assert_eq!(quorum(nodes), q, "{nodes} nodes");
        }
    }

    #[test]
    fn acquire_verdicts() {
        use Acquired::*;
        // lease 1000 ms: drift 12 ms.
        let lease = MS(1000);
        let table = [
            // nodes, granted, busy, elapsed, verdict
            (5, 3, 0, 10, Granted { validity: MS(978) }),
            (5, 5, 0, 0, Granted { validity: MS(988) }),
            (5, 3, 2, 987, Granted { validity: MS(1) }),
            (5, 3, 0, 988, TooLate),
            (5, 4, 0, 5000, TooLate),
            (5, 2, 1, 10, Contended),
            (5, 0, 3, 10, Contended),
            (5, 2, 0, 10, NoQuorum),
            (5, 1, 1, 10, NoQuorum),
            (5, 0, 0, 10, NoQuorum),
            (3, 2, 0, 10, Granted { validity: MS(978) }),
            (3, 1, 1, 10, Contended),
            (1, 1, 0, 10, Granted { validity: MS(978) }),
            (1, 0, 1, 10, Contended),
            (4, 2, 0, 10, NoQuorum),
            (4, 2, 1, 10, Contended),
        ];
        for (nodes, granted, busy, elapsed, want) in table {
            assert_eq!(
                acquire_verdict(nodes, granted, busy, lease, MS(elapsed)),
                want,
                "{nodes} nodes, {granted} granted, {busy} busy, {elapsed} ms"
            );
        }
    }

    #[test]
    fn validity_is_the_quorum_th_longest_copy_less_drift() {
        let table: [(&[u64], usize, u64, u64); 6] = [
            (&[500, 100, 300, 200, 400], 3, 10, 290),
            (&[500, 400, 300], 3, 0, 300),
            (&[500, 400], 3, 0, 0),
            (&[], 1, 0, 0),
            (&[5], 1, 10, 0),
            (&[900, 900, 0, 0, 0], 3, 0, 0),
        ];
        for (copies, q, drift, want) in table {
            let copies = copies.iter().copied().map(MS).collect();
            assert_eq!(quorum_validity(copies, q, MS(drift)), MS(want));
        }
    }

    #[test]
    fn extension_needs_a_quorum_in_time() {
        let lease = MS(1000); // drift 12 ms
        assert!(extended(5, 3, lease, MS(10)));
        assert!(!extended(5, 2, lease, MS(10)));
        assert!(extended(5, 3, lease, MS(987)));
        assert!(!extended(5, 3, lease, MS(988)));
        assert!(!extended(5, 5, lease, MS(2000)));
    }

    #[test]
    fn release_verdicts() {
        use ReleaseVerdict::*;
        let tally = |u, e, t, f| ReleaseTally {
            unlocked: u,
            expired: e,
            taken: t,
            failed: f,
        };
        // (tally, nodes, copies, verdict)
        let table = [
            (tally(3, 0, 0, 0), 5, 5, Some(Unlocked)),
            (tally(2, 0, 0, 0), 5, 5, None),
            (tally(2, 0, 0, 1), 5, 3, Some(NoQuorum)),
            (tally(1, 2, 0, 2), 5, 5, Some(Expired)),
            (tally(1, 1, 1, 2), 5, 5, Some(NotOwner)),
            (tally(0, 0, 3, 2), 5, 5, Some(NotOwner)),
            (tally(1, 1, 0, 3), 5, 5, Some(NoQuorum)),
            (tally(0, 0, 0, 5), 5, 5, Some(NoQuorum)),
            (tally(1, 0, 0, 0), 1, 1, Some(Unlocked)),
            (tally(0, 0, 1, 0), 1, 1, Some(NotOwner)),
            (tally(1, 1, 0, 0), 3, 3, None),
            (tally(1, 1, 0, 1), 3, 3, Some(Expired)),
        ];
        for (i, (t, nodes, copies, want)) in table.into_iter().enumerate() {
            assert_eq!(t.verdict(nodes, copies), want, "row {i}: {t:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_within_keeps_order_and_leaves_the_late_out() {
        let answers = each_within(MS(100), [30u64, 500, 10], |ms| async move {
            tokio::time::sleep(MS(ms)).await;
            ms
        })
        .await;
        assert_eq!(answers, [Some(30), None, Some(10)]);
    }
}
