//! `RLock`: the plain lock.

use std::time::Duration;

use lock_core::{LockOptions, LockScope, RedissonLocks, Released};
use lock_tests::RedisServer;

use super::grants::{Kind, call};
use super::{Java, Listener, client, hash, locks};
use crate::checks;
use crate::common::{client_commands_on, pttl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_holder_excludes_ours_and_its_unlock_wakes_our_waiter() {
    let server = RedisServer::start();
    let client = client(&server).await;
    let locks = RedissonLocks::new(&client);
    let mut java = Java::new(&server).await;
    assert_eq!(java.lock("order:42", 1).await, None, "free");
    // Re-entered on the Java side: two holds, the first unlock leaves it held.
    assert_eq!(java.lock("order:42", 1).await, None, "re-entered");

    let err = locks.try_lock(("order", 42_u64)).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    let waiter = checks::waiting(&locks, ("order", 42_u64), LockOptions::new());
    assert_eq!(java.unlock("order:42", 1).await, Some(0), "one hold left");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "granted beside a Java hold");
    assert_eq!(java.unlock("order:42", 1).await, Some(1), "unlocked");
    let g = checks::granted(waiter, "woken by Redisson's unlock message").await;

    // What Redisson reads: our hold is one count of the field <uuid>:<thread id>.
    let field = g.field().to_owned();
    assert_eq!(
        hash(&server, "order:42").await,
        vec![(field.clone(), "1".into())]
    );
    let (uuid, thread) = field.rsplit_once(':').unwrap();
    assert_eq!(uuid.len(), 36, "a UUID: {uuid}");
    assert_eq!(
        uuid.replace('-', ""),
        client.id().to_hex(),
        "the client's id"
    );
    assert!(thread.parse::<u64>().is_ok(), "a thread id: {thread}");
    let ttl = pttl(&server, "order:42").await;
    assert!(
        ttl > 25_000,
        "the watchdog's 30 s lease, as Redisson's: {ttl}"
    );
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    assert!(hash(&server, "order:42").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_excludes_a_redisson_contender_and_our_unlock_wakes_it() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    let mut channel = Listener::on(&server, "redisson_lock__channel:{order:42}").await;

    let g = locks.lock(("order", 42_u64)).await.unwrap();
    let ttl = java
        .lock("order:42", 1)
        .await
        .expect("busy: Redisson waits its PTTL");
    assert!(ttl > 0, "{ttl}");
    assert!(
        java.unlock("order:42", 1).await.is_none(),
        "not the Java thread's"
    );
    assert!(g.is_held());
    g.release().await.unwrap();
    assert_eq!(
        channel.next("our unlock").await,
        "0",
        "Redisson's unlock message"
    );
    assert_eq!(
        java.lock("order:42", 1).await,
        None,
        "the woken Java waiter takes it"
    );
    assert_eq!(java.unlock("order:42", 1).await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_scopes_are_redisson_threads_and_reenter_in_the_client() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let scope = LockScope::new();
    let opts = || LockOptions::new().scope(&scope).wait(Duration::ZERO);
    let outer = locks.acquire("doc", opts()).await.unwrap();
    let inner = locks.acquire("doc", opts()).await.unwrap();
    let field = outer.field().to_owned();
    assert!(field.ends_with(&format!(":{}", scope.id())), "{field}");
    // One grant: the hash counts one hold of it, re-entries count in the client.
    assert_eq!(hash(&server, "doc").await, vec![(field, "1".into())]);
    let other = locks.try_lock("doc").await.unwrap_err();
    assert!(other.is_busy(), "{other}");
    assert!(matches!(
        inner.release().await.unwrap(),
        Released::StillHeld { .. }
    ));
    assert_eq!(outer.release().await.unwrap(), Released::Unlocked);
    assert!(hash(&server, "doc").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_count_in_redissons_fenced_lock_counter() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut c = server.connection().await;
    // A Java RFencedLock took tokens up to 41.
    let _: () = redis::cmd("SET")
        .arg("redisson_lock_token:{ledger}")
        .arg(41)
        .query_async(&mut c)
        .await
        .unwrap();
    let g = locks
        .acquire("ledger", LockOptions::new().fenced())
        .await
        .unwrap();
    assert_eq!(g.fencing_token().unwrap().get(), 42);
    g.release().await.unwrap();
    let g = locks.lock("ledger").await.unwrap();
    assert_eq!(
        g.fence().await.unwrap().get(),
        43,
        "on demand, from the same counter"
    );
    g.release().await.unwrap();
}

/// An acquisition's undo (its reply lost) gives back only a hold that acquisition took:
/// the grant's evidence says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_gives_back_only_the_hold_its_acquisition_took() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let g = locks.lock("crate").await.unwrap();
    let field = g.field().to_owned();
    let mut c = server.connection().await;
    let evidence: Vec<String> = redis::cmd("KEYS")
        .arg("redisson_lock_grant:{crate}:*")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(evidence.len(), 1, "{evidence:?}");
    let request = evidence[0].rsplit_once("}:").unwrap().1.to_owned();
    call(
        &mut c,
        Kind::Plain,
        "crate",
        &field,
        "never-granted",
        "undo",
        5000,
    )
    .await;
    assert_eq!(
        hash(&server, "crate").await.len(),
        1,
        "an attempt that took nothing"
    );
    call(&mut c, Kind::Plain, "crate", &field, &request, "undo", 5000).await;
    assert!(
        hash(&server, "crate").await.is_empty(),
        "the attempt's hold given back"
    );
    drop(g);
}

/// A Redisson lock whose key lost its expiry (a `PERSIST` by another program) gives
/// waiters no lease to wait for: waiters of every kind back off instead of asking
/// every millisecond, and a refusal says to come back after the longest backoff step
/// (10 s here) rather than at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_without_expiry_is_waited_for_with_backoff_not_polled() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    assert_eq!(java.lock("plain-held", 1).await, None);
    assert_eq!(java.write_lock("write-held", 1).await, None);
    let mut c = server.connection().await;
    for held in ["plain-held", "write-held"] {
        let persisted: i64 = redis::cmd("PERSIST")
            .arg(held)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(persisted, 1, "{held} had an expiry to take away");
    }
    let kinds = super::every_kind();
    for held in ["plain-held", "write-held"] {
        for (kind, options) in &kinds {
            let mut monitor = server.monitor().await;
            let wait = options.clone().wait(Duration::from_millis(600));
            let waited = locks.acquire(held, wait).await.unwrap_err();
            assert!(waited.is_timeout(), "{kind} on {held}: {waited:?}");
            let asked = client_commands_on(&server, &mut monitor, held).await;
            // A few attempts and the subscription (4 to 7 seen); every millisecond
            // was 176 and more.
            assert!(
                asked < 20,
                "the {kind} waiter on {held} polled: {asked} commands in 600 ms"
            );
            let busy = locks
                .acquire(held, options.clone().wait(Duration::ZERO))
                .await
                .unwrap_err();
            assert_eq!(
                busy.retry_after(),
                Some(Duration::from_secs(10)),
                "{kind} on {held}: {busy:?}"
            );
        }
    }
}
