//! Our scripts on Redisson's layout count a thread's holds in one field, so each grant
//! is told apart by its evidence (`redisson_lock_grant:{<name>}:<request>`), which lasts
//! the grant's lease and is renewed with it. Called here as the engine calls them, with
//! two grants of one field: the first one's lease runs out in Redis, the second is
//! taken, and whatever of the first arrives late (a release, a renewal, a fencing
//! request, each sent while the client still counted on the lease) must leave the
//! second alone.

use std::time::Duration;

use lock_tests::RedisServer;
use redis::aio::MultiplexedConnection;

use super::hash;
use crate::common::{eventually, pttl};

const FIELD: &str = "0a1b2c3d-0000-0000-0000-000000000000:7";

/// A hold kind and the script that keeps it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    Plain,
    Read,
    Write,
}

/// One call of the kind's script, as `RedissonBackend::call` makes it: `action` by the
/// grant `request` of `field`, with `ms` (a lease, or the unlock latch's life) and, for
/// an acquisition, the rest of its arguments. Answers the reply's code.
pub(super) async fn call(
    c: &mut MultiplexedConnection,
    kind: Kind,
    name: &str,
    field: &str,
    request: &str,
    action: &str,
    ms: u64,
) -> i64 {
    let tagged = format!("{{{name}}}");
    let per_request = |prefix: &str| format!("{prefix}:{tagged}:{request}");
    let (file, keys, mut args) = match kind {
        Kind::Plain => (
            "redisson_lock.lua",
            [
                name.to_owned(),
                per_request("redisson_unlock_latch"),
                per_request("redisson_lock_grant"),
                format!("redisson_lock_token:{tagged}"),
                format!("redisson_lock_queue:{tagged}"),
                format!("redisson_lock_timeout:{tagged}"),
            ],
            vec![
                action.to_owned(),
                field.to_owned(),
                format!("redisson_lock__channel:{tagged}"),
                "plain".to_owned(),
                ms.to_string(),
            ],
        ),
        Kind::Read | Kind::Write => (
            "redisson_read_write.lua",
            [
                name.to_owned(),
                per_request("redisson_unlock_latch"),
                per_request("redisson_lock_grant"),
                format!("redisson_lock_token:{tagged}"),
                format!("{tagged}:{field}:rwlock_timeout"),
                tagged.clone(),
            ],
            vec![
                action.to_owned(),
                if kind == Kind::Read { "r" } else { "w" }.to_owned(),
                field.to_owned(),
                format!("redisson_rwlock:{tagged}"),
                ms.to_string(),
            ],
        ),
    };
    if action == "acquire" {
        // Fenced (a writer's or plain hold's token comes with it); a plain lock adds
        // the fair wait and whether the caller waits.
        args.push("1".to_owned());
        if kind == Kind::Plain {
            args.extend(["0".to_owned(), "0".to_owned()]);
        }
    }
    let script = redis::Script::new(script(file));
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    for arg in args {
        invocation.arg(arg);
    }
    let reply: Vec<i64> = invocation.invoke_async(c).await.unwrap();
    reply[0]
}

/// The source of our script `file` (as lock-core loads it).
fn script(file: &str) -> &'static str {
    lock_core::SCRIPT_SOURCES
        .iter()
        .find(|(name, _)| *name == file)
        .map(|(_, source)| *source)
        .unwrap()
}

/// The fencing counter of `name`.
async fn token(server: &RedisServer, name: &str) -> i64 {
    let mut c = server.connection().await;
    redis::cmd("GET")
        .arg(format!("redisson_lock_token:{{{name}}}"))
        .query_async(&mut c)
        .await
        .unwrap()
}

/// The hold count of [`FIELD`] in the lock's hash (a writer's field for `Write`).
async fn count(server: &RedisServer, name: &str, kind: Kind) -> Option<String> {
    let field = match kind {
        Kind::Write => format!("{FIELD}:write"),
        _ => FIELD.to_owned(),
    };
    hash(server, name)
        .await
        .into_iter()
        .find(|(f, _)| *f == field)
        .map(|(_, n)| n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_lapsed_grant_sends_late_leaves_the_newer_grant_of_its_field() {
    let server = RedisServer::start();
    let mut c = server.connection().await;
    for kind in [Kind::Plain, Kind::Read, Kind::Write] {
        let name = format!("late-{kind:?}");
        let granted = call(&mut c, kind, &name, FIELD, "old", "acquire", 40).await;
        assert_eq!(granted, 1, "{kind:?}: the first grant");
        eventually(
            Duration::from_secs(2),
            "the first lease runs out",
            || async { pttl(&server, &name).await == -2 },
        )
        .await;
        let granted = call(&mut c, kind, &name, FIELD, "new", "acquire", 10_000).await;
        assert_eq!(granted, 1, "{kind:?}: the newer grant of the same field");

        let renewed = call(&mut c, kind, &name, FIELD, "old", "renew", 10_000).await;
        assert_eq!(
            renewed, -1,
            "{kind:?}: the lapsed grant was renewed, or not told its lease ran out"
        );
        if kind != Kind::Read {
            let before = token(&server, &name).await;
            let fenced = call(&mut c, kind, &name, FIELD, "old", "fence", 0).await;
            assert_eq!(
                fenced, -1,
                "{kind:?}: the lapsed grant was fenced, or not told its lease ran out"
            );
            assert_eq!(
                token(&server, &name).await,
                before,
                "{kind:?}: a lapsed grant moved the token"
            );
        }
        let released = call(&mut c, kind, &name, FIELD, "old", "release", 5_000).await;
        assert_eq!(
            released, -1,
            "{kind:?}: the lapsed grant was given back, or not told its lease ran out"
        );
        assert_eq!(
            count(&server, &name, kind).await.as_deref(),
            Some("1"),
            "{kind:?}: the newer grant's hold is gone: {:?}",
            hash(&server, &name).await
        );
        assert!(
            pttl(&server, &name).await > 9_000,
            "{kind:?}: the newer grant's lease"
        );

        // The newer grant renews, fences and gives back as ever.
        let renewed = call(&mut c, kind, &name, FIELD, "new", "renew", 10_000).await;
        assert_eq!(renewed, 1, "{kind:?}: the newer grant renews");
        if kind != Kind::Read {
            let fenced = call(&mut c, kind, &name, FIELD, "new", "fence", 0).await;
            assert_eq!(fenced, 1, "{kind:?}: the newer grant fences");
        }
        let released = call(&mut c, kind, &name, FIELD, "new", "release", 5_000).await;
        assert_eq!(released, 1, "{kind:?}: the newer grant is given back");
        assert!(
            hash(&server, &name).await.is_empty(),
            "{kind:?}: the lock is free"
        );
    }
}

/// A renewal keeps a grant's evidence with its lease: a grant renewed past its first
/// lease is still given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_grant_is_given_back_after_its_first_lease() {
    let server = RedisServer::start();
    let mut c = server.connection().await;
    for kind in [Kind::Plain, Kind::Read, Kind::Write] {
        let name = format!("renewed-{kind:?}");
        let granted = call(&mut c, kind, &name, FIELD, "one", "acquire", 300).await;
        assert_eq!(granted, 1, "{kind:?}: granted");
        let renewed = call(&mut c, kind, &name, FIELD, "one", "renew", 10_000).await;
        assert_eq!(renewed, 1, "{kind:?}: renewed");
        // The renewed hash's expiry tells the time since the renewal.
        eventually(
            Duration::from_secs(3),
            "the first lease would have run out",
            || async { pttl(&server, &name).await < 9_600 },
        )
        .await;
        let released = call(&mut c, kind, &name, FIELD, "one", "release", 5_000).await;
        assert_eq!(released, 1, "{kind:?}: a renewed grant is given back");
        assert!(
            hash(&server, &name).await.is_empty(),
            "{kind:?}: the lock is free"
        );
    }
}
