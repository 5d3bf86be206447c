//! What a caller builds for a script's batch lane: one entry of a batched script call
//! ([`Entry`]). Queued, its keys and arguments are written straight into the buffers
//! its lane keeps for the next batch (its keys into the key columns the script reads
//! them in, its arguments after what that buffer holds), as Redis reads them: a key
//! made of a lock key and a suffix is written in place, nothing is allocated, and a
//! batch's command copies each buffer whole. An entry sent alone is written straight
//! into its command instead.

use redis::ToRedisArgs;

use super::args::Args;
use super::scripts::Lua;

/// One entry of a batched script call: its keys and arguments in the script's per-entry
/// layout. Callers build it from the empty entry they are handed: queued, it is written
/// into its lane's buffers for a later batch; alone, it is its command.
pub(crate) struct Entry<'w> {
    form: Form<'w>,
}

enum Form<'w> {
    Packed(Packed<'w>),
    /// `EVALSHA <sha> <numkeys>` and what was added since.
    Direct(Args),
}

impl<'w> Entry<'w> {
    /// An entry to queue: its `k`th key goes after what `columns[k % columns.len()]`
    /// holds, its arguments after what `args` holds.
    pub(super) fn packed_in(columns: &'w mut [Args], args: &'w mut Args) -> Self {
        Self {
            form: Form::Packed(Packed {
                columns,
                args,
                keys: 0,
            }),
        }
    }

    /// A queued entry, written (`None` for an entry made [`direct`](Entry::direct)).
    pub(super) fn into_packed(self) -> Option<Packed<'w>> {
        match self.form {
            Form::Packed(p) => Some(p),
            Form::Direct(_) => None,
        }
    }

    /// The command of an entry made [`direct`](Entry::direct).
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

    /// One key made of `parts` back to back.
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
            Form::Packed(p) => arg.write_redis_args(p.args),
            Form::Direct(cmd) => arg.write_redis_args(cmd),
        }
        self
    }
}

impl Entry<'static> {
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
}

/// `build`, as what builds an entry from the one it is handed, whatever that one
/// borrows: for a builder kept in a variable before it is passed on.
pub(crate) fn builder<F: FnOnce(Entry<'_>) -> Entry<'_>>(build: F) -> F {
    build
}

/// A queued entry, written into its lane's buffers.
pub(super) struct Packed<'w> {
    columns: &'w mut [Args],
    args: &'w mut Args,
    /// Keys written.
    keys: usize,
}

impl Packed<'_> {
    /// How many keys the entry wrote.
    pub(super) fn keys(&self) -> usize {
        self.keys
    }

    /// One key made of `parts` back to back, in the next column (counted, and written
    /// nowhere, if there are no columns).
    fn write_key(&mut self, parts: &[&[u8]]) {
        let columns = self.columns.len().max(1);
        if let Some(column) = self.columns.get_mut(self.keys % columns) {
            column.arg_joined(parts);
        }
        self.keys += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use redis::RedisWrite;

    use super::*;

    fn each(args: &Args) -> Vec<Vec<u8>> {
        args.each().map(<[u8]>::to_vec).collect()
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

    /// Keys go to the columns in turn and arguments after what their buffer holds,
    /// each whole; what the buffers held stays.
    #[test]
    fn an_entry_writes_its_keys_by_column_and_its_arguments_whole_after_what_was_there() {
        let mut columns = [Args::default(), Args::default()];
        columns[0].arg("before");
        let mut args = Args::default();
        args.arg("earlier");
        let p = Entry::packed_in(&mut columns, &mut args)
            .key("lock:{a}")
            .key_suffixed("lock:{a}", ":waiters")
            .key("")
            .arg("v")
            .arg(42_u64)
            .arg(&b"\x00bytes"[..])
            .arg(Vec::<u8>::new())
            .into_packed()
            .unwrap();
        assert_eq!(p.keys(), 3);
        let key = |k: &[u8]| k.to_vec();
        assert_eq!(
            each(&columns[0]),
            [key(b"before"), key(b"lock:{a}"), key(b"")]
        );
        assert_eq!(each(&columns[1]), [key(b"lock:{a}:waiters")]);
        assert_eq!(
            each(&args),
            [&b"earlier"[..], b"v", b"42", b"\x00bytes", b""].map(<[u8]>::to_vec)
        );
    }

    #[test]
    fn an_argument_written_in_pieces_or_past_the_buffer_stays_whole() {
        let long = vec![b'x'; 1000];
        let (mut columns, mut args) = ([Args::default()], Args::with_capacity(1, 8));
        let p = Entry::packed_in(&mut columns, &mut args)
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
        assert_eq!(args.count(), 4);
        assert_eq!(
            each(&args),
            [b"abcd".to_vec(), long, Vec::new(), b"z".to_vec()]
        );
    }
}
