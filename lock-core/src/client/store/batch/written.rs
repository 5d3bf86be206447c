//! What a lane's queued calls send, written into buffers the lane keeps ([`Written`]) as
//! they queue: a queued call costs no buffer of its own (an entry writes its keys and
//! arguments straight into them; a command is built in a scratch buffer the lane
//! reuses, then appended), and a batch's command copies each buffer whole. A driver
//! takes the buffers with its batch and gives them back once its call is over, so a
//! busy lane allocates none.

use super::super::args::{Args, Pipe};
use super::super::entry::Entry;

/// Buffers kept per lane for batches in flight; more are dropped when they come back.
const SPARES: usize = 4;
/// A buffer grown past this (a burst of large entries) is dropped rather than kept.
const KEPT_CAPACITY: usize = 64 * 1024;
/// The most key columns a batched script reads its entries' keys in (the release
/// script's three: see [`Lua::key_columns`]).
///
/// [`Lua::key_columns`]: super::super::scripts::Lua::key_columns
pub(super) const KEY_COLUMNS: usize = 3;

/// Where one queued call's bytes are in its lane's [`Written`]: its keys in each key
/// column, and its arguments (or its command).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct Span {
    keys: [Part; KEY_COLUMNS],
    rest: Part,
}

/// A run of bulk strings (or of commands) in one buffer, and how many.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Part {
    start: usize,
    end: usize,
    count: usize,
}

impl Part {
    /// The same bytes once what starts at `from` has moved to `to`.
    fn shifted(self, from: usize, to: usize) -> Self {
        let at = |i: usize| i.saturating_sub(from) + to;
        Self {
            start: at(self.start),
            end: at(self.end),
            count: self.count,
        }
    }
}

/// Moves the `count` calls' bytes of `buf` from `from` on to the end of `to`.
fn move_tail(buf: &mut Args, from: usize, count: usize, to: &mut Args) {
    to.push_bulks(buf.bulks().get(from..).unwrap_or_default(), count);
    buf.truncate(from, buf.count().saturating_sub(count));
}

/// What a buffer has up to now: where the next call's part of it starts.
fn end_of(buf: &Args) -> Part {
    Part {
        start: buf.len(),
        end: buf.len(),
        count: buf.count(),
    }
}

/// The part of `buf` written since `before` ([`end_of`] it then).
fn since(buf: &Args, before: Part) -> Part {
    Part {
        start: before.end,
        end: buf.len(),
        count: buf.count().saturating_sub(before.count),
    }
}

/// Moves `part` of `buf` down to `to` (where the bytes kept so far end), which it is at
/// or after; `to` then ends after it.
fn move_down(buf: &mut Args, part: &mut Part, to: &mut Part) {
    let len = part.end - part.start;
    if part.start != to.end {
        buf.copy_within(part.start..part.end, to.end);
    }
    *part = Part {
        start: to.end,
        end: to.end + len,
        count: part.count,
    };
    to.end += len;
    to.count += part.count;
}

/// Keeps what ends at `kept` (see [`move_down`]).
fn cut(buf: &mut Args, kept: Part) {
    buf.truncate(kept.end, kept.count);
}

/// The calls queued on one lane since its last batch, written out: a script lane's
/// entries' keys (a column each: every entry's first key in the first, and so on; a
/// script laid out by rows has one column, entry after entry) and arguments (in
/// `rest`), which a batch sends as every key, then every argument; or a command lane's
/// whole commands (in `rest`), which a batch sends as one pipeline.
#[derive(Default)]
pub(super) struct Written {
    keys: [Args; KEY_COLUMNS],
    rest: Args,
    /// Where the next command is built, kept after each.
    scratch: Option<Args>,
}

impl Written {
    /// Appends the entry `build` writes, its keys in `columns` columns (see
    /// [`Lua::key_columns`]): where it is. `None`, with nothing appended, if the entry
    /// does not fit that layout (laid out by column, its keys are not one per column;
    /// or more columns than there are), or `build` returned another entry than the
    /// one it was given.
    ///
    /// [`Lua::key_columns`]: super::super::scripts::Lua::key_columns
    pub(super) fn entry(
        &mut self,
        columns: usize,
        build: impl FnOnce(Entry<'_>) -> Entry<'_>,
    ) -> Option<Span> {
        let before: [Part; KEY_COLUMNS] = std::array::from_fn(|c| end_of(&self.keys[c]));
        let rest = end_of(&self.rest);
        // A builder that panics halfway leaves nothing behind either: the next batch
        // would send its bytes as another entry's.
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match self.keys.get_mut(..columns) {
                Some(used) if columns > 0 => build(Entry::packed_in(used, &mut self.rest))
                    .into_packed()
                    .map(|p| p.keys()),
                _ => None,
            }
        }));
        let fits = matches!(built, Ok(Some(k)) if columns == 1 || k == columns);
        if !fits {
            self.cut(before, rest);
            if let Err(panic) = built {
                std::panic::resume_unwind(panic);
            }
            return None;
        }
        Some(Span {
            keys: std::array::from_fn(|c| since(&self.keys[c], before[c])),
            rest: since(&self.rest, rest),
        })
    }

    /// Appends the command `build` writes (into the lane's scratch buffer, handed to
    /// it empty): where it is.
    pub(super) fn command(&mut self, build: impl FnOnce(Args) -> Args) -> Span {
        let mut scratch = self
            .scratch
            .take()
            .unwrap_or_else(|| Args::with_capacity(8, 256));
        scratch.clear();
        let cmd = build(scratch);
        let before = end_of(&self.rest);
        self.rest.push_command(&cmd);
        let span = Span {
            keys: Default::default(),
            rest: since(&self.rest, before),
        };
        self.scratch = Some(cmd);
        span
    }

    /// Arguments and bytes a script call of these entries takes after the script's
    /// name or sha (`numkeys`, keys, arguments), to size its command once.
    pub(super) fn script_size(&self) -> (usize, usize) {
        let bytes = self.keys.iter().map(Args::len).sum::<usize>();
        (
            1 + self.key_count() + self.rest.count(),
            20 + bytes + self.rest.len(),
        )
    }

    /// Keys of every entry, over the columns.
    fn key_count(&self) -> usize {
        self.keys.iter().map(Args::count).sum()
    }

    /// The keys and arguments of a script call of these entries: `numkeys`, every
    /// entry's keys (a column at a time), then every entry's arguments.
    pub(super) fn fill_script(&self, cmd: &mut Args) {
        cmd.arg(self.key_count());
        for column in &self.keys {
            cmd.push_bulks(column.bulks(), column.count());
        }
        cmd.push_bulks(self.rest.bulks(), self.rest.count());
    }

    /// The commands of a command lane, as one pipeline.
    pub(super) fn pipe(&self) -> Pipe<'_> {
        Pipe {
            commands: self.rest.bulks(),
            count: self.rest.count(),
        }
    }

    /// Keeps only the calls at `kept` (each span of this buffer's calls that stay, in
    /// order), moving their bytes together and updating each span.
    pub(super) fn retain<'s>(&mut self, kept: impl IntoIterator<Item = &'s mut Span>) {
        let mut keys = [Part::default(); KEY_COLUMNS];
        let mut rest = Part::default();
        for span in kept {
            for (c, buf) in self.keys.iter_mut().enumerate() {
                move_down(buf, &mut span.keys[c], &mut keys[c]);
            }
            move_down(&mut self.rest, &mut span.rest, &mut rest);
        }
        self.cut(keys, rest);
    }

    /// Keeps each key column up to `keys` and the arguments up to `rest` (see
    /// [`move_down`]).
    fn cut(&mut self, keys: [Part; KEY_COLUMNS], rest: Part) {
        for (buf, kept) in self.keys.iter_mut().zip(keys) {
            cut(buf, kept);
        }
        cut(&mut self.rest, rest);
    }

    /// Moves the calls at `moved` (the spans of this buffer's last calls, in order) to
    /// the end of `to`, updating each span: each buffer's bytes from the first of them
    /// on move in one copy, and the spans shift by as much.
    pub(super) fn move_to<'s>(
        &mut self,
        to: &mut Written,
        moved: impl IntoIterator<Item = &'s mut Span>,
    ) {
        let mut moved = moved.into_iter().peekable();
        let Some(first) = moved.peek().map(|s| **s) else {
            return;
        };
        let (mut keys, mut rest) = ([0; KEY_COLUMNS], 0);
        for span in moved {
            for (c, part) in span.keys.iter_mut().enumerate() {
                keys[c] += part.count;
                *part = part.shifted(first.keys[c].start, to.keys[c].len());
            }
            rest += span.rest.count;
            span.rest = span.rest.shifted(first.rest.start, to.rest.len());
        }
        for (c, buf) in self.keys.iter_mut().enumerate() {
            move_tail(buf, first.keys[c].start, keys[c], &mut to.keys[c]);
        }
        move_tail(&mut self.rest, first.rest.start, rest, &mut to.rest);
    }

    /// Empty, and small enough to keep for another batch.
    fn reusable(mut self) -> Option<Self> {
        let small = |b: &Args| b.capacity() <= KEPT_CAPACITY;
        if !self.keys.iter().all(small) || !small(&self.rest) {
            return None;
        }
        self.clear();
        if self.scratch.as_ref().is_some_and(|s| !small(s)) {
            self.scratch = None;
        }
        Some(self)
    }

    /// Empties these buffers (their calls are gone).
    pub(super) fn clear(&mut self) {
        self.keys.iter_mut().for_each(Args::clear);
        self.rest.clear();
    }
}

/// The buffers a lane keeps for its next batches.
#[derive(Default)]
pub(super) struct Spares(Vec<Written>);

impl Spares {
    pub(super) fn take(&mut self) -> Written {
        self.0.pop().unwrap_or_default()
    }

    /// Keeps `written` (its batch is over) for a later batch, if there is room.
    pub(super) fn give_back(&mut self, written: Written) {
        if self.0.len() < SPARES
            && let Some(w) = written.reusable()
        {
            self.0.push(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One queued entry as a model: its keys and arguments.
    type Model = (Vec<Vec<u8>>, Vec<Vec<u8>>);

    fn random_bytes(rng: &mut fastrand::Rng) -> Vec<u8> {
        let max = [10, 100, 300][rng.usize(..3)];
        (0..rng.usize(..max)).map(|_| rng.u8(..)).collect()
    }

    /// An entry of `keys` keys and a few arguments.
    fn random_entry(rng: &mut fastrand::Rng, keys: usize) -> Model {
        // Keys are strings: bytes that are not UTF-8 stand for "k".
        let key = |b: Vec<u8>| String::from_utf8(b).map_or(b"k".to_vec(), String::into_bytes);
        let keys = (0..keys).map(|_| key(random_bytes(rng))).collect();
        let args = (0..rng.usize(..5)).map(|_| random_bytes(rng)).collect();
        (keys, args)
    }

    /// Queues `entry` on `w`, its keys in `columns` columns.
    fn queue(w: &mut Written, columns: usize, (keys, args): &Model) -> Option<Span> {
        w.entry(columns, |mut e| {
            for k in keys {
                e = e.key(std::str::from_utf8(k).unwrap());
            }
            for a in args {
                e = e.arg(&a[..]);
            }
            e
        })
    }

    /// What a batch of `model` entries sends after the script's sha, their keys in
    /// `columns` columns (1: entry after entry).
    fn script_of(model: &[Model], columns: usize) -> Vec<Vec<u8>> {
        let nkeys: usize = model.iter().map(|(k, _)| k.len()).sum();
        let mut want = vec![nkeys.to_string().into_bytes()];
        for column in 0..columns {
            want.extend(
                model
                    .iter()
                    .flat_map(|(k, _)| k.iter().skip(column).step_by(columns).cloned()),
            );
        }
        want.extend(model.iter().flat_map(|(_, a)| a.iter().cloned()));
        want
    }

    fn check_script(w: &Written, columns: usize, spans: &[Span], model: &[Model]) {
        let mut cmd = Args::default();
        w.fill_script(&mut cmd);
        let got: Vec<Vec<u8>> = cmd.each().map(<[u8]>::to_vec).collect();
        assert_eq!(got, script_of(model, columns), "{columns} columns");
        assert_eq!(w.script_size().0, cmd.count());
        for (span, (keys, _)) in spans.iter().zip(model) {
            let count: usize = span.keys.iter().map(|p| p.count).sum();
            assert_eq!(count, keys.len());
        }
    }

    /// Entries queued, callers leaving, and batches split at random, a script's keys
    /// by row or by column: every batch sends the keys (entry after entry, or a column
    /// at a time), then the arguments, of exactly the entries it carries, in order. An
    /// entry that does not fit the layout is refused and leaves nothing behind.
    #[test]
    fn random_entries_left_out_and_split_send_what_their_batch_carries() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut spares = Spares::default();
        for round in 0..600 {
            // Half the rounds lay keys out by column: every entry has one per column.
            let columns = if round % 2 == 0 {
                1
            } else {
                rng.usize(2..=KEY_COLUMNS)
            };
            let keys = |rng: &mut fastrand::Rng| match columns {
                1 => rng.usize(..4),
                c => c,
            };
            let mut lane = spares.take();
            let (mut spans, mut model): (Vec<Span>, Vec<Model>) = (0..rng.usize(..12))
                .map(|_| {
                    let n = keys(&mut rng);
                    let entry = random_entry(&mut rng, n);
                    (queue(&mut lane, columns, &entry).unwrap(), entry)
                })
                .unzip();
            check_script(&lane, columns, &spans, &model);
            if columns > 1 {
                let more = [1, columns][rng.usize(..2)];
                let misfit = random_entry(&mut rng, columns + more);
                assert_eq!(queue(&mut lane, columns, &misfit), None);
                assert_eq!(queue(&mut lane, columns, &random_entry(&mut rng, 1)), None);
                check_script(&lane, columns, &spans, &model);
            }
            // Callers gone: left out.
            let keep: Vec<bool> = spans.iter().map(|_| rng.u8(..4) != 0).collect();
            let mut i = 0;
            model.retain(|_| (keep[i], i += 1).0);
            let mut i = 0;
            spans.retain(|_| (keep[i], i += 1).0);
            lane.retain(spans.iter_mut());
            check_script(&lane, columns, &spans, &model);
            // A batch takes the first `n`; the rest moves to the lane's next buffers,
            // where more queue behind it.
            let n = rng.usize(..=spans.len());
            let mut next = spares.take();
            lane.move_to(&mut next, spans[n..].iter_mut());
            check_script(&lane, columns, &spans[..n], &model[..n]);
            let (mut more_spans, more): (Vec<Span>, Vec<Model>) = (0..rng.usize(..3))
                .map(|_| {
                    let n = keys(&mut rng);
                    let entry = random_entry(&mut rng, n);
                    (queue(&mut next, columns, &entry).unwrap(), entry)
                })
                .unzip();
            let mut rest_spans = spans[n..].to_vec();
            rest_spans.append(&mut more_spans);
            let mut rest = model[n..].to_vec();
            rest.extend(more);
            check_script(&next, columns, &rest_spans, &rest);
            spares.give_back(lane);
            spares.give_back(next);
        }
    }

    /// A builder that panics halfway through its entry leaves none of it behind.
    #[test]
    fn an_entry_whose_builder_panics_leaves_nothing_behind() {
        let mut rng = fastrand::Rng::with_seed(13);
        for columns in [1, KEY_COLUMNS] {
            let mut w = Written::default();
            let first = random_entry(&mut rng, columns);
            let span = queue(&mut w, columns, &first).unwrap();
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                w.entry(columns, |e| {
                    let _half = e.key("half").arg("written");
                    panic!("a builder that fails");
                })
            }));
            assert!(panicked.is_err());
            let second = random_entry(&mut rng, columns);
            let next = queue(&mut w, columns, &second).unwrap();
            check_script(&w, columns, &[span, next], &[first, second]);
        }
    }

    /// Every script laid out by column reads no more key columns than a lane keeps.
    #[test]
    fn every_script_by_column_fits_the_key_columns() {
        use super::super::super::scripts::RELEASE;
        assert!((2..=KEY_COLUMNS).contains(&RELEASE.key_columns()));
        let mut w = Written::default();
        assert_eq!(w.entry(0, |e| e.arg("x")), None);
        assert_eq!(w.entry(KEY_COLUMNS + 1, |e| e.key("k")), None);
        assert_eq!(w.script_size(), (1, 20));
    }

    /// Commands queued, callers leaving, and batches split: the pipeline is exactly the
    /// commands its batch carries, in order, as redis-rs packs them.
    #[test]
    fn random_commands_left_out_and_split_pipeline_what_their_batch_carries() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..300 {
            let mut lane = Written::default();
            let mut queued: Vec<(Span, redis::Cmd)> = Vec::new();
            for _ in 0..rng.usize(..10) {
                let mut cmd = redis::cmd("SET");
                let args: Vec<Vec<u8>> = (0..rng.usize(..5))
                    .map(|_| random_bytes(&mut rng))
                    .collect();
                for a in &args {
                    cmd.arg(&a[..]);
                }
                let span = lane.command(|mut buf| {
                    buf.arg("SET");
                    for a in &args {
                        buf.arg(&a[..]);
                    }
                    buf
                });
                queued.push((span, cmd));
            }
            let packed = |q: &[(Span, redis::Cmd)]| -> Vec<u8> {
                q.iter().flat_map(|(_, c)| c.get_packed_command()).collect()
            };
            assert_eq!(lane.pipe().commands, packed(&queued));
            queued.retain(|_| rng.u8(..3) != 0);
            lane.retain(queued.iter_mut().map(|(s, _)| s));
            assert_eq!(lane.pipe().commands, packed(&queued));
            assert_eq!(lane.pipe().count, queued.len());
            let n = rng.usize(..=queued.len());
            let mut next = Written::default();
            lane.move_to(&mut next, queued[n..].iter_mut().map(|(s, _)| s));
            assert_eq!(lane.pipe().commands, packed(&queued[..n]));
            assert_eq!(lane.pipe().count, n);
            assert_eq!(next.pipe().commands, packed(&queued[n..]));
            assert_eq!(next.pipe().count, queued.len() - n);
            let pipeline = lane.pipe().to_pipeline();
            assert_eq!(pipeline.get_packed_pipeline(), packed(&queued[..n]));
        }
    }

    #[test]
    fn a_grown_buffer_is_not_kept() {
        let mut spares = Spares::default();
        let mut big = Written::default();
        big.command(|mut buf| {
            buf.arg(vec![b'x'; KEPT_CAPACITY + 1]);
            buf
        });
        spares.give_back(big);
        assert!(spares.0.is_empty());
        for _ in 0..SPARES + 2 {
            spares.give_back(Written::default());
        }
        assert_eq!(spares.0.len(), SPARES);
    }
}
