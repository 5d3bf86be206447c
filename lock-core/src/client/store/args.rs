//! A command written the way Redis reads it as it is built ([`Args`]): sending it on a
//! [`Wire`](super::wire::Wire) copies it once into the outbox, instead of building a
//! redis-rs `Cmd` and packing that again. The other connections (a `ConnectionManager`,
//! a Cluster) get it as a `Cmd` ([`Args::to_cmd`]).

use std::io::{self, Write};

use redis::{Cmd, RedisWrite, ToRedisArgs};

/// A command's arguments (its name first), each a RESP bulk string (`$<len>\r\n<bytes>\r\n`)
/// back to back, and how many there are.
#[derive(Default)]
pub(crate) struct Args {
    data: Vec<u8>,
    count: usize,
}

impl Args {
    /// An empty command with room for about `args` arguments of `bytes` bytes in all.
    pub(crate) fn with_capacity(args: usize, bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes + args * 8),
            count: 0,
        }
    }

    /// The command `name`, its arguments to follow (as `redis::cmd`).
    pub(crate) fn cmd(name: &str) -> Self {
        let mut cmd = Self::with_capacity(4, 64);
        cmd.arg(name);
        cmd
    }

    /// Appends `arg` (one argument, or several for a sequence, as redis-rs writes it).
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(self);
        self
    }

    /// Arguments written.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Empties the command, keeping its buffer.
    pub(super) fn clear(&mut self) {
        self.data.clear();
        self.count = 0;
    }

    /// Bytes the buffer holds without growing.
    pub(super) fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// The arguments' bulk strings, back to back.
    pub(super) fn bulks(&self) -> &[u8] {
        &self.data
    }

    /// Appends `count` arguments that are already bulk strings (a part of another
    /// command's [`bulks`](Self::bulks) that starts and ends between arguments).
    pub(super) fn push_bulks(&mut self, bulks: &[u8], count: usize) {
        self.data.extend_from_slice(bulks);
        self.count += count;
    }

    /// Bytes written.
    pub(super) fn len(&self) -> usize {
        self.data.len()
    }

    /// Keeps the first `len` bytes, which hold `count` arguments.
    pub(super) fn truncate(&mut self, len: usize, count: usize) {
        self.data.truncate(len);
        self.count = count;
    }

    /// Copies the bytes at `from` to `to` (see `slice::copy_within`); the count of
    /// arguments is the caller's to keep.
    pub(super) fn copy_within(&mut self, from: std::ops::Range<usize>, to: usize) {
        self.data.copy_within(from, to);
    }

    /// Appends the whole command, as Redis reads it, to `out`.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        out.reserve(self.data.len() + 16);
        out.push(b'*');
        out.extend_from_slice(itoa::Buffer::new().format(self.count).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.data);
    }

    /// Appends `cmd` whole, as [`write`](Self::write) writes it: a buffer of a
    /// pipeline's commands counts commands, not arguments.
    pub(super) fn push_command(&mut self, cmd: &Args) {
        cmd.write(&mut self.data);
        self.count += 1;
    }

    /// Each argument's bytes, in order.
    pub(crate) fn each(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = &self.data[..];
        std::iter::from_fn(move || {
            let (arg, after) = first_bulk(rest)?;
            rest = after;
            Some(arg)
        })
    }

    /// The same command as a redis-rs `Cmd`.
    pub(crate) fn to_cmd(&self) -> Cmd {
        let mut cmd = Cmd::with_capacity(self.count, self.data.len());
        for arg in self.each() {
            cmd.arg(arg);
        }
        cmd
    }

    /// Appends one argument made of `parts` joined (a lock key and a suffix, say).
    pub(crate) fn arg_joined(&mut self, parts: &[&[u8]]) -> &mut Self {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        self.data.reserve(len + 24);
        push_bulk_header(&mut self.data, len);
        for part in parts {
            self.data.extend_from_slice(part);
        }
        self.data.extend_from_slice(b"\r\n");
        self.count += 1;
        self
    }
}

/// Whole commands back to back, as Redis reads a pipeline of them, and how many.
pub(crate) struct Pipe<'a> {
    pub(crate) commands: &'a [u8],
    pub(crate) count: usize,
}

impl Pipe<'_> {
    /// The same commands as a redis-rs pipeline (not a transaction).
    pub(crate) fn to_pipeline(&self) -> redis::Pipeline {
        let mut pipe = redis::Pipeline::with_capacity(self.count);
        let mut rest = self.commands;
        while let Some((cmd, after)) = split_command(rest) {
            pipe.add_command(cmd.to_cmd());
            rest = after;
        }
        pipe
    }
}

/// The first command of `bytes` (`*<n>\r\n` and `n` bulk strings, as [`Args::write`]
/// writes it) and what follows it.
fn split_command(bytes: &[u8]) -> Option<(Args, &[u8])> {
    let header = memchr::memchr(b'\n', bytes)?;
    let count = number(bytes.get(1..header.checked_sub(1)?)?)?;
    let body = &bytes[header + 1..];
    let mut rest = body;
    for _ in 0..count {
        rest = first_bulk(rest)?.1;
    }
    let data = body[..body.len() - rest.len()].to_vec();
    Some((Args { data, count }, rest))
}

/// Where the first bulk string of `bytes` (`$<len>\r\n<bytes>\r\n`, as written here)
/// starts its bytes, and its whole size, header and last `\r\n` included. Digit by
/// digit, with no search and no string parse.
fn bulk(bytes: &[u8]) -> Option<(usize, usize)> {
    if *bytes.first()? != b'$' {
        return None;
    }
    let (mut at, mut len) = (1, 0usize);
    loop {
        match *bytes.get(at)? {
            b'\r' if at > 1 => break,
            d @ b'0'..=b'9' if at < 19 => len = len * 10 + usize::from(d - b'0'),
            _ => return None,
        }
        at += 1;
    }
    let size = at + 2 + len + 2;
    // Byte by byte: a slice comparison would call `bcmp` for two bytes.
    let ends = |at: usize| bytes.get(at) == Some(&b'\r') && bytes.get(at + 1) == Some(&b'\n');
    (ends(at) && ends(size - 2)).then_some((at + 2, size))
}

/// The size of the first bulk string of `bytes` (see [`bulk`]).
#[cfg(test)]
fn bulk_size(bytes: &[u8]) -> Option<usize> {
    bulk(bytes).map(|(_, size)| size)
}

/// The first bulk string of `bytes` (see [`bulk`]) and what follows it.
fn first_bulk(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (start, size) = bulk(bytes)?;
    Some((&bytes[start..size - 2], &bytes[size..]))
}

fn number(digits: &[u8]) -> Option<usize> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Appends `$<len>\r\n` to `data`. Most arguments here (keys, grant values, a script's
/// sha) are under 100 bytes: their headers go in as one copy of a known size, which
/// compiles to a store, not a `memcpy` call.
#[inline(always)]
fn push_bulk_header(data: &mut Vec<u8>, len: usize) {
    let digit = |d: usize| b'0' + d as u8;
    match len {
        0..10 => data.extend_from_slice(&[b'$', digit(len), b'\r', b'\n']),
        10..100 => data.extend_from_slice(&[b'$', digit(len / 10), digit(len % 10), b'\r', b'\n']),
        _ => {
            data.push(b'$');
            data.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
            data.extend_from_slice(b"\r\n");
        }
    }
}

impl RedisWrite for Args {
    fn write_arg(&mut self, arg: &[u8]) {
        self.data.reserve(arg.len() + 24);
        push_bulk_header(&mut self.data, arg.len());
        self.data.extend_from_slice(arg);
        self.data.extend_from_slice(b"\r\n");
        self.count += 1;
    }

    fn writer_for_next_arg(&mut self) -> impl Write + '_ {
        let start = self.data.len();
        ArgWriter { args: self, start }
    }

    fn reserve_space_for_args(&mut self, additional: impl IntoIterator<Item = usize>) {
        let bytes: usize = additional.into_iter().map(|n| n + 16).sum();
        self.data.reserve(bytes);
    }
}

/// One argument written in pieces: its length is known, and its header put before it,
/// once the writer is dropped.
struct ArgWriter<'a> {
    args: &'a mut Args,
    start: usize,
}

impl Write for ArgWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.args.data.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ArgWriter<'_> {
    fn drop(&mut self) {
        // The header goes after the body, then is rotated in front of it.
        let data = &mut self.args.data;
        let len = data.len() - self.start;
        push_bulk_header(data, len);
        let header = data.len() - self.start - len;
        data[self.start..].rotate_right(header);
        data.extend_from_slice(b"\r\n");
        self.args.count += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random arguments, written whole or in pieces, read back and packed exactly as
    /// redis-rs packs the same command.
    #[test]
    fn random_commands_pack_as_redis_rs_packs_them() {
        let mut rng = fastrand::Rng::with_seed(23);
        for _ in 0..300 {
            let mut args = Args::with_capacity(2, 16);
            let mut cmd = Cmd::new();
            let mut want = Vec::new();
            for _ in 0..rng.usize(1..8) {
                // Lengths across the header's one, two and more digits.
                let max = [10, 100, 2000][rng.usize(..3)];
                let arg: Vec<u8> = (0..rng.usize(..max)).map(|_| rng.u8(..)).collect();
                if rng.bool() {
                    args.arg(&arg[..]);
                } else {
                    let mut w = args.writer_for_next_arg();
                    let cut = rng.usize(..=arg.len());
                    w.write_all(&arg[..cut]).unwrap();
                    w.write_all(&arg[cut..]).unwrap();
                }
                cmd.arg(&arg[..]);
                want.push(arg);
            }
            let n = rng.u64(..);
            args.arg(n);
            cmd.arg(n);
            want.push(n.to_string().into_bytes());
            let mut packed = Vec::new();
            args.write(&mut packed);
            assert_eq!(packed, cmd.get_packed_command());
            assert_eq!(args.each().map(<[u8]>::to_vec).collect::<Vec<_>>(), want);
            // Sized one by one, the arguments are exactly the bulks.
            let (mut at, mut n) = (0, 0);
            while let Some(size) = bulk_size(&args.bulks()[at..]) {
                assert_eq!(first_bulk(&args.bulks()[at..]).unwrap().0, &want[n][..]);
                (at, n) = (at + size, n + 1);
            }
            assert_eq!((at, n), (args.bulks().len(), want.len()));
            assert_eq!(args.to_cmd().get_packed_command(), cmd.get_packed_command());
        }
    }
}
