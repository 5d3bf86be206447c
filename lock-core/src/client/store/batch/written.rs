//! What a lane's queued calls send, written into buffers the lane keeps ([`Written`]) as
//! they queue: a queued call costs no buffer of its own (its entry or command is built
//! in a scratch buffer the lane reuses, then appended), and a batch's command is copied
//! from them as it is. A driver takes the buffers with its batch and gives them back
//! once its call is over, so a busy lane allocates none.

use super::super::args::{Args, Pipe};
use super::super::entry::Entry;

/// Buffers kept per lane for batches in flight; more are dropped when they come back.
const SPARES: usize = 4;
/// A buffer grown past this (a burst of large entries) is dropped rather than kept.
const KEPT_CAPACITY: usize = 64 * 1024;

/// Where one queued call's bytes are in its lane's [`Written`].
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct Span {
    keys: Part,
    rest: Part,
}

/// A run of bulk strings (or of commands) in one buffer, and how many.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Part {
    start: usize,
    end: usize,
    count: usize,
}

/// Bytes of queued calls back to back, and how many arguments (or commands) they are.
#[derive(Default)]
struct Buf {
    data: Vec<u8>,
    count: usize,
}

impl Buf {
    fn push(&mut self, bytes: &[u8], count: usize) -> Part {
        let start = self.data.len();
        self.data.extend_from_slice(bytes);
        self.count += count;
        Part {
            start,
            end: self.data.len(),
            count,
        }
    }

    fn bytes(&self, part: Part) -> &[u8] {
        &self.data[part.start..part.end]
    }

    /// Moves `part` down to `to` (where the bytes kept so far end), which it is at or
    /// after; `to` then ends after it.
    fn move_down(&mut self, part: &mut Part, to: &mut Part) {
        let len = part.end - part.start;
        if part.start != to.end {
            self.data.copy_within(part.start..part.end, to.end);
        }
        *part = Part {
            start: to.end,
            end: to.end + len,
            count: part.count,
        };
        to.end += len;
        to.count += part.count;
    }

    /// Keeps what ends at `kept` (see [`move_down`](Self::move_down)).
    fn cut(&mut self, kept: Part) {
        self.data.truncate(kept.end);
        self.count = kept.count;
    }

    fn clear(&mut self) {
        self.data.clear();
        self.count = 0;
    }
}

/// The calls queued on one lane since its last batch, written out: a script lane's
/// entries' keys (in `keys`) and arguments (in `rest`), which a batch sends as every
/// key, then every argument; or a command lane's whole commands (in `rest`), which a
/// batch sends as one pipeline.
#[derive(Default)]
pub(super) struct Written {
    keys: Buf,
    rest: Buf,
    /// Where the next entry or command is built, kept after each.
    scratch: Option<Args>,
}

impl Written {
    /// The scratch buffer, empty.
    fn scratch(&mut self) -> Args {
        let mut buf = self
            .scratch
            .take()
            .unwrap_or_else(|| Args::with_capacity(8, 256));
        buf.clear();
        buf
    }

    /// Appends the entry `build` writes (into the lane's scratch buffer): where it is.
    /// `None` if `build` returned another entry than the one it was given (nothing is
    /// appended).
    pub(super) fn entry(&mut self, build: impl FnOnce(Entry) -> Entry) -> Option<Span> {
        let packed = build(Entry::packed_in(self.scratch())).into_packed()?;
        let ((keys, nkeys), (args, nargs)) = (packed.keys(), packed.args());
        let span = Span {
            keys: self.keys.push(keys, nkeys),
            rest: self.rest.push(args, nargs),
        };
        self.scratch = Some(packed.into_buffer());
        Some(span)
    }

    /// Appends the command `build` writes (into the lane's scratch buffer, handed to
    /// it empty): where it is.
    pub(super) fn command(&mut self, build: impl FnOnce(Args) -> Args) -> Span {
        let cmd = build(self.scratch());
        let start = self.rest.data.len();
        cmd.write(&mut self.rest.data);
        self.rest.count += 1;
        let span = Span {
            keys: Part::default(),
            rest: Part {
                start,
                end: self.rest.data.len(),
                count: 1,
            },
        };
        self.scratch = Some(cmd);
        span
    }

    /// Arguments and bytes a script call of these entries takes after the script's
    /// name or sha (`numkeys`, keys, arguments), to size its command once.
    pub(super) fn script_size(&self) -> (usize, usize) {
        (
            1 + self.keys.count + self.rest.count,
            20 + self.keys.data.len() + self.rest.data.len(),
        )
    }

    /// The keys and arguments of a script call of these entries: `numkeys`, every
    /// entry's keys (in `columns` columns: see [`Lua::key_columns`]), then every
    /// entry's arguments.
    ///
    /// [`Lua::key_columns`]: super::super::scripts::Lua::key_columns
    pub(super) fn fill_script(&self, cmd: &mut Args, columns: usize) {
        cmd.arg(self.keys.count);
        if !cmd.push_bulks_by_column(&self.keys.data, self.keys.count, columns) {
            // Not whole rows: only a bug here writes such keys. The keys go entry after
            // entry, which a script laid out by column reads as other keys of its own
            // entries: a compare-and-delete then finds nothing of its grants to delete.
            debug_assert!(false, "{} keys are not rows of {columns}", self.keys.count);
            cmd.push_bulks(&self.keys.data, self.keys.count);
        }
        cmd.push_bulks(&self.rest.data, self.rest.count);
    }

    /// The commands of a command lane, as one pipeline.
    pub(super) fn pipe(&self) -> Pipe<'_> {
        Pipe {
            commands: &self.rest.data,
            count: self.rest.count,
        }
    }

    /// Keeps only the calls at `kept` (each span of this buffer's calls that stay, in
    /// order), moving their bytes together and updating each span.
    pub(super) fn retain<'s>(&mut self, kept: impl IntoIterator<Item = &'s mut Span>) {
        let (mut keys, mut rest) = (Part::default(), Part::default());
        for span in kept {
            self.keys.move_down(&mut span.keys, &mut keys);
            self.rest.move_down(&mut span.rest, &mut rest);
        }
        self.keys.cut(keys);
        self.rest.cut(rest);
    }

    /// Moves the calls at `moved` (the spans of this buffer's last calls, in order) to
    /// the end of `to`, updating each span.
    pub(super) fn move_to<'s>(
        &mut self,
        to: &mut Written,
        moved: impl IntoIterator<Item = &'s mut Span>,
    ) {
        let mut cut: Option<(Part, Part)> = None;
        for span in moved {
            let (keys, rest) = cut.get_or_insert((
                Part {
                    end: span.keys.start,
                    count: self.keys.count,
                    ..Part::default()
                },
                Part {
                    end: span.rest.start,
                    count: self.rest.count,
                    ..Part::default()
                },
            ));
            keys.count -= span.keys.count;
            rest.count -= span.rest.count;
            span.keys = to.keys.push(self.keys.bytes(span.keys), span.keys.count);
            span.rest = to.rest.push(self.rest.bytes(span.rest), span.rest.count);
        }
        if let Some((keys, rest)) = cut {
            self.keys.cut(keys);
            self.rest.cut(rest);
        }
    }

    /// Empty, and small enough to keep for another batch.
    fn reusable(mut self) -> Option<Self> {
        let small = |b: &Buf| b.data.capacity() <= KEPT_CAPACITY;
        if !small(&self.keys) || !small(&self.rest) {
            return None;
        }
        self.clear();
        if self
            .scratch
            .as_ref()
            .is_some_and(|s| s.capacity() > KEPT_CAPACITY)
        {
            self.scratch = None;
        }
        Some(self)
    }

    /// Empties these buffers (their calls are gone).
    pub(super) fn clear(&mut self) {
        self.keys.clear();
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

    /// Queues an entry of `keys` keys (any number up to 3 when `None`) on `w`.
    fn queue_entry(w: &mut Written, rng: &mut fastrand::Rng, keys: Option<usize>) -> (Span, Model) {
        let n = keys.unwrap_or_else(|| rng.usize(..4));
        let keys: Vec<Vec<u8>> = (0..n).map(|_| random_bytes(rng)).collect();
        let args: Vec<Vec<u8>> = (0..rng.usize(..5)).map(|_| random_bytes(rng)).collect();
        let span = w
            .entry(|mut e| {
                for k in &keys {
                    e = e.key(std::str::from_utf8(k).unwrap_or("k"));
                }
                for a in &args {
                    e = e.arg(&a[..]);
                }
                e
            })
            .unwrap();
        let keys = keys
            .into_iter()
            .map(|k| String::from_utf8(k).map_or(b"k".to_vec(), String::into_bytes))
            .collect();
        (span, (keys, args))
    }

    /// What a batch of `model` entries sends after the script's sha, its keys in
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

    fn check_script(w: &Written, spans: &[Span], model: &[Model]) {
        // Entries of one key count also go by column (1 column is rows).
        let same = model
            .first()
            .map(|(k, _)| k.len())
            .filter(|&k| model.iter().all(|(keys, _)| keys.len() == k));
        for columns in [Some(1), same.filter(|&k| k > 1)].into_iter().flatten() {
            let mut cmd = Args::default();
            w.fill_script(&mut cmd, columns);
            let got: Vec<Vec<u8>> = cmd.each().map(<[u8]>::to_vec).collect();
            assert_eq!(got, script_of(model, columns), "{columns} columns");
            assert_eq!(w.script_size().0, cmd.count());
        }
        for (span, (keys, _)) in spans.iter().zip(model) {
            assert_eq!(span.keys.count, keys.len());
        }
    }

    /// Entries queued, callers leaving, and batches split at random: every batch sends
    /// the keys (entry after entry, or a column at a time), then the arguments, of
    /// exactly the entries it carries, in order.
    #[test]
    fn random_entries_left_out_and_split_send_what_their_batch_carries() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut spares = Spares::default();
        for round in 0..600 {
            // Half the rounds queue entries of one key count (a script's layout).
            let keys = (round % 2 == 0).then(|| rng.usize(..4));
            let mut lane = spares.take();
            let (mut spans, mut model): (Vec<Span>, Vec<Model>) = (0..rng.usize(..12))
                .map(|_| queue_entry(&mut lane, &mut rng, keys))
                .unzip();
            check_script(&lane, &spans, &model);
            // Callers gone: left out.
            let keep: Vec<bool> = spans.iter().map(|_| rng.u8(..4) != 0).collect();
            let mut i = 0;
            model.retain(|_| (keep[i], i += 1).0);
            let mut i = 0;
            spans.retain(|_| (keep[i], i += 1).0);
            lane.retain(spans.iter_mut());
            check_script(&lane, &spans, &model);
            // A batch takes the first `n`; the rest moves to the lane's next buffers,
            // where more queue behind it.
            let n = rng.usize(..=spans.len());
            let mut next = spares.take();
            lane.move_to(&mut next, spans[n..].iter_mut());
            check_script(&lane, &spans[..n], &model[..n]);
            let (mut more_spans, more): (Vec<Span>, Vec<Model>) = (0..rng.usize(..3))
                .map(|_| queue_entry(&mut next, &mut rng, keys))
                .unzip();
            let mut rest_spans = spans[n..].to_vec();
            rest_spans.append(&mut more_spans);
            let mut rest = model[n..].to_vec();
            rest.extend(more);
            check_script(&next, &rest_spans, &rest);
            spares.give_back(lane);
            spares.give_back(next);
        }
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
