//! [`Figure`]: one comparison of a benchmark, judged on its per-round ratios.
//!
//! Both sides of a figure are measured in the same interleaved rounds, so each round
//! gives one ratio of the two, taken seconds apart on the same machine. A host that
//! steals CPU moves both sides of a round together and leaves their ratio alone, while
//! it can move one side's absolute rates by 2x between rounds. The figure's ratio is
//! therefore the median of its per-round ratios, and it is disturbed only when those
//! ratios disagree: their [`spread`] (middle rounds, as [`trimmed`](crate::measure::trimmed))
//! above [`MAX_ROUND_SPREAD`].

use crate::measure::{MAX_ROUND_SPREAD, exceeds_bound, median, spread};

/// Instructions per operation of one implementation, counted by callgrind: in this
/// process (`client`) and in redis-server (`server`), each where measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerOp {
    pub client: Option<f64>,
    pub server: Option<f64>,
}

/// One row of the table: ours beside its baseline from the same rounds.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What was measured (`ours_vs_floor_64_tasks`, ...).
    pub name: String,
    /// The unit of `ours` and `baseline`.
    pub unit: &'static str,
    /// Our median over the rounds.
    pub ours: f64,
    /// The baseline's median (the floor, the same work by hand, the peer crate), if any.
    pub baseline: Option<f64>,
    /// One ratio per round, in round order, "above 1 = ours better": ours over the
    /// baseline, or the baseline over ours when lower is better.
    pub ratios: Vec<f64>,
    /// The least acceptable ratios the project sets (each judged alone: an engine's
    /// target and a later, stricter one can stand side by side).
    pub targets: Vec<f64>,
    /// The most client instructions per operation the project accepts, as multiples of
    /// the baseline's (judged where [`instructions`](Self::instructions) are counted).
    pub instruction_targets: Vec<f64>,
    /// Instructions per operation, ours then the baseline's, where counted.
    pub instructions: Option<[PerOp; 2]>,
}

impl Figure {
    /// Ours against the baseline where higher is better (rates): per-round values in
    /// round order, round `r` of both measured in the same round.
    pub fn rounds(name: impl Into<String>, unit: &'static str, ours: &[f64], base: &[f64]) -> Self {
        let ratios = ours.iter().zip(base).map(|(a, b)| a / b).collect();
        Self::with_ratios(name.into(), unit, ours, base, ratios)
    }

    /// As [`rounds`](Self::rounds) where lower is better (latencies): the per-round
    /// ratios are the baseline's value over ours.
    pub fn lower_is_better(
        name: impl Into<String>,
        unit: &'static str,
        ours: &[f64],
        base: &[f64],
    ) -> Self {
        let ratios = ours.iter().zip(base).map(|(a, b)| b / a).collect();
        Self::with_ratios(name.into(), unit, ours, base, ratios)
    }

    fn with_ratios(
        name: String,
        unit: &'static str,
        ours: &[f64],
        base: &[f64],
        ratios: Vec<f64>,
    ) -> Self {
        Self {
            name,
            unit,
            ours: median(ours.iter().copied()),
            baseline: Some(median(base.iter().copied())),
            ratios,
            targets: Vec::new(),
            instruction_targets: Vec::new(),
            instructions: None,
        }
    }

    /// A value without a baseline (the hot key's fairness figures): informational, it
    /// has no ratio, is never disturbed and never fails a run, however its rounds drift.
    pub fn alone(name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self {
            name: name.into(),
            unit,
            ours: value,
            baseline: None,
            ratios: Vec::new(),
            targets: Vec::new(),
            instruction_targets: Vec::new(),
            instructions: None,
        }
    }

    /// With a target ratio (at least), beside any set before.
    pub fn target(self, target: f64) -> Self {
        self.targets(&[target])
    }

    /// With these target ratios (each at least), beside any set before.
    pub fn targets(mut self, targets: &[f64]) -> Self {
        self.targets.extend_from_slice(targets);
        self
    }

    /// With targets for the client's instructions per operation: each at most that
    /// many times the baseline's.
    pub fn instruction_targets(mut self, times: &[f64]) -> Self {
        self.instruction_targets.extend_from_slice(times);
        self
    }

    /// Our client instructions per operation over the baseline's, where both are
    /// counted.
    pub fn client_instructions_ratio(&self) -> Option<f64> {
        let [ours, base] = self.instructions?;
        Some(ours.client? / base.client?)
    }

    /// The median of the per-round ratios; `None` without a baseline.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.map(|_| median(self.ratios.iter().copied()))
    }

    /// How far the per-round ratios disagree ([`spread`]); `None` without a baseline.
    pub fn spread(&self) -> Option<f64> {
        self.baseline.map(|_| spread(self.ratios.iter().copied()))
    }

    /// The spread of the per-round ratios when it exceeds [`MAX_ROUND_SPREAD`]: the
    /// figure is then not a result.
    pub fn disturbed(&self) -> Option<f64> {
        self.spread().filter(|s| exceeds_bound(*s))
    }

    /// Where the rounds stand on target `t`: `Some(true)` when every round's ratio meets
    /// it, `Some(false)` when every one misses it, `None` when they fall on both sides
    /// or there are none.
    pub fn every_round(&self, t: f64) -> Option<bool> {
        if self.ratios.is_empty() {
            None
        } else if self.ratios.iter().all(|&r| r >= t) {
            Some(true)
        } else if self.ratios.iter().all(|&r| r < t) {
            Some(false)
        } else {
            None
        }
    }

    /// Whether the figure leaves its question open: disturbed, and either without a
    /// target or with one that its rounds fall on both sides of. A disturbed figure
    /// whose every round meets (or misses) each target still answers it: the rounds
    /// disagree on the number, not on the verdict.
    pub fn undecided(&self) -> bool {
        self.disturbed().is_some()
            && (self.targets.is_empty()
                || self.targets.iter().any(|&t| self.every_round(t).is_none()))
    }

    /// The ratio as printed: `DISTURBED` for a disturbed figure (the rounds disagree,
    /// so no one number stands for them), else two decimals, `-` without a baseline.
    pub fn ratio_text(&self) -> String {
        match (self.disturbed(), self.ratio()) {
            (Some(_), _) => "DISTURBED".into(),
            (None, Some(r)) => format!("{r:.2}"),
            (None, None) => "-".into(),
        }
    }

    /// The spread with two decimals, `-` without a baseline.
    pub fn spread_text(&self) -> String {
        self.spread().map_or("-".into(), |s| format!("{s:.2}"))
    }

    /// The targets as printed, `; ` between them: `>= t (met)`, `>= t (missed)`; for a
    /// disturbed figure `>= t (met in every round)`, `>= t (missed in every round)` or
    /// `>= t (not judged: disturbed)`; then `client instr <= tx (met)`, `(missed)` or
    /// `(not counted)`; `-` without a target.
    pub fn target_text(&self) -> String {
        let ratio = self.ratio();
        let ratios = self.targets.iter().map(|&t| match ratio {
            _ if self.disturbed().is_some() => match self.every_round(t) {
                Some(true) => format!(">= {t} (met in every round)"),
                Some(false) => format!(">= {t} (missed in every round)"),
                None => format!(">= {t} (not judged: disturbed)"),
            },
            Some(r) if r >= t => format!(">= {t} (met)"),
            Some(_) => format!(">= {t} (missed)"),
            None => format!(">= {t} (no baseline)"),
        });
        let counted = self.client_instructions_ratio();
        let instructions = self.instruction_targets.iter().map(|&t| match counted {
            Some(r) if r <= t => format!("client instr <= {t}x (met)"),
            Some(_) => format!("client instr <= {t}x (missed)"),
            None => format!("client instr <= {t}x (not counted)"),
        });
        let all: Vec<String> = ratios.chain(instructions).collect();
        if all.is_empty() {
            "-".into()
        } else {
            all.join("; ")
        }
    }

    /// The `ratio` line a benchmark prints: `ratio <name> <ratio> spread <s> rounds
    /// <r1 r2 ..>`, and below it, if disturbed, `disturbed <name> ratio spread <s>
    /// (bound 0.15)`.
    pub fn ratio_line(&self) -> String {
        let rounds: Vec<String> = self.ratios.iter().map(|r| format!("{r:.2}")).collect();
        let mut line = format!(
            "ratio {} {} spread {} rounds {}",
            self.name,
            self.ratio_text(),
            self.spread_text(),
            rounds.join(" ")
        );
        if let Some(s) = self.disturbed() {
            line += &format!(
                "\ndisturbed {} ratio spread {s:.2} (bound {MAX_ROUND_SPREAD:.2})",
                self.name
            );
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn ratio_is_the_median_of_per_round_ratios() {
        // The absolute rates drift 2.5x over the rounds; the ratio holds.
        let ours = [100.0, 160.0, 250.0];
        let base = [50.0, 80.0, 125.0];
        let f = Figure::rounds("x", "ops/s", &ours, &base);
        assert_eq!(f.ratios, [2.0, 2.0, 2.0]);
        assert!(close(f.ratio().unwrap(), 2.0));
        assert_eq!(f.spread(), Some(0.0));
        assert_eq!(f.disturbed(), None);
        assert_eq!((f.ours, f.baseline), (160.0, Some(80.0)));
        // Not the ratio of the medians: ours 1, 4, 3 over 1, 2, 2.
        let f = Figure::rounds("y", "ops/s", &[1.0, 4.0, 3.0], &[1.0, 2.0, 2.0]);
        assert!(close(f.ratio().unwrap(), 1.5), "{:?}", f.ratios);
        assert!(close(f.ours / f.baseline.unwrap(), 1.5));
        let f = Figure::rounds("z", "ops/s", &[1.0, 4.0, 9.0], &[1.0, 2.0, 2.0]);
        assert!(close(f.ratio().unwrap(), 2.0));
    }

    #[test]
    fn disturbed_only_when_the_ratios_disagree() {
        // Ratios 1.0, 1.3, 1.0: spread 0.3, on both sides of 1.2.
        let f = Figure::rounds("x", "ops/s", &[100.0, 130.0, 100.0], &[100.0; 3]).target(1.2);
        assert!(close(f.disturbed().unwrap(), 0.3));
        assert_eq!(f.ratio_text(), "DISTURBED");
        assert_eq!(f.target_text(), ">= 1.2 (not judged: disturbed)");
        // Five rounds: the outermost ratio on each side is set aside, as for rates.
        let ours = [100.0, 100.0, 101.0, 99.0, 300.0];
        let f = Figure::rounds("x", "ops/s", &ours, &[100.0; 5]);
        // Middle ratios 1.0, 1.0, 1.01: (1.01 - 1.0) / 1.0.
        assert!(close(f.spread().unwrap(), 0.01), "{:?}", f.spread());
        assert_eq!(f.disturbed(), None);
        // A zero baseline in one round: no meaningful ratio, disturbed.
        let f = Figure::rounds("x", "ops/s", &[1.0, 1.0], &[1.0, 0.0]);
        assert_eq!(f.disturbed(), Some(f64::INFINITY));
    }

    #[test]
    fn a_disturbed_figure_is_judged_only_where_every_round_agrees() {
        // Ratios 1.6 to 2.5: disturbed (middle rounds 1.9 to 2.4 over 2.0), yet every
        // round is above 1.3 and below 2.6.
        let ours = [190.0, 250.0, 200.0, 240.0, 160.0];
        let f = Figure::rounds("x", "ops/s", &ours, &[100.0; 5]).targets(&[1.3, 2.6]);
        assert!(close(f.disturbed().unwrap(), 0.25), "{:?}", f.spread());
        assert_eq!(f.ratio_text(), "DISTURBED");
        assert_eq!(
            f.target_text(),
            ">= 1.3 (met in every round); >= 2.6 (missed in every round)"
        );
        assert!(!f.undecided());
        // Rounds on both sides of a target leave it open, and the figure undecided.
        let f = Figure::rounds("x", "ops/s", &ours, &[100.0; 5]).targets(&[1.3, 2.2]);
        assert_eq!(
            f.target_text(),
            ">= 1.3 (met in every round); >= 2.2 (not judged: disturbed)"
        );
        assert!(f.undecided());
        // Without a target a disturbed figure answers nothing.
        assert!(Figure::rounds("x", "ops/s", &ours, &[100.0; 5]).undecided());
        // A round exactly on the target meets it.
        let f = Figure::rounds("x", "ops/s", &[130.0, 200.0], &[100.0; 2]).target(1.3);
        assert_eq!(f.every_round(1.3), Some(true));
        // An undisturbed figure is decided by its median, whatever one round says.
        let f = Figure::rounds("x", "ops/s", &[100.0, 101.0, 99.0], &[100.0; 3]).target(1.0);
        assert!(f.disturbed().is_none() && !f.undecided());
        assert_eq!(f.every_round(1.0), None);
        assert_eq!(f.target_text(), ">= 1 (met)");
    }

    #[test]
    fn lower_is_better_inverts_the_ratio() {
        let f = Figure::lower_is_better("p99", "ms", &[200.0, 400.0], &[100.0, 200.0]);
        assert_eq!(f.ratios, [0.5, 0.5]);
        assert_eq!((f.ours, f.baseline), (300.0, Some(150.0)));
        assert_eq!(f.target(0.5).target_text(), ">= 0.5 (met)");
    }

    #[test]
    fn alone_is_never_judged() {
        let f = Figure::alone("longest_wait_ms", 12.5, "ms");
        assert_eq!((f.ratio(), f.spread(), f.disturbed()), (None, None, None));
        assert_eq!((f.ratio_text(), f.spread_text()), ("-".into(), "-".into()));
        assert_eq!(f.target_text(), "-");
    }

    #[test]
    fn ratio_lines() {
        let f = Figure::rounds("a_vs_b", "ops/s", &[150.0, 200.0, 180.0], &[100.0; 3]);
        assert_eq!(
            f.ratio_line(),
            "ratio a_vs_b DISTURBED spread 0.28 rounds 1.50 2.00 1.80\n\
             disturbed a_vs_b ratio spread 0.28 (bound 0.15)"
        );
        let f = Figure::rounds("a_vs_b", "ops/s", &[150.0, 160.0, 155.0], &[100.0; 3]);
        assert_eq!(
            f.ratio_line(),
            "ratio a_vs_b 1.55 spread 0.06 rounds 1.50 1.60 1.55"
        );
        assert_eq!(
            f.target(1.6).target_text(),
            ">= 1.6 (missed)",
            "a miss stays marked"
        );
    }

    #[test]
    fn each_target_is_judged_alone() {
        let f = Figure::rounds("a_vs_b", "ops/s", &[115.0, 120.0, 118.0], &[100.0; 3])
            .targets(&[1.0, 1.3])
            .instruction_targets(&[1.15, 0.7]);
        assert_eq!(
            f.target_text(),
            ">= 1 (met); >= 1.3 (missed); client instr <= 1.15x (not counted); \
             client instr <= 0.7x (not counted)"
        );
        let counted = |client: f64| PerOp {
            client: Some(client),
            server: None,
        };
        let mut f = f;
        f.instructions = Some([counted(23_600.0), counted(21_500.0)]);
        assert_eq!(
            f.target_text(),
            ">= 1 (met); >= 1.3 (missed); client instr <= 1.15x (met); \
             client instr <= 0.7x (missed)"
        );
        let f = Figure::rounds("x", "ops/s", &[1.0], &[1.0]).instruction_targets(&[1.15]);
        assert_eq!(f.client_instructions_ratio(), None);
    }
}
