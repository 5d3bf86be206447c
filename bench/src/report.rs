//! The figures every benchmark returns, and the markdown table `bench all` prints.
//!
//! A figure computed from a disturbed measurement (its rounds disagree by more than
//! [`MAX_ROUND_SPREAD`]) carries that spread; its ratio is then not a result and
//! renders as `DISTURBED (spread x.xx)`, and its target is not judged.

use crate::measure::MAX_ROUND_SPREAD;

/// One row of the table: a measured value beside its baseline from the same run.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What was measured (`ours_vs_floor_64_tasks`, ...).
    pub name: String,
    /// Our median.
    pub value: f64,
    /// The baseline's median (the floor or the peer crate), if there is one.
    pub baseline: Option<f64>,
    /// The unit of `value` and `baseline`.
    pub unit: &'static str,
    /// The least acceptable `value / baseline`, if the project sets one.
    pub target: Option<f64>,
    /// The largest round spread of the implementations `value` and `baseline` came
    /// from, if any exceeded [`MAX_ROUND_SPREAD`]: the figure is then not a result.
    pub disturbed: Option<f64>,
}

impl Figure {
    /// `value` against `baseline`, no target.
    pub fn vs(name: impl Into<String>, value: f64, baseline: f64, unit: &'static str) -> Self {
        Self {
            name: name.into(),
            value,
            baseline: Some(baseline),
            unit,
            target: None,
            disturbed: None,
        }
    }

    /// Implementation `a`'s median against `b`'s, out of one measurement's medians
    /// `rates` and round spreads `spreads` (as [`crate::measure::check_all`] returns
    /// them): disturbed if either side was.
    pub fn between(
        name: impl Into<String>,
        (a, b): (usize, usize),
        rates: &[f64],
        spreads: &[Option<f64>],
        unit: &'static str,
    ) -> Self {
        Self::vs(name, rates[a], rates[b], unit)
            .disturbed_by(spreads[a])
            .disturbed_by(spreads[b])
    }

    /// A value without a baseline (e.g. the seckill throughput).
    pub fn alone(name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self {
            name: name.into(),
            value,
            baseline: None,
            unit,
            target: None,
            disturbed: None,
        }
    }

    /// With a target ratio (at least).
    pub fn target(mut self, target: f64) -> Self {
        self.target = Some(target);
        self
    }

    /// Marks the figure disturbed when `spread` is `Some` (the spread of a disturbed
    /// implementation behind `value` or `baseline`, as `measure::check_rounds` returns
    /// it); `None` leaves it as it is. Keeps the largest spread when called repeatedly.
    pub fn disturbed_by(mut self, spread: Option<f64>) -> Self {
        if let Some(s) = spread {
            self.disturbed = Some(self.disturbed.map_or(s, |d| d.max(s)));
        }
        self
    }

    /// `value / baseline`.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.map(|b| self.value / b)
    }

    /// The ratio as printed: `DISTURBED (spread x.xx)` for a disturbed figure, else
    /// the ratio with two decimals, `-` without a baseline.
    pub fn ratio_text(&self) -> String {
        match (self.disturbed, self.ratio()) {
            (Some(s), _) => disturbed_text(s),
            (None, Some(r)) => format!("{r:.2}"),
            (None, None) => "-".into(),
        }
    }

    /// The target as printed: `>= t (met)`, `>= t (missed)`, `>= t (not judged:
    /// disturbed)`, or `-` without a target or baseline.
    pub fn target_text(&self) -> String {
        match (self.target, self.ratio()) {
            (Some(t), Some(_)) if self.disturbed.is_some() => {
                format!(">= {t} (not judged: disturbed)")
            }
            (Some(t), Some(r)) if r >= t => format!(">= {t} (met)"),
            (Some(t), Some(_)) => format!(">= {t} (missed)"),
            _ => "-".into(),
        }
    }
}

/// The ratio cell of a figure whose rounds spread by `spread`.
pub fn disturbed_text(spread: f64) -> String {
    format!("DISTURBED (spread {spread:.2})")
}

/// A ratio line's value, `a / b` with two decimals, or [`disturbed_text`] with the
/// larger spread if either side's measurement was disturbed.
pub fn ratio_text(a: f64, b: f64, spreads: [Option<f64>; 2]) -> String {
    match spreads.into_iter().flatten().reduce(f64::max) {
        Some(s) => disturbed_text(s),
        None => format!("{:.2}", a / b),
    }
}

/// How many of `figures` are disturbed.
pub fn disturbed_count<'a>(figures: impl IntoIterator<Item = &'a Figure>) -> usize {
    figures
        .into_iter()
        .filter(|f| f.disturbed.is_some())
        .count()
}

/// The run's summary line: how many of `total` figures were disturbed.
pub fn summary(total: usize, disturbed: usize) -> String {
    format!(
        "figures: {total}, disturbed: {disturbed} (middle-round spread bound {MAX_ROUND_SPREAD:.2})"
    )
}

/// Why a run with a disturbed figure is not a result.
pub fn not_a_result() -> String {
    format!(
        "middle rounds disagree by more than {:.0}%: rerun on a quiet machine; this run is not a result",
        MAX_ROUND_SPREAD * 100.0
    )
}

fn number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The markdown table: bench | figure | value | baseline | ratio | target.
pub fn table(rows: &[(&str, Figure)]) -> String {
    let mut out = String::from(
        "| bench | figure | value | baseline | ratio | target |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for (bench, f) in rows {
        out.push_str(&format!(
            "| {bench} | {} | {} {} | {} | {} | {} |\n",
            f.name,
            number(f.value),
            f.unit,
            f.baseline.map_or("-".into(), number),
            f.ratio_text(),
            f.target_text(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows() {
        let rows = [
            (
                "ids",
                Figure::vs("segment_vs_per_id", 2.0e6, 5.0e4, "ids/s").target(20.0),
            ),
            ("seckill", Figure::alone("throughput", 4321.4, "requests/s")),
        ];
        let t = table(&rows);
        assert!(
            t.contains("| ids | segment_vs_per_id | 2000000 ids/s | 50000 | 40.00 | >= 20 (met) |"),
            "{t}"
        );
        assert!(
            t.contains("| seckill | throughput | 4321 requests/s | - | - | - |"),
            "{t}"
        );
    }

    #[test]
    fn missed_target_stays_marked() {
        let rows = [(
            "lock",
            Figure::vs("ours_vs_floor_64_tasks", 80.0, 100.0, "cycles/s").target(0.9),
        )];
        let t = table(&rows);
        assert!(
            t.contains(
                "| lock | ours_vs_floor_64_tasks | 80.00 cycles/s | 100 | 0.80 | >= 0.9 (missed) |"
            ),
            "{t}"
        );
    }

    #[test]
    fn disturbed_figure_has_no_ratio() {
        let rows = [
            (
                "lock",
                Figure::vs("ours_vs_rslock_1_tasks", 300.0, 200.0, "cycles/s")
                    .target(1.3)
                    .disturbed_by(Some(0.18))
                    .disturbed_by(None)
                    .disturbed_by(Some(0.234)),
            ),
            (
                "lock",
                Figure::alone("hot_rslock_longest_wait_ms", 12.5, "ms").disturbed_by(Some(0.5)),
            ),
            (
                "lock",
                Figure::vs("ours_vs_floor_1_tasks", 95.0, 100.0, "cycles/s")
                    .target(0.9)
                    .disturbed_by(None),
            ),
        ];
        let t = table(&rows);
        assert!(
            t.contains(
                "| lock | ours_vs_rslock_1_tasks | 300 cycles/s | 200 | DISTURBED (spread 0.23) \
                 | >= 1.3 (not judged: disturbed) |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| lock | hot_rslock_longest_wait_ms | 12.50 ms | - | DISTURBED (spread 0.50) | - |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| lock | ours_vs_floor_1_tasks | 95.00 cycles/s | 100 | 0.95 | >= 0.9 (met) |"
            ),
            "{t}"
        );
        assert!(!t.contains("1.50"), "no ratio for a disturbed figure: {t}");
        assert_eq!(disturbed_count(rows.iter().map(|(_, f)| f)), 2);
    }

    #[test]
    fn ratio_lines_and_summary() {
        assert_eq!(ratio_text(3.0, 2.0, [None, None]), "1.50");
        assert_eq!(
            ratio_text(3.0, 2.0, [Some(0.2), Some(0.31)]),
            "DISTURBED (spread 0.31)"
        );
        assert_eq!(
            ratio_text(3.0, 2.0, [None, Some(0.2)]),
            "DISTURBED (spread 0.20)"
        );
        assert_eq!(
            summary(5, 0),
            "figures: 5, disturbed: 0 (middle-round spread bound 0.15)"
        );
        assert_eq!(
            summary(5, 2),
            "figures: 5, disturbed: 2 (middle-round spread bound 0.15)"
        );
        assert_eq!(
            not_a_result(),
            "middle rounds disagree by more than 15%: rerun on a quiet machine; this run is not a result"
        );
    }
}
