//! What waits in a batch lane: one entry of a batched script call ([`Entry`]), packed
//! flat (its keys, then its arguments, each behind its length in one buffer, so
//! building one costs one allocation however many keys and arguments it has, and a key
//! made of a lock key and a suffix costs none), or one plain command of a pipelined call
//! ([`Command`]). An entry sent alone is written straight into its command instead.

use redis::{ToRedisArgs, Value};

use super::args::Args;
use super::scripts::Lua;
use crate::error::LockError;

/// A queued entry's cleanup (see [`Entry::cleanup`]).
pub(super) type Cleanup = Box<dyn FnOnce(Option<Result<Value, LockError>>) + Send + Sync>;

/// One entry of a batched script call: its keys and arguments in the script's per-entry
/// layout. Callers build it from the empty entry they are handed (keys first, then
/// arguments): queued, it is packed for a later batch; alone, it is its command.
pub(crate) struct Entry {
    form: Form,
    pub(super) cleanup: Option<Cleanup>,
}

enum Form {
    Packed(Packed),
    /// `EVALSHA <sha> <numkeys>` and what was added since.
    Direct(Args),
}

impl Entry {
    /// An entry to queue.
    pub(super) fn packed() -> Self {
        Self {
            form: Form::Packed(Packed::with_capacity(256)),
            cleanup: None,
        }
    }

    /// An entry that is a call of `script` alone, with one entry's keys.
    pub(super) fn direct(script: &Lua) -> Self {
        let mut cmd = Args::with_capacity(12, 256);
        cmd.arg("EVALSHA")
            .arg(script.sha())
            .arg(script.entry_keys());
        Self {
            form: Form::Direct(cmd),
            cleanup: None,
        }
    }

    /// The command of an entry made [`direct`](Self::direct).
    pub(super) fn into_command(self) -> Option<Args> {
        match self.form {
            Form::Direct(cmd) => Some(cmd),
            Form::Packed(_) => None,
        }
    }

    pub(crate) fn key(self, key: &str) -> Self {
        self.key_of(&[key.as_bytes()])
    }

    /// The key `key` followed by `suffix` (a lock's waiter marker, say), built in place.
    pub(crate) fn key_suffixed(self, key: &str, suffix: &str) -> Self {
        self.key_of(&[key.as_bytes(), suffix.as_bytes()])
    }

    /// One key made of `parts` back to back; keys come before the arguments.
    fn key_of(mut self, parts: &[&[u8]]) -> Self {
        match &mut self.form {
            Form::Packed(p) => p.write_key(parts),
            Form::Direct(cmd) => {
                cmd.arg_joined(parts);
            }
        }
        self
    }

    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        match &mut self.form {
            Form::Packed(p) => arg.write_redis_args(&mut p.args),
            Form::Direct(cmd) => arg.write_redis_args(cmd),
        }
        self
    }

    /// What to undo for this entry when queued, made by `make` (only then), run once
    /// its outcome is known and its caller will not act on it: with its error (the
    /// caller gets a copy), with its reply if the caller went away after it was sent,
    /// or with `None` if the caller went away before (nothing was sent).
    pub(crate) fn cleanup<F>(mut self, make: impl FnOnce() -> F) -> Self
    where
        F: FnOnce(Option<Result<Value, LockError>>) + Send + Sync + 'static,
    {
        // Sent alone, the caller sees every outcome itself: nothing is left to undo.
        if matches!(self.form, Form::Packed(_)) {
            self.cleanup = Some(Box::new(make()));
        }
        self
    }

    fn packed_form(&self) -> Option<&Packed> {
        match &self.form {
            Form::Packed(p) => Some(p),
            Form::Direct(_) => None,
        }
    }

    /// Arguments and bytes the call of `entries` takes after the script's name or sha
    /// (`numkeys`, keys, arguments), to size its command once.
    pub(super) fn size(entries: &[&Entry]) -> (usize, usize) {
        entries
            .iter()
            .filter_map(|e| e.packed_form())
            .fold((1, 20), |(n, bytes), p| {
                (n + p.args.count(), bytes + p.args.bulks().len())
            })
    }

    /// The keys and arguments of the packed `entries`, in order: every entry's keys,
    /// then every entry's arguments (`numkeys` first).
    pub(super) fn fill(entries: &[&Entry], cmd: &mut Args) {
        let packed = || entries.iter().filter_map(|e| e.packed_form());
        cmd.arg(packed().map(|p| p.keys).sum::<usize>());
        for p in packed() {
            cmd.push_bulks(&p.args.bulks()[..p.keys_end], p.keys);
        }
        for p in packed() {
            let rest = p.args.count() - p.keys;
            cmd.push_bulks(&p.args.bulks()[p.keys_end..], rest);
        }
    }
}

/// One plain command of a pipelined call: its own reply, or its own error.
pub(crate) struct Command {
    pub(super) cmd: Args,
    pub(super) cleanup: Option<Cleanup>,
}

impl Command {
    pub(crate) fn new(cmd: Args) -> Self {
        Self { cmd, cleanup: None }
    }

    /// What to undo for this command when queued: as [`Entry::cleanup`].
    pub(crate) fn cleanup(
        mut self,
        f: impl FnOnce(Option<Result<Value, LockError>>) + Send + Sync + 'static,
    ) -> Self {
        self.cleanup = Some(Box::new(f));
        self
    }
}

/// An entry's keys, then its arguments, written as they go to Redis ([`Args`]), so a
/// batch copies them into its command as they are.
struct Packed {
    args: Args,
    /// How many of the first arguments are keys.
    keys: usize,
    /// Where the keys end in the bytes.
    keys_end: usize,
}

impl Packed {
    fn with_capacity(bytes: usize) -> Self {
        Self {
            args: Args::with_capacity(4, bytes),
            keys: 0,
            keys_end: 0,
        }
    }

    /// One key made of `parts` back to back; keys come before the arguments.
    fn write_key(&mut self, parts: &[&[u8]]) {
        debug_assert_eq!(
            self.args.count(),
            self.keys,
            "an entry's keys come before its arguments"
        );
        self.args.arg_joined(parts);
        self.keys += 1;
        self.keys_end = self.args.bulks().len();
    }

    /// Every argument, keys first.
    #[cfg(test)]
    fn each(&self) -> impl Iterator<Item = &[u8]> {
        self.args.each()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use redis::RedisWrite;

    use super::*;

    fn parts(p: &Packed) -> Vec<Vec<u8>> {
        p.each().map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn a_suffixed_key_sent_alone_is_one_whole_argument_short_or_long() {
        let long = format!("lock:{{{}}}", "x".repeat(400));
        let cmd = Entry::direct(&super::super::scripts::RELEASE)
            .key_suffixed("lock:{a}", ":waiters")
            .key_suffixed(&long, ":queue")
            .arg("v")
            .into_command()
            .unwrap();
        let args: Vec<Vec<u8>> = cmd.each().skip(3).map(<[u8]>::to_vec).collect();
        assert_eq!(
            args,
            [
                b"lock:{a}:waiters".to_vec(),
                format!("{long}:queue").into_bytes(),
                b"v".to_vec()
            ]
        );
    }

    #[test]
    fn an_entry_keeps_each_key_and_argument_whole_and_in_order() {
        let e = Entry::packed()
            .key("lock:{a}")
            .key_suffixed("lock:{a}", ":waiters")
            .key("")
            .arg("v")
            .arg(42_u64)
            .arg(&b"\x00bytes"[..])
            .arg(Vec::<u8>::new());
        let p = e.packed_form().unwrap();
        assert_eq!(p.keys, 3);
        assert_eq!(
            parts(p),
            [
                &b"lock:{a}"[..],
                b"lock:{a}:waiters",
                b"",
                b"v",
                b"42",
                b"\x00bytes",
                b""
            ]
            .map(<[u8]>::to_vec)
        );
        let mut cmd = Args::with_capacity(16, 128);
        cmd.arg("EVALSHA");
        Entry::fill(&[&e, &e], &mut cmd);
        let args: Vec<Vec<u8>> = cmd.each().skip(1).map(<[u8]>::to_vec).collect();
        assert_eq!(args[0], b"6");
        assert_eq!(
            args[1..4],
            args[4..7],
            "keys of both entries, then arguments"
        );
        assert_eq!(args[7..11], args[11..15]);
        assert_eq!(Entry::size(&[&e, &e]).0, 1 + 2 * 7);
    }

    #[test]
    fn an_argument_written_in_pieces_or_past_the_buffer_stays_whole() {
        let long = vec![b'x'; 1000];
        let mut p = Packed::with_capacity(8);
        {
            let mut w = p.args.writer_for_next_arg();
            w.write_all(b"ab").unwrap();
            w.write_all(b"cd").unwrap();
        }
        p.args.write_arg(&long);
        // An argument the writer left empty is an empty argument, not a missing one.
        drop(p.args.writer_for_next_arg());
        p.args.write_arg(b"z");
        assert_eq!(p.args.count(), 4);
        assert_eq!(
            parts(&p),
            [b"abcd".to_vec(), long, Vec::new(), b"z".to_vec()]
        );
    }
}
