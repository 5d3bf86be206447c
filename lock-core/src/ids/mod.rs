//! Order ids: 64-bit numbers, unique across processes and restarts, time-ordered to the
//! second, strictly increasing within one process.
//!
//! Layout:
//!
//! ```text
//!  bit 63   62 ...................... 32   31 ...................... 0
//! +-------+-------------------------------+------------------------------+
//! |   0   | seconds since the epoch (31)  | sequence of that UTC day (32)|
//! +-------+-------------------------------+------------------------------+
//! ```
//!
//! - The seconds come from this machine's system clock, counted from a custom epoch
//!   (default 2024-01-01T00:00:00Z, [`DEFAULT_EPOCH`]); 31 bits last 68 years.
//! - The sequence comes from a per-day Redis counter (INCR / INCRBY), one key per UTC day
//!   of those seconds: `<namespace>:{<name>}:ids:<yyyy-mm-dd>` (built from
//!   [`lock_keys`](crate::client::store::key::lock_keys)`(..).key`, so a user's name cannot forge it).
//!   The day's first id has sequence 1; `GET` on the key is the number of ids (and
//!   reserved-but-unused ids, in segment mode) handed out that day.
//!
//! Two ids with the same seconds share a day, hence a counter, hence differ in the
//! sequence: that is the whole uniqueness argument. It holds across processes and
//! restarts for as long as Redis keeps the counter (see [`IdGenerator`] for the limits).

mod clock;
mod config;
mod layout;
mod segment;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::client::Client;
use crate::client::store::key::LockName;
use crate::client::store::scripts::NEXT_ID;
use crate::error::LockError;

use clock::{ClockStep, clock_step, system_now};
pub use config::{DEFAULT_BLOCK, IdConfig, IdMode, MAX_BLOCK};
pub use layout::{DEFAULT_EPOCH, DecodedId, MAX_SECONDS, MAX_SEQUENCE, OrderId};
use layout::{SECONDS_PER_DAY, compose, day_key, exhausted};
use segment::Segments;

/// Issues [`OrderId`]s for one name, from a per-day Redis counter.
///
/// Behavior:
/// - **Unique** across processes, machines and restarts: every id's sequence is a number
///   the day's counter gave to this process alone (INCR per id, or INCRBY per block).
///   This relies on Redis keeping the counter: a Redis that loses writes (restart
///   without persistence, failover to a lagging replica) can repeat ids of the current
///   day.
/// - **Time-ordered to the second** across processes: the seconds field is the issuing
///   machine's system clock, so across machines the order is as good as the clocks'
///   sync; within one second, ids of different processes are in no particular order.
/// - **Strictly increasing within one process**: an id returned before another call
///   starts is smaller than that call's id (in segment mode, all ids are increasing in
///   the order they were handed out). This holds per generator and its clones, which
///   share one state: make one generator per name per process and clone it.
/// - **Clock stepping back**: no id is issued with a second below the last one issued;
///   `next_id` waits for the clock to catch up, up to
///   [`IdConfig::with_max_clock_wait`] (default 2 s), and past that fails at once with
///   [`LockError::IdsUnavailable`]. Never a duplicate.
/// - **Sequence exhaustion**: one day has 4 294 967 295 sequence numbers per name (a
///   sustained average of about 49 700 ids/s); after that, `next_id` fails with
///   [`LockError::IdsUnavailable`] until the next UTC day. Never a wrap, never a
///   duplicate. Shard busy flows over several names.
/// - **Day change**: the counter key is the UTC day of the id's seconds, so a block
///   reserved before midnight is dropped at midnight, never combined with the next day's
///   seconds.
/// - **Segment mode** ([`IdMode::Segment`]): ids are handed out locally from a reserved
///   block under a short mutex (millions per second in one process); once 80% of it is
///   used the next block is fetched in the background, sized so that this process never
///   holds more than `block` unissued numbers. A crash or restart therefore wastes at
///   most `block` numbers (plus, when Redis times out after running a reservation, that
///   reservation). A caller waits only when the block runs dry before the background
///   fetch has returned (at millions of ids per second from tasks that do nothing else,
///   the runtime can delay that fetch past a 10 000-id block: raise the block size).
/// - Cheap to clone; clones share one state. Redis calls go through the client's
///   connection with its time limit.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::LockClient;
/// use lock_core::ids::{IdConfig, IdGenerator, IdMode};
///
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// let orders = IdGenerator::new(&client, "order", IdConfig::new())?;
/// let id = orders.next_id().await?;
/// let decoded = orders.decode(id);
/// println!("order {id}: second {} of day, #{}", decoded.unix_seconds, decoded.sequence);
///
/// let fast = IdGenerator::new(&client, "order", IdConfig::new().with_mode(IdMode::segment()))?;
/// assert!(fast.next_id().await? > id);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdGenerator {
    inner: Arc<Gen>,
}

struct Gen {
    client: Client,
    /// The escaped name, for messages.
    name: String,
    /// `lock_keys(..).key` of the name; day keys are `<base>:ids:<yyyy-mm-dd>`.
    base: String,
    config: IdConfig,
    state: Mutex<State>,
    /// Wakes callers waiting for a block (segment mode).
    refilled: Notify,
}

struct State {
    /// Seconds field of the latest id issued (per-id mode: latest clock reading used).
    last_secs: u32,
    segments: Segments,
}

impl fmt::Debug for IdGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdGenerator")
            .field("name", &self.inner.name)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl IdGenerator {
    /// A generator on `client` (its doc is on the public constructor,
    /// `IdGenerator::new`).
    pub(crate) fn on<N: LockName>(
        client: Client,
        name: N,
        config: IdConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let keys = client.lock_keys(&name)?;
        let block = match config.mode {
            IdMode::Segment { block } => block,
            IdMode::PerId => 1,
        };
        Ok(Self {
            inner: Arc::new(Gen {
                client,
                name: keys.name().to_owned(),
                base: keys.key,
                config,
                state: Mutex::new(State {
                    last_secs: 0,
                    segments: Segments::new(block),
                }),
                refilled: Notify::new(),
            }),
        })
    }

    /// The next id. See the type's Behavior for the guarantees and the errors
    /// ([`LockError::IdsUnavailable`], or a Redis error when a Redis call fails).
    pub async fn next_id(&self) -> Result<OrderId, LockError> {
        match self.inner.config.mode {
            IdMode::PerId => self.next_per_id().await,
            IdMode::Segment { .. } => segment::next_id(&self.inner).await,
        }
    }

    /// The time and sequence of `id`, with this generator's epoch.
    pub fn decode(&self, id: OrderId) -> DecodedId {
        id.decode(self.inner.config.epoch)
    }

    /// The Redis counter key `id`'s sequence came from (for statistics and tooling: its
    /// value is the number of sequence numbers handed out that day).
    pub fn day_key(&self, id: OrderId) -> String {
        let unix = self.decode(id).unix_seconds;
        day_key(&self.inner.base, unix / SECONDS_PER_DAY)
    }

    /// The configuration in force.
    pub fn config(&self) -> &IdConfig {
        &self.inner.config
    }

    async fn next_per_id(&self) -> Result<OrderId, LockError> {
        let g = &*self.inner;
        let secs = g.clock_gate().await?;
        let day = g.day_of(secs);
        let key = day_key(&g.base, day);
        let n: i64 = g
            .client
            .conn()
            .invoke("next_id", &NEXT_ID, |c| {
                c.arg(1).arg(&key).arg(g.config.day_key_ttl.as_secs());
            })
            .await?;
        let seq = match u32::try_from(n) {
            Ok(0) => {
                return Err(LockError::UnexpectedReply(format!(
                    "next_id.lua returned {n}"
                )));
            }
            Ok(seq) => seq,
            Err(_) if n > 0 => return Err(exhausted(&g.name, day)),
            Err(_) => {
                return Err(LockError::UnexpectedReply(format!(
                    "next_id.lua returned {n}"
                )));
            }
        };
        Ok(compose(secs, seq))
    }
}

impl Gen {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The UTC day (days since 1970-01-01) of a seconds field.
    fn day_of(&self, secs: u32) -> u64 {
        (self.config.epoch + u64::from(secs)) / SECONDS_PER_DAY
    }

    /// Per-id mode: a seconds field not below any this process has used, waiting out a
    /// clock that stepped back (bounded).
    async fn clock_gate(&self) -> Result<u32, LockError> {
        let mut waited = Duration::ZERO;
        loop {
            let step = {
                let mut st = self.state();
                let step = clock_step(
                    system_now(),
                    self.config.epoch,
                    st.last_secs,
                    waited,
                    self.config.max_clock_wait,
                )?;
                if let ClockStep::Go(secs) = step {
                    st.last_secs = secs;
                }
                step
            };
            match step {
                ClockStep::Go(secs) => return Ok(secs),
                ClockStep::Wait(d) => {
                    tracing::debug!(ids = %self.name, behind = ?d, "system clock stepped back; waiting");
                    tokio::time::sleep(d).await;
                    waited += d;
                }
            }
        }
    }
}
