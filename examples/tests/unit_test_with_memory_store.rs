//! How a user unit-tests their own lock-using code without any server: write it against
//! the `DistributedLock` trait, and hand it `MemoryLocks` in tests (a `LockClient`,
//! `Redlock`, `AnyLocks` or a database store in production). Leases follow tokio's
//! clock, so `start_paused = true` makes the test deterministic and instant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{DistributedLock, HeldLock, Lease, LockError, LockOptions, MemoryLocks};

/// The user's code: books a seat once, whoever else tries at the same time.
mod booking {
    use super::*;

    /// Who holds which seat (a database table in the real service).
    pub(crate) type Seats = Arc<Mutex<HashMap<u32, String>>>;

    /// Books `seat` for `user` under the seat's lock: `Ok(true)` if it was free,
    /// `Ok(false)` if someone has it, `Err(busy)` if another booking of it is running.
    pub(crate) async fn book<L: DistributedLock>(
        locks: &L,
        seats: &Seats,
        seat: u32,
        user: &str,
        work: Duration,
    ) -> Result<bool, LockError> {
        let options = LockOptions::new()
            .lease(Lease::Fixed(Duration::from_secs(10)))
            .wait(Duration::ZERO);
        let guard = locks.acquire(("seat", seat), options).await?;
        let free = !seats.lock().unwrap().contains_key(&seat);
        // The payment provider, say: the seat stays locked meanwhile.
        tokio::time::sleep(work).await;
        if free && guard.is_held() {
            seats.lock().unwrap().insert(seat, user.to_owned());
        }
        guard.release().await?;
        Ok(free)
    }
}

#[tokio::test(start_paused = true)]
async fn a_seat_is_booked_once_by_concurrent_users() {
    let locks = MemoryLocks::new();
    let seats = booking::Seats::default();
    let (alice, bob) = tokio::join!(
        booking::book(&locks, &seats, 12, "alice", Duration::from_secs(2)),
        booking::book(&locks, &seats, 12, "bob", Duration::from_secs(2)),
    );
    // One of them books it; the other is refused while the first one runs.
    let (won, lost) = match (&alice, &bob) {
        (Ok(true), Err(e)) | (Err(e), Ok(true)) => (alice.is_ok(), e),
        other => panic!("expected one booking and one busy, got {other:?}"),
    };
    assert!(lost.is_busy());
    let winner = if won { "alice" } else { "bob" };
    assert_eq!(
        seats.lock().unwrap().get(&12).map(String::as_str),
        Some(winner)
    );

    // Once released, a later attempt sees the seat taken, and another seat is free.
    let late = booking::book(&locks, &seats, 12, "carol", Duration::ZERO).await;
    assert!(matches!(late, Ok(false)), "{late:?}");
    let other = booking::book(&locks, &seats, 13, "carol", Duration::ZERO).await;
    assert!(matches!(other, Ok(true)), "{other:?}");
}

#[tokio::test(start_paused = true)]
async fn a_crashed_booking_frees_the_seat_when_its_lease_ends() {
    let locks = MemoryLocks::new();
    let seats = booking::Seats::default();
    // A booking that never finishes (its process died): its lock stays until the lease.
    let stuck = locks
        .acquire(
            ("seat", 7),
            LockOptions::new().lease(Lease::Fixed(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    stuck.hold_until_expiry();
    let refused = booking::book(&locks, &seats, 7, "dave", Duration::ZERO).await;
    assert!(
        refused.as_ref().is_err_and(LockError::is_busy),
        "{refused:?}"
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    let booked = booking::book(&locks, &seats, 7, "dave", Duration::ZERO).await;
    assert!(matches!(booked, Ok(true)), "{booked:?}");
}
