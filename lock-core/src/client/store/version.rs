//! What a client checks of the Redis server once, when it opens (on a Cluster, of each
//! master), from one `INFO server memory`:
//! - the version: the scripts need Redis 7.0 (the `#!lua` shebang and its flags), and
//!   an older server would otherwise fail later, on the first script call, with an
//!   opaque error;
//! - eviction: a `maxmemory-policy` that evicts (`volatile-*` drops keys with a TTL,
//!   locks among them; `allkeys-*` any key, fencing counters too) with a `maxmemory`
//!   set can drop a lock before its lease ends and let two holders in: refused. The
//!   same policy without a `maxmemory` evicts nothing yet: accepted with a warning.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, ServerErrorKind, Value};

use crate::error::LockError;

/// The oldest Redis the scripts run on, as (major, minor).
const MIN_REDIS: (u32, u32) = (7, 0);
/// [`MIN_REDIS`] as written in messages.
pub(crate) const MIN_REDIS_TEXT: &str = "7.0";

/// A server version as (major, minor, patch).
type Version = (u32, u32, u32);

/// Asks the server(s) behind `conn` for `INFO server memory` and refuses a Redis older
/// than 7.0 with [`LockError::UnsupportedRedis`], and one that evicts keys with
/// [`LockError::EvictingRedis`]. A server that does not tell (INFO refused by an ACL or
/// a proxy, no readable field) is accepted with a warning: only what is known to be
/// unsound is refused. Connection failures and timeouts are errors, as they would be
/// for any command.
pub(crate) async fn require_supported<C: ConnectionLike>(
    conn: &mut C,
    timeout: Duration,
) -> Result<(), LockError> {
    let info = tokio::time::timeout(
        timeout,
        redis::cmd("INFO")
            .arg("server")
            .arg("memory")
            .query_async::<Value>(conn),
    )
    .await
    .map_err(|_| LockError::RedisTimeout {
        op: "INFO server memory",
        after: timeout,
    })?;
    match info {
        Ok(reply) => check_reply(&reply),
        Err(e) if refused_by_server(&e) => {
            tracing::warn!(error = %e, "could not check the Redis server (INFO refused); Redis {MIN_REDIS_TEXT} or newer with maxmemory-policy noeviction is required");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// An error reply (ACL `NOPERM`, an unknown command on a proxy), not a failed
/// connection.
fn refused_by_server(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::NoPerm)
            | ErrorKind::Extension
    )
}

/// Checks an `INFO server` reply: one text, or on a Cluster a map from each master's
/// address to its text (or its error).
fn check_reply(reply: &Value) -> Result<(), LockError> {
    match reply {
        Value::Map(nodes) => nodes.iter().try_for_each(|(node, info)| {
            let node = text(node).unwrap_or_else(|| "?".into());
            check_node(info, Some(&node))
        }),
        info => check_node(info, None),
    }
}

fn check_node(info: &Value, node: Option<&str>) -> Result<(), LockError> {
    let info = text(info);
    check_eviction(info.as_deref().unwrap_or_default(), node)?;
    let version = info.as_deref().and_then(parse_info);
    match version {
        Some(v) if supported(v) => Ok(()),
        Some((major, minor, patch)) => Err(LockError::UnsupportedRedis {
            found: match node {
                Some(node) => format!("{major}.{minor}.{patch} (at {node})"),
                None => format!("{major}.{minor}.{patch}"),
            },
            needed: MIN_REDIS_TEXT,
        }),
        None => {
            tracing::warn!(
                node,
                "INFO server has no readable redis_version; Redis {MIN_REDIS_TEXT} or newer is required"
            );
            Ok(())
        }
    }
}

/// Refuses a policy that evicts while a `maxmemory` is set (see the module docs).
fn check_eviction(info: &str, node: Option<&str>) -> Result<(), LockError> {
    let field = |name| info_field(info, name);
    let Some(policy) = field("maxmemory_policy") else {
        tracing::warn!(
            node,
            "INFO memory has no maxmemory_policy; maxmemory-policy noeviction is required"
        );
        return Ok(());
    };
    if policy == "noeviction" {
        return Ok(());
    }
    match field("maxmemory").and_then(|m| m.parse::<u64>().ok()) {
        Some(0) => {
            tracing::warn!(
                node,
                policy,
                "maxmemory-policy evicts keys once a maxmemory is set; set noeviction before that, or locks may be evicted"
            );
            Ok(())
        }
        maxmemory => Err(LockError::EvictingRedis {
            policy: policy.to_owned(),
            // Unreadable: taken as set, since the policy says it evicts.
            maxmemory: maxmemory.unwrap_or(u64::MAX),
            node: node.map(str::to_owned),
        }),
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// The `redis_version` field of an `INFO server` text; `None` when it is missing or
/// does not start with a number.
fn parse_info(info: &str) -> Option<Version> {
    info_field(info, "redis_version").and_then(parse_version)
}

/// The value of field `name` in an `INFO` text (`name:value` lines), trimmed.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// `7.2.4` -> (7, 2, 4); a pre-release suffix is ignored (`7.0.0-rc1` is 7.0.0) and a
/// missing minor or patch is 0. `None` unless the major version is a number.
fn parse_version(v: &str) -> Option<Version> {
    let mut parts = v.split('.').map(|part| {
        let digits = part
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(part.len());
        part[..digits].parse::<u32>().ok()
    });
    let major = parts.next().flatten()?;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

fn supported((major, minor, _): Version) -> bool {
    (major, minor) >= MIN_REDIS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str) -> String {
        format!(
            "# Server\r\nredis_version:{version}\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n"
        )
    }

    #[test]
    fn parses_the_version_field() {
        assert_eq!(parse_info(&info("7.0.15")), Some((7, 0, 15)));
        assert_eq!(parse_info(&info("6.2.14")), Some((6, 2, 14)));
        assert_eq!(parse_info(&info("7.0.0-rc1")), Some((7, 0, 0)));
        // What unstable builds report.
        assert_eq!(parse_info(&info("255.255.255")), Some((255, 255, 255)));
        assert_eq!(parse_info(&info("8")), Some((8, 0, 0)));
        assert_eq!(parse_info(&info(" 7.2.4 ")), Some((7, 2, 4)));
        assert_eq!(parse_info(&info("")), None);
        assert_eq!(parse_info(&info("unknown")), None);
        assert_eq!(parse_info(&info("99999999999.0.0")), None);
        assert_eq!(parse_info("# Server\r\nredis_mode:standalone\r\n"), None);
        assert_eq!(parse_info(""), None);
        // Another field ending in redis_version is not it.
        assert_eq!(
            parse_info("valkey_redis_version:6.0.0\nredis_version:7.2.4\n"),
            Some((7, 2, 4))
        );
    }

    #[test]
    fn refuses_only_a_known_old_server() {
        let bulk = |s: String| Value::BulkString(s.into_bytes());
        assert!(check_reply(&bulk(info("7.0.0"))).is_ok());
        assert!(check_reply(&bulk(info("7.0.0-rc1"))).is_ok());
        assert!(check_reply(&bulk(info("255.255.255"))).is_ok());
        assert!(check_reply(&bulk(info("8.2.1"))).is_ok());
        // Nothing to judge by: accepted (with a warning).
        assert!(check_reply(&bulk("# Server\r\n".into())).is_ok());
        assert!(check_reply(&Value::Nil).is_ok());

        let e = check_reply(&bulk(info("6.2.14"))).unwrap_err();
        assert!(
            matches!(&e, LockError::UnsupportedRedis { found, needed: "7.0" } if found == "6.2.14"),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(
            message.contains("6.2.14") && message.contains("7.0 or newer"),
            "{message}"
        );
        assert_eq!(e.code(), "lock-misconfigured");
        assert!(!e.is_unavailable() && !e.is_invalid_input());
    }

    #[test]
    fn an_evicting_policy_is_refused_once_a_maxmemory_is_set() {
        let memory = |policy: &str, maxmemory: u64| {
            format!(
                "{}# Memory\r\nused_memory:1000\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n",
                info("7.2.4")
            )
        };
        let check = |policy: &str, maxmemory: u64| {
            check_node(
                &Value::BulkString(memory(policy, maxmemory).into_bytes()),
                None,
            )
        };
        for policy in [
            "volatile-lru",
            "volatile-ttl",
            "allkeys-lru",
            "allkeys-random",
        ] {
            let e = check(policy, 100 << 20).unwrap_err();
            assert!(
                matches!(&e, LockError::EvictingRedis { policy: p, maxmemory, node: None } if p == policy && *maxmemory == 100 << 20),
                "{e:?}"
            );
            assert!(e.to_string().contains("noeviction"), "{e}");
            assert_eq!(e.code(), "lock-misconfigured");
            // No maxmemory: nothing is evicted yet.
            assert!(check(policy, 0).is_ok());
        }
        assert!(check("noeviction", 100 << 20).is_ok());
        // A server that does not say is accepted.
        assert!(check_node(&Value::BulkString(info("7.2.4").into_bytes()), None).is_ok());
    }

    #[test]
    fn a_cluster_answers_per_master() {
        let node = |addr: &str, version: &str| {
            (
                Value::BulkString(addr.as_bytes().to_vec()),
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: info(version),
                },
            )
        };
        let all_new = Value::Map(vec![
            node("10.0.0.1:7000", "7.2.4"),
            node("10.0.0.2:7000", "7.0.15"),
        ]);
        assert!(check_reply(&all_new).is_ok());
        let one_old = Value::Map(vec![
            node("10.0.0.1:7000", "7.2.4"),
            node("10.0.0.2:7000", "6.2.6"),
        ]);
        let e = check_reply(&one_old).unwrap_err();
        assert!(e.to_string().contains("6.2.6 (at 10.0.0.2:7000)"), "{e}");
    }
}
