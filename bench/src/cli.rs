//! The command line: `lock-bench [<bench>|all|instructions [<bench>..]] [options]`, and
//! the hidden `ops` subcommand the instruction counts run.

use crate::measure::BoxError;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// One benchmark of `BENCHES`, by name (checked by the caller).
    Bench(String),
    /// Every benchmark, the instruction counts (unless `--no-instructions`), the table.
    All,
    /// Instruction counts only, of the named benchmarks (all when none).
    Instructions(Vec<String>),
    /// `ops <bench>.<impl> --tasks T --ops N --redis URL`: N operations, then exit.
    Ops { imp: String, redis: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    pub command: Command,
    /// Measured seconds per round of each implementation.
    pub seconds: f64,
    /// Interleaved rounds per implementation.
    pub rounds: usize,
    /// Operations of the shorter instruction-count run (the longer does twice as many),
    /// or of an `ops` run.
    pub ops: u64,
    /// Tasks of an `ops` run.
    pub tasks: usize,
    /// `all` without instruction counts.
    pub no_instructions: bool,
}

/// Default operations of the shorter instruction-count run: at most a few seconds
/// under callgrind (idempotent POSTs, the slowest), while a run's own variation (a
/// million instructions or so) stays well under 1% of the difference.
pub const DEFAULT_OPS: u64 = 5000;

fn positive<T: std::str::FromStr + PartialOrd + Default>(
    name: &str,
    v: &str,
    what: &str,
) -> Result<T, BoxError> {
    v.parse()
        .ok()
        .filter(|x| *x > T::default())
        .ok_or_else(|| format!("{name}: expected {what}, got {v:?}").into())
}

/// Parses the arguments after the program name; `Ok(None)` for `--help`.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Args>, BoxError> {
    let mut out = Args {
        command: Command::Bench("lock".into()),
        seconds: 2.0,
        rounds: 5,
        ops: DEFAULT_OPS,
        tasks: 1,
        no_instructions: false,
    };
    let (mut positional, mut redis) = (Vec::new(), None);
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value (see --help)"))
        };
        match arg.as_str() {
            "--seconds" => {
                let v = value("--seconds")?;
                out.seconds = positive("--seconds", &v, "a positive number")?;
                if !out.seconds.is_finite() {
                    return Err(format!("--seconds: expected a finite number, got {v:?}").into());
                }
            }
            "--rounds" => {
                out.rounds = positive("--rounds", &value("--rounds")?, "a whole number >= 1")?
            }
            "--ops" => out.ops = positive("--ops", &value("--ops")?, "a whole number >= 1")?,
            "--tasks" => {
                out.tasks = positive("--tasks", &value("--tasks")?, "a whole number >= 1")?
            }
            "--redis" => redis = Some(value("--redis")?),
            "--no-instructions" => out.no_instructions = true,
            "-h" | "--help" => return Ok(None),
            a if a.starts_with('-') => {
                return Err(format!("unknown option {a:?} (see --help)").into());
            }
            a => positional.push(a.to_string()),
        }
    }
    let mut positional = positional.into_iter();
    let first = positional.next();
    let rest: Vec<String> = positional.collect();
    out.command = match first.as_deref() {
        Some("instructions") => Command::Instructions(rest),
        Some("ops") => {
            let [imp] = <[String; 1]>::try_from(rest)
                .map_err(|_| "ops: expected one implementation, <bench>.<impl>")?;
            let redis = redis.ok_or("ops: --redis URL is required")?;
            Command::Ops { imp, redis }
        }
        other => {
            if let Some(extra) = rest.first() {
                return Err(format!("unexpected argument {extra:?} (see --help)").into());
            }
            match other {
                Some("all") => Command::All,
                Some(b) => Command::Bench(b.to_string()),
                None => Command::Bench("lock".into()),
            }
        }
    };
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Option<Args>, BoxError> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn commands() {
        let a = parse_str("").unwrap().unwrap();
        assert_eq!(
            (a.command, a.seconds, a.rounds),
            (Command::Bench("lock".into()), 2.0, 5)
        );
        let a = parse_str("all --seconds 0.3 --rounds 3 --no-instructions")
            .unwrap()
            .unwrap();
        assert_eq!(
            (a.command, a.seconds, a.rounds, a.no_instructions),
            (Command::All, 0.3, 3, true)
        );
        let a = parse_str("instructions lock macro --ops 500")
            .unwrap()
            .unwrap();
        assert_eq!(
            a.command,
            Command::Instructions(vec!["lock".into(), "macro".into()])
        );
        assert_eq!(a.ops, 500);
        let a = parse_str("ops lock.ours --tasks 64 --ops 10 --redis redis://x/")
            .unwrap()
            .unwrap();
        assert_eq!(
            a.command,
            Command::Ops {
                imp: "lock.ours".into(),
                redis: "redis://x/".into()
            }
        );
        assert_eq!((a.tasks, a.ops), (64, 10));
        assert!(parse_str("all --help").unwrap().is_none());
    }

    #[test]
    fn bad_arguments_are_clear_errors() {
        for (args, says) in [
            ("--rounds 0", "--rounds: expected a whole number >= 1"),
            ("--seconds -1", "--seconds: expected a positive number"),
            ("--seconds inf", "expected a finite number"),
            ("--ops x", "--ops: expected a whole number >= 1"),
            ("--tasks", "--tasks needs a value"),
            ("--bogus", "unknown option"),
            ("lock extra", "unexpected argument \"extra\""),
            ("ops lock.ours", "--redis URL is required"),
            ("ops --redis r", "expected one implementation"),
            ("ops a b --redis r", "expected one implementation"),
        ] {
            let e = parse_str(args).expect_err(args).to_string();
            assert!(e.contains(says), "{args}: {e}");
        }
    }
}
