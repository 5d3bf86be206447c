//! `RReadWriteLock`: readers of both kinds share, writers exclude everyone.

use std::time::Duration;

use lock_core::{LockOptions, LockScope};
use lock_tests::RedisServer;

use super::{Java, Listener, hash, locks};
use crate::checks;
use crate::common::{pttl, readers_within};

fn read() -> LockOptions {
    LockOptions::new().read()
}

fn write() -> LockOptions {
    LockOptions::new().write()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_reader_shares_with_ours_and_its_unlock_wakes_our_writer() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    assert_eq!(java.read_lock("catalog", 1).await, None);

    checks::a_reader_shares_and_the_writer_is_busy(&locks, "catalog").await;
    let writer = checks::waiting(&locks, "catalog", write());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!writer.is_finished(), "a writer beside a Java reader");
    assert_eq!(java.read_unlock("catalog", 1).await, Some(1));
    let g = checks::granted(writer, "woken by Redisson's read unlock").await;
    let field = format!("{}:write", g.field());
    assert_eq!(
        hash(&server, "catalog").await,
        vec![(field, "1".into()), ("mode".into(), "write".into())]
    );

    assert!(
        java.read_lock("catalog", 2).await.is_some(),
        "no Java reader beside our writer"
    );
    assert!(
        java.write_lock("catalog", 2).await.is_some(),
        "nor a Java writer"
    );
    let mut channel = Listener::on(&server, "redisson_rwlock:{catalog}").await;
    g.release().await.unwrap();
    assert_eq!(
        channel.next("our write unlock").await,
        "1",
        "wake all, as Redisson's"
    );
    assert_eq!(java.read_lock("catalog", 2).await, None);
    assert_eq!(java.read_unlock("catalog", 2).await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_writer_excludes_ours_and_its_unlock_wakes_our_reader() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    assert_eq!(java.write_lock("catalog", 1).await, None);
    checks::read_and_write_busy(&locks, "catalog").await;
    let reader = checks::waiting(&locks, "catalog", read());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reader.is_finished(), "a reader beside a Java writer");
    assert_eq!(java.write_unlock("catalog", 1).await, Some(1));
    let g = checks::granted(reader, "woken by Redisson's write unlock").await;
    assert!(g.fencing_token().is_none(), "readers are not fenced");
    g.release().await.unwrap();
}

/// Redisson's write unlock says "wake all" (`1`): every reader of ours waiting behind
/// it goes in then, none left to its backoff (10 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_write_unlock_wakes_every_reader_of_ours() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    assert_eq!(java.write_lock("catalog", 1).await, None);
    let readers: Vec<_> = (0..3)
        .map(|_| checks::waiting(&locks, "catalog", read()))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        readers.iter().all(|r| !r.is_finished()),
        "a reader beside a Java writer"
    );
    assert_eq!(java.write_unlock("catalog", 1).await, Some(1));
    let late = "was not woken by the unlock";
    for g in readers_within(readers, Duration::from_secs(1), late).await {
        g.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_read_holds_keep_the_timeout_keys_redisson_reads() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    let ours = locks.acquire("catalog", read()).await.unwrap();
    let hold = format!("{{catalog}}:{}:rwlock_timeout:1", ours.field());
    assert!(
        pttl(&server, &hold).await > 25_000,
        "one key per read hold, with its lease"
    );
    assert!(
        java.write_lock("catalog", 1).await.is_some(),
        "no Java writer beside us"
    );

    assert_eq!(
        java.read_lock("catalog", 1).await,
        None,
        "a Java reader shares"
    );
    // Redisson's unlock keeps the hash alive for the longest read hold left: ours.
    assert_eq!(
        java.read_unlock("catalog", 1).await,
        Some(0),
        "we still read"
    );
    assert!(pttl(&server, "catalog").await > 25_000);
    let mut channel = Listener::on(&server, "redisson_rwlock:{catalog}").await;
    ours.release().await.unwrap();
    assert_eq!(channel.next("the last read unlock").await, "0");
    assert!(hash(&server, "catalog").await.is_empty());
    assert_eq!(
        pttl(&server, &hold).await,
        -2,
        "the hold's key went with it"
    );
    assert_eq!(java.write_lock("catalog", 1).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_downgrade_is_a_read_lock_for_redisson_once_the_writer_leaves() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    let scope = LockScope::new();
    let w = locks.acquire("page", write().scope(&scope)).await.unwrap();
    let r = locks.acquire("page", read().scope(&scope)).await.unwrap();
    assert!(
        java.read_lock("page", 1).await.is_some(),
        "a writer holds it"
    );
    w.release().await.unwrap();
    assert_eq!(
        hash(&server, "page").await,
        vec![
            (r.field().to_owned(), "1".into()),
            ("mode".into(), "read".into())
        ]
    );
    assert_eq!(java.read_lock("page", 1).await, None, "readers share now");
    assert!(
        java.write_lock("page", 2).await.is_some(),
        "writers still wait"
    );
    r.release().await.unwrap();
    assert_eq!(java.read_unlock("page", 1).await, Some(1));
}

/// In Redisson's layout a name is one key: its plain lock and its read-write lock
/// exclude each other (Redisson's own clients would corrupt such a hash; ours refuse).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_and_a_read_write_lock_of_one_name_exclude_each_other() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let plain = locks.lock("shelf").await.unwrap();
    checks::read_and_write_busy(&locks, "shelf").await;
    plain.release().await.unwrap();
    let reader = locks.acquire("shelf", read()).await.unwrap();
    assert!(locks.try_lock("shelf").await.unwrap_err().is_busy());
    reader.release().await.unwrap();
}
