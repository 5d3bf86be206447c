//! What a caller builds for a script's batch lane: one entry of a batched script call
//! ([`Entry`]), packed flat (its keys, then its arguments, as Redis reads them, in a
//! buffer its lane lends it, so building one allocates nothing, and a key made of a
//! lock key and a suffix is written in place). An entry sent alone is written straight
//! into its command instead.

use redis::ToRedisArgs;

use super::args::Args;
use super::scripts::Lua;

/// One entry of a batched script call: its keys and arguments in the script's per-entry
/// layout. Callers build it from the empty entry they are handed (keys first, then
/// arguments): queued, it is packed for a later batch; alone, it is its command.
pub(crate) struct Entry {
    form: Form,
}

enum Form {
    Packed(Packed),
    /// `EVALSHA <sha> <numkeys>` and what was added since.
    Direct(Args),
}

impl Entry {
    /// An entry to queue, written into `buf` (empty).
    pub(super) fn packed_in(buf: Args) -> Self {
        debug_assert_eq!(buf.count(), 0, "an entry starts empty");
        Self {
            form: Form::Packed(Packed {
                args: buf,
                keys: 0,
                keys_end: 0,
            }),
        }
    }

    /// A queued entry's keys and arguments (`None` for an entry made
    /// [`direct`](Self::direct)).
    pub(super) fn into_packed(self) -> Option<Packed> {
        match self.form {
            Form::Packed(p) => Some(p),
            Form::Direct(_) => None,
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
}

/// An entry's keys, then its arguments, written as they go to Redis ([`Args`]), so its
/// lane copies them as they are.
pub(super) struct Packed {
    args: Args,
    /// How many of the first arguments are keys.
    keys: usize,
    /// Where the keys end in the bytes.
    keys_end: usize,
}

impl Packed {
    /// The keys' bulk strings, and how many.
    pub(super) fn keys(&self) -> (&[u8], usize) {
        (&self.args.bulks()[..self.keys_end], self.keys)
    }

    /// The arguments' bulk strings (after the keys), and how many.
    pub(super) fn args(&self) -> (&[u8], usize) {
        (
            &self.args.bulks()[self.keys_end..],
            self.args.count() - self.keys,
        )
    }

    /// The buffer it was written in.
    pub(super) fn into_buffer(self) -> Args {
        self.args
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
        let used = Args::with_capacity(1, 64);
        let p = Entry::packed_in(used)
            .key("lock:{a}")
            .key_suffixed("lock:{a}", ":waiters")
            .key("")
            .arg("v")
            .arg(42_u64)
            .arg(&b"\x00bytes"[..])
            .arg(Vec::<u8>::new())
            .into_packed();
        let p = p.unwrap();
        assert_eq!(p.keys, 3);
        assert_eq!(p.keys().1, 3);
        assert_eq!(p.args().1, 4);
        assert_eq!(
            parts(&p),
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
    }

    #[test]
    fn an_argument_written_in_pieces_or_past_the_buffer_stays_whole() {
        let long = vec![b'x'; 1000];
        let mut p = Entry::packed_in(Args::with_capacity(1, 8))
            .into_packed()
            .unwrap();
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
