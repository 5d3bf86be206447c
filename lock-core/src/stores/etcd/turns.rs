//! Turns within one client: etcd's layout gives a client one contender key per lock
//! (`<prefix>/<lease id>`), so two scopes of one client asking for the same lock
//! would share that key and both think they hold it. A scope takes the name's turn
//! here first, and keeps it until its key is deleted (given back, or found gone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

type Names = Arc<Mutex<HashMap<String, Arc<Semaphore>>>>;

/// One semaphore of one permit per lock name in use (held or waited for); a name's
/// entry goes with its last user, so the table stays as small as what is in use.
#[derive(Debug, Default)]
pub(super) struct Turns {
    names: Names,
}

/// The turn of one scope on one name; dropped, it passes to the next.
#[derive(Debug)]
pub(crate) struct Turn {
    names: Names,
    name: String,
    semaphore: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
}

fn lock(names: &Names) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Semaphore>>> {
    // Only inserts, removals and clones happen under it: nothing is left half-done.
    names.lock().unwrap_or_else(|p| p.into_inner())
}

impl Turns {
    /// This client's turn on `name`, waiting up to `wait` (zero: only if free now);
    /// `None` if another scope of this client keeps it that long.
    pub(super) async fn take(&self, name: &str, wait: Duration) -> Option<Turn> {
        let semaphore = lock(&self.names)
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(1)))
            .clone();
        // Leaves the table as it found it if the wait fails or is cancelled.
        let mut turn = Turn {
            names: self.names.clone(),
            name: name.to_owned(),
            semaphore: semaphore.clone(),
            permit: None,
        };
        turn.permit = if wait.is_zero() {
            semaphore.try_acquire_owned().ok()
        } else {
            tokio::time::timeout(wait, semaphore.acquire_owned())
                .await
                .ok()
                .and_then(Result::ok)
        };
        turn.permit.is_some().then_some(turn)
    }

    /// How many names are in use (held or waited for).
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.names).len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.permit = None;
        let mut names = lock(&self.names);
        // The table's and ours: nobody else holds or waits for the name.
        if Arc::strong_count(&self.semaphore) == 2 {
            names.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_scope_at_a_time_and_the_table_empties() {
        let turns = Turns::default();
        let first = turns.take("a", Duration::ZERO).await.expect("free");
        assert!(turns.take("a", Duration::ZERO).await.is_none());
        assert!(
            turns.take("a", Duration::from_millis(20)).await.is_none(),
            "a wait ends at its budget"
        );
        let other = turns.take("b", Duration::ZERO).await.expect("another name");
        assert_eq!(turns.len(), 2);
        let waiting = {
            let names = turns.names.clone();
            tokio::spawn(async move {
                let turns = Turns { names };
                turns.take("a", Duration::from_secs(5)).await.is_some()
            })
        };
        tokio::task::yield_now().await;
        drop(first);
        assert!(waiting.await.unwrap(), "the waiter got the turn");
        drop(other);
        assert_eq!(turns.len(), 0, "entries outlived their users");
    }

    /// A waiter cancelled after the holder let go, before it was polled again: the
    /// last of them to go takes the entry, whichever it is.
    #[tokio::test]
    async fn a_wait_cancelled_as_the_turn_passes_leaves_nothing_behind() {
        let turns = Turns::default();
        let held = turns.take("a", Duration::ZERO).await.unwrap();
        let waiter = {
            let names = turns.names.clone();
            tokio::spawn(async move {
                let turns = Turns { names };
                turns.take("a", Duration::from_secs(5)).await.is_some()
            })
        };
        tokio::task::yield_now().await;
        drop(held);
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert_eq!(turns.len(), 0, "the name outlived its users");
    }

    #[tokio::test]
    async fn a_cancelled_wait_leaves_nothing_behind() {
        let turns = Turns::default();
        let held = turns.take("a", Duration::ZERO).await.unwrap();
        let cut = tokio::time::timeout(
            Duration::from_millis(10),
            turns.take("a", Duration::from_secs(5)),
        )
        .await;
        assert!(cut.is_err());
        drop(held);
        assert_eq!(turns.len(), 0);
    }
}
