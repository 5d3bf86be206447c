//! The markdown table `bench all` prints, and the run's summary lines.
//!
//! A figure is disturbed when its per-round ratios disagree by more than
//! [`MAX_ROUND_SPREAD`] (see [`Figure::disturbed`]); its ratio then renders as
//! `DISTURBED`, and a target is judged only where every round meets it, or every round
//! misses it. A disturbed figure with a target its rounds straddle, or with no target,
//! is undecided ([`Figure::undecided`]), and the run is then not a result.

use crate::figure::{Figure, PerOp};
use crate::measure::MAX_ROUND_SPREAD;

/// How many of `figures` are disturbed.
pub fn disturbed_count<'a>(figures: impl IntoIterator<Item = &'a Figure>) -> usize {
    figures
        .into_iter()
        .filter(|f| f.disturbed().is_some())
        .count()
}

/// How many of `figures` are undecided ([`Figure::undecided`]).
pub fn undecided_count<'a>(figures: impl IntoIterator<Item = &'a Figure>) -> usize {
    figures.into_iter().filter(|f| f.undecided()).count()
}

/// The run's summary line: how many of `total` figures were disturbed, and how many of
/// those left a target undecided.
pub fn summary(total: usize, disturbed: usize, undecided: usize) -> String {
    format!(
        "figures: {total}, disturbed: {disturbed}, undecided: {undecided} (per-round ratio \
         spread bound {MAX_ROUND_SPREAD:.2})"
    )
}

/// Why a run with an undecided figure is not a result.
pub fn not_a_result() -> String {
    format!(
        "the per-round ratios of a figure disagree by more than {:.0}%, and on which side of \
         its target they fall: rerun on a quieter machine; this run is not a result",
        MAX_ROUND_SPREAD * 100.0
    )
}

/// A value for the table: `5.12M`, `39.2k`, `679`, `0.95`.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        format!("{v}")
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// One instruction cell: `ours / baseline (ratio)` of one side (`pick` chooses client
/// or server), the ratio being ours over the baseline (above 1 = ours costs more);
/// `-` where that side was not counted.
fn instructions(counts: Option<[PerOp; 2]>, pick: fn(&PerOp) -> Option<f64>) -> String {
    let Some([ours, base]) = counts else {
        return "-".into();
    };
    match (pick(&ours), pick(&base)) {
        (Some(a), Some(b)) => format!("{} / {} ({:.2}x)", number(a), number(b), a / b),
        (Some(a), None) => format!("{} / -", number(a)),
        (None, Some(b)) => format!("- / {}", number(b)),
        (None, None) => "-".into(),
    }
}

/// The markdown table: bench | figure | ours | baseline | ratio | spread | client and
/// server instructions per operation (ours / baseline) | target.
pub fn table(rows: &[(&str, Figure)]) -> String {
    let mut out = String::from(
        "| bench | figure | ours | baseline | ratio | spread | instr/op client: ours / baseline \
         | instr/op redis: ours / baseline | target |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (bench, f) in rows {
        out.push_str(&format!(
            "| {bench} | {} | {} {} | {} | {} | {} | {} | {} | {} |\n",
            f.name,
            number(f.ours),
            f.unit,
            f.baseline.map_or("-".into(), number),
            f.ratio_text(),
            f.spread_text(),
            instructions(f.instructions, |p| p.client),
            instructions(f.instructions, |p| p.server),
            f.target_text(),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(client: f64, server: f64) -> PerOp {
        PerOp {
            client: Some(client),
            server: Some(server),
        }
    }

    #[test]
    fn table_rows() {
        let mut segment = Figure::rounds(
            "segment_vs_per_id",
            "ids/s",
            &[2.0e6, 2.2e6, 2.1e6],
            &[5.0e4, 5.5e4, 5.0e4],
        )
        .target(20.0);
        segment.instructions = Some([
            PerOp {
                client: Some(1200.0),
                server: None,
            },
            both(44_600.0, 21_300.0),
        ]);
        let rows = [
            ("ids", segment),
            ("lock", Figure::alone("hot_longest_wait_ms", 4321.4, "ms")),
        ];
        let t = table(&rows);
        assert!(
            t.starts_with(
                "| bench | figure | ours | baseline | ratio | spread | instr/op client: ours / \
                 baseline | instr/op redis: ours / baseline | target |\n| --- |"
            ),
            "{t}"
        );
        // Ratios 40, 40, 42: median 40, spread 2 / 40.
        assert!(
            t.contains(
                "| ids | segment_vs_per_id | 2.10M ids/s | 50.0k | 40.00 | 0.05 \
                 | 1200 / 44.6k (0.03x) | - / 21.3k | >= 20 (met) |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| lock | hot_longest_wait_ms | 4321 ms | - | - | - | - | - | - |"),
            "{t}"
        );
    }

    #[test]
    fn missed_and_disturbed_figures_stay_marked() {
        let mut missed = Figure::rounds(
            "ours_vs_floor_64_tasks",
            "cycles/s",
            &[80.0, 40.0, 81.0],
            &[100.0, 50.0, 100.0],
        )
        .target(0.9);
        missed.instructions = Some([both(44_600.0, 30_000.0), both(21_300.0, 12_000.0)]);
        let rows = [
            ("lock", missed),
            (
                "lock",
                Figure::rounds("ours_vs_rslock_1_tasks", "cycles/s", &[3.0, 2.0], &[2.0; 2])
                    .target(1.3),
            ),
        ];
        let t = table(&rows);
        assert!(
            t.contains(
                "| lock | ours_vs_floor_64_tasks | 80.00 cycles/s | 100 | 0.80 | 0.01 \
                 | 44.6k / 21.3k (2.09x) | 30.0k / 12.0k (2.50x) | >= 0.9 (missed) |"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "| lock | ours_vs_rslock_1_tasks | 2.50 cycles/s | 2.00 | DISTURBED | 0.40 \
                 | - | - | >= 1.3 (not judged: disturbed) |"
            ),
            "{t}"
        );
        assert_eq!(disturbed_count(rows.iter().map(|(_, f)| f)), 1);
        assert_eq!(undecided_count(rows.iter().map(|(_, f)| f)), 1);
    }

    #[test]
    fn numbers() {
        assert_eq!(number(5_123_456.0), "5.12M");
        assert_eq!(number(39_240.0), "39.2k");
        assert_eq!(number(9_999.0), "9999");
        assert_eq!(number(0.954), "0.95");
        assert_eq!(number(f64::NAN), "NaN");
    }

    #[test]
    fn summary_lines() {
        assert_eq!(
            summary(5, 2, 1),
            "figures: 5, disturbed: 2, undecided: 1 (per-round ratio spread bound 0.15)"
        );
        assert_eq!(
            not_a_result(),
            "the per-round ratios of a figure disagree by more than 15%, and on which side \
             of its target they fall: rerun on a quieter machine; this run is not a result"
        );
    }
}
