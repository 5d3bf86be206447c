//! The figures every benchmark returns, and the markdown table `bench all` prints.

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
        }
    }

    /// A value without a baseline (e.g. the seckill throughput).
    pub fn alone(name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self {
            name: name.into(),
            value,
            baseline: None,
            unit,
            target: None,
        }
    }

    /// With a target ratio (at least).
    pub fn target(mut self, target: f64) -> Self {
        self.target = Some(target);
        self
    }

    /// `value / baseline`.
    pub fn ratio(&self) -> Option<f64> {
        self.baseline.map(|b| self.value / b)
    }
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
        let ratio = f.ratio().map_or("-".into(), |r| format!("{r:.2}"));
        let target = match (f.target, f.ratio()) {
            (Some(t), Some(r)) if r >= t => format!(">= {t} (met)"),
            (Some(t), Some(_)) => format!(">= {t} (missed)"),
            _ => "-".into(),
        };
        out.push_str(&format!(
            "| {bench} | {} | {} {} | {} | {ratio} | {target} |\n",
            f.name,
            number(f.value),
            f.unit,
            f.baseline.map_or("-".into(), number),
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
}
