//! The verdict of a run: what was sold, and every check that must hold.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use super::http::Reply;
use crate::seckill::instances::BoxError;

/// One order request and its answer (or transport error).
#[derive(Debug)]
pub struct Attempt {
    /// The buyer.
    pub user: i64,
    /// The `Idempotency-Key` sent.
    pub key: String,
    /// The answer, or why there was none.
    pub reply: Result<Reply, String>,
}

impl Attempt {
    pub(crate) fn new(user: i64, key: String, reply: Result<Reply, BoxError>) -> Self {
        Self {
            user,
            key,
            reply: reply.map_err(|e| e.to_string()),
        }
    }

    /// The order id of a 201.
    fn order_id(&self) -> Option<String> {
        let r = self.reply.as_ref().ok().filter(|r| r.status == 201)?;
        r.json().get("order_id")?.as_str().map(str::to_owned)
    }
}

/// Facts about a run besides the answers.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) instances: Vec<String>,
    pub(crate) voucher: i64,
    pub(crate) stock: u32,
    pub(crate) buyers: usize,
    pub(crate) elapsed: Duration,
    pub(crate) drained: bool,
    pub(crate) stock_left: Option<i64>,
    pub(crate) sold: Option<i64>,
}

/// The outcome of a run; `Display` prints the report the demo shows.
#[derive(Debug, Clone)]
pub struct Verdict {
    run: Run,
    /// Order requests sent.
    pub requests: usize,
    /// Distinct order ids answered 201 (first answers, not replays).
    pub accepted: usize,
    /// Rows of the voucher in the database once the queue was drained.
    pub rows: usize,
    /// Accepted order ids that are not in the database (lost orders).
    pub missing: usize,
    /// Users with more than one distinct order id in 201 answers.
    pub users_two_orders_201: usize,
    /// Users with more than one row in the database.
    pub users_two_orders_rows: usize,
    /// Answers with `Idempotent-Replayed: true`.
    pub replays: usize,
    /// Replayed answers that differ from the first answer to the same key.
    pub replay_mismatches: usize,
    /// Answers to a key first answered 201 that were not replays: the order ran again.
    pub reruns: usize,
    /// 409 `already-ordered`.
    pub already_ordered: usize,
    /// 409 `lock-busy` (a concurrent duplicate refused by `#[cache_lock]`).
    pub lock_busy: usize,
    /// 410 `sold-out`.
    pub sold_out: usize,
    /// 429.
    pub rate_limited: usize,
    /// Anything else: 5xx, transport errors, unexpected statuses.
    pub other: usize,
    /// A few of the `other` answers, for the report.
    pub other_samples: Vec<String>,
    /// Median and 99th percentile latency of the answered requests.
    pub p50: Duration,
    /// See `p50`.
    pub p99: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Verdict {
    pub(crate) fn new(run: Run, attempts: Vec<Attempt>, rows: Vec<(String, i64)>) -> Self {
        let mut v = Verdict {
            requests: attempts.len(),
            accepted: 0,
            rows: rows.len(),
            missing: 0,
            users_two_orders_201: 0,
            users_two_orders_rows: 0,
            replays: 0,
            replay_mismatches: 0,
            reruns: 0,
            already_ordered: 0,
            lock_busy: 0,
            sold_out: 0,
            rate_limited: 0,
            other: 0,
            other_samples: Vec::new(),
            p50: Duration::ZERO,
            p99: Duration::ZERO,
            run,
        };
        let mut accepted = HashSet::new();
        let mut orders_of: HashMap<i64, HashSet<String>> = HashMap::new();
        let mut first_answer: HashMap<(i64, &str), (u16, &[u8])> = HashMap::new();
        let mut latencies = Vec::with_capacity(attempts.len());
        for a in &attempts {
            if let Some(id) = a.order_id() {
                orders_of.entry(a.user).or_default().insert(id.clone());
                if !a.reply.as_ref().is_ok_and(|r| r.replayed) {
                    accepted.insert(id);
                }
            }
            let r = match &a.reply {
                Ok(r) => r,
                Err(e) => {
                    v.other += 1;
                    v.other_samples.push(format!("user {}: {e}", a.user));
                    continue;
                }
            };
            latencies.push(r.latency);
            if !r.replayed {
                match first_answer.entry((a.user, a.key.as_str())) {
                    Entry::Vacant(e) => {
                        e.insert((r.status, &r.body[..]));
                    }
                    // A key that got its 201 is answered by replays only (a 429 comes
                    // before the idempotency layer; a 5xx is counted apart).
                    Entry::Occupied(e) if e.get().0 == 201 => {
                        if r.status != 429 && r.status < 500 {
                            v.reruns += 1;
                        }
                    }
                    Entry::Occupied(mut e) => {
                        e.insert((r.status, &r.body[..]));
                    }
                }
            }
            let kind = r.problem_type();
            match (r.status, kind.as_deref()) {
                _ if r.replayed => v.replays += 1,
                (201, _) => {}
                (409, Some("already-ordered")) => v.already_ordered += 1,
                (409, Some("lock-busy")) => v.lock_busy += 1,
                (410, Some("sold-out")) => v.sold_out += 1,
                (429, _) => v.rate_limited += 1,
                (status, kind) => {
                    v.other += 1;
                    v.other_samples.push(format!(
                        "user {}: {status} {}",
                        a.user,
                        kind.unwrap_or("")
                    ));
                }
            }
        }
        // A replay must be the first answer to its key, status and body.
        for a in &attempts {
            if let Ok(r) = &a.reply
                && r.replayed
                && first_answer.get(&(a.user, a.key.as_str())) != Some(&(r.status, &r.body[..]))
            {
                v.replay_mismatches += 1;
            }
        }
        v.other_samples.truncate(5);
        v.accepted = accepted.len();
        v.users_two_orders_201 = orders_of.values().filter(|ids| ids.len() > 1).count();
        let mut rows_per_user: HashMap<i64, usize> = HashMap::new();
        let row_ids: HashSet<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
        for (_, user) in &rows {
            *rows_per_user.entry(*user).or_default() += 1;
        }
        v.users_two_orders_rows = rows_per_user.values().filter(|n| **n > 1).count();
        v.missing = accepted
            .iter()
            .filter(|id| !row_ids.contains(id.as_str()))
            .count();
        latencies.sort();
        v.p50 = percentile(&latencies, 0.50);
        v.p99 = percentile(&latencies, 0.99);
        v
    }

    /// Units sold, by the voucher's counter (`None` if it could not be read).
    pub fn sold(&self) -> Option<i64> {
        self.run.sold
    }

    /// Units left, by the voucher's counter.
    pub fn stock_left(&self) -> Option<i64> {
        self.run.stock_left
    }

    /// Units sold beyond the stock.
    pub fn oversold(&self) -> i64 {
        let stock = i64::from(self.run.stock);
        let most = [
            self.run.sold.unwrap_or(0),
            self.accepted as i64,
            self.rows as i64,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        (most - stock).max(0) + (-self.run.stock_left.unwrap_or(0)).max(0)
    }

    /// Order requests per second while the buyers ran.
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.run.elapsed.as_secs_f64().max(1e-9)
    }

    /// The voucher the run sold.
    pub fn voucher(&self) -> i64 {
        self.run.voucher
    }

    /// Every check that failed, in words; empty when the run is correct.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                out.push(what);
            }
        };
        let stock = i64::from(self.run.stock);
        check(self.run.drained, "the queue was not drained in time".into());
        check(
            self.oversold() == 0,
            format!("oversold by {}", self.oversold()),
        );
        check(
            self.users_two_orders_201 == 0 && self.users_two_orders_rows == 0,
            format!(
                "users with two orders: {} in 201s, {} in the database",
                self.users_two_orders_201, self.users_two_orders_rows
            ),
        );
        check(
            self.accepted == self.rows && self.missing == 0,
            format!(
                "201s accepted ({}) and database rows ({}) differ; {} accepted orders missing",
                self.accepted, self.rows, self.missing
            ),
        );
        check(
            self.run.sold == Some(self.accepted as i64),
            format!(
                "sold counter {:?} != 201s accepted {}",
                self.run.sold, self.accepted
            ),
        );
        check(
            self.run.sold.zip(self.run.stock_left).map(|(s, l)| s + l) == Some(stock),
            format!(
                "sold {:?} + stock left {:?} != stock {stock}",
                self.run.sold, self.run.stock_left
            ),
        );
        if self.run.buyers >= self.run.stock as usize {
            check(
                self.run.stock_left == Some(0),
                format!(
                    "stock left {:?} with more buyers than stock (must end at exactly 0)",
                    self.run.stock_left
                ),
            );
        }
        check(
            self.replay_mismatches == 0,
            format!(
                "{} replays differ from the first answer",
                self.replay_mismatches
            ),
        );
        check(
            self.reruns == 0,
            format!(
                "{} retries of an order answered 201 ran again instead of being replayed",
                self.reruns
            ),
        );
        check(
            self.other == 0,
            format!(
                "{} unexpected answers, e.g. {:?}",
                self.other, self.other_samples
            ),
        );
        out
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<i64>| v.map_or("?".to_string(), |v| v.to_string());
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        writeln!(f, "seckill verdict")?;
        writeln!(
            f,
            "  instances            {} (one Redis, one database)",
            self.run.instances.join(", ")
        )?;
        writeln!(
            f,
            "  voucher              {}: stock {}, {} buyers, {} order requests",
            self.run.voucher, self.run.stock, self.run.buyers, self.requests
        )?;
        writeln!(f, "  sold                 {}", opt(self.run.sold))?;
        writeln!(
            f,
            "  stock left           {:<14} (must be 0 when buyers >= stock)",
            opt(self.run.stock_left)
        )?;
        writeln!(
            f,
            "  oversold             {:<14} (must be 0)",
            self.oversold()
        )?;
        writeln!(
            f,
            "  users with 2 orders  {:<14} (must be 0; in 201s: {}, in the database: {})",
            self.users_two_orders_201.max(self.users_two_orders_rows),
            self.users_two_orders_201,
            self.users_two_orders_rows
        )?;
        writeln!(
            f,
            "  201s / database rows {:<14} (must match; accepted orders missing: {})",
            format!("{} / {}", self.accepted, self.rows),
            self.missing
        )?;
        writeln!(
            f,
            "  replays              {:<14} (same Idempotency-Key retried; differing: {}, run again: {})",
            self.replays, self.replay_mismatches, self.reruns
        )?;
        writeln!(f, "  409 already-ordered  {}", self.already_ordered)?;
        writeln!(f, "  409 lock-busy        {}", self.lock_busy)?;
        writeln!(f, "  410 sold-out         {}", self.sold_out)?;
        writeln!(f, "  429 rate-limited     {}", self.rate_limited)?;
        writeln!(
            f,
            "  other answers        {:<14} (must be 0: 5xx, transport errors)",
            self.other
        )?;
        writeln!(
            f,
            "  throughput           {:.0} requests/s ({} requests in {:.2} s)",
            self.throughput(),
            self.requests,
            self.run.elapsed.as_secs_f64()
        )?;
        writeln!(
            f,
            "  latency              p50 {:.1} ms, p99 {:.1} ms",
            ms(self.p50),
            ms(self.p99)
        )?;
        let violations = self.violations();
        if violations.is_empty() {
            write!(f, "verdict: OK")
        } else {
            writeln!(f, "verdict: FAILED")?;
            for v in &violations {
                writeln!(f, "  - {v}")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Run {
        Run {
            instances: vec!["a".into()],
            voucher: 1,
            stock: 1,
            buyers: 1,
            elapsed: Duration::from_secs(1),
            drained: true,
            stock_left: Some(0),
            sold: Some(1),
        }
    }

    fn answer(status: u16, replayed: bool, body: &str) -> Result<Reply, String> {
        Ok(Reply {
            status,
            replayed,
            content_type: "application/json".into(),
            location: None,
            retry_after: None,
            body: bytes::Bytes::copy_from_slice(body.as_bytes()),
            latency: Duration::from_millis(1),
        })
    }

    fn attempt(key: &str, reply: Result<Reply, String>) -> Attempt {
        Attempt {
            user: 7,
            key: key.into(),
            reply,
        }
    }

    /// A retry of a 201 with its key is correct replayed, and a violation run again
    /// (a service without idempotency answers it 409 `already-ordered`).
    #[test]
    fn a_201_retried_with_its_key_must_be_replayed() {
        let created = r#"{"order_id":"o1"}"#;
        let rows = vec![("o1".to_string(), 7)];
        let replayed = Verdict::new(
            run(),
            vec![
                attempt("k", answer(201, false, created)),
                attempt("k", answer(201, true, created)),
            ],
            rows.clone(),
        );
        assert!(
            replayed.violations().is_empty(),
            "{:?}",
            replayed.violations()
        );
        let rerun = Verdict::new(
            run(),
            vec![
                attempt("k", answer(201, false, created)),
                attempt("k", answer(409, false, r#"{"type":"already-ordered"}"#)),
            ],
            rows,
        );
        assert_eq!(rerun.reruns, 1);
        assert!(
            rerun.violations().iter().any(|v| v.contains("ran again")),
            "{:?}",
            rerun.violations()
        );
    }
}
