//! A second OS process for the order-id suite. Not a user tool.
//!
//! `id-worker URL NAME MODE COUNT TASKS`
//!   MODE is `per-id` or `segment:<block>`. TASKS tasks share one `IdGenerator` and take
//!   COUNT ids in all (0: until killed), each task one after the other. Prints one line
//!   per id, `<task> <id> <start_ns> <end_ns>` (nanoseconds since the worker started, taken
//!   just before the call and just after it returned), flushed whenever the queue is
//!   empty, then `done <count>`.

use std::io::Write;
use std::time::Instant;

use lock_core::LockClient;
use lock_core::ids::{IdConfig, IdGenerator, IdMode};

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args).await {
        eprintln!("id-worker: {e}");
        std::process::exit(1);
    }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T, String> {
    args.get(i).and_then(|a| a.parse().ok()).ok_or_else(|| {
        format!("argument {i} missing or malformed (usage: id-worker URL NAME MODE COUNT TASKS)")
    })
}

async fn run(args: &[String]) -> Res {
    let url: String = arg(args, 0)?;
    let name: String = arg(args, 1)?;
    let mode: String = arg(args, 2)?;
    let count: u64 = arg(args, 3)?;
    let tasks: u64 = arg(args, 4)?;
    let mode = match mode.split_once(':') {
        None if mode == "per-id" => IdMode::PerId,
        Some(("segment", block)) => IdMode::Segment {
            block: block.parse()?,
        },
        _ => return Err(format!("unknown mode {mode:?}").into()),
    };
    let client = LockClient::open(url.as_str()).await?;
    let ids = IdGenerator::new(&client, name.as_str(), IdConfig::new().with_mode(mode))?;
    let t0 = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let share = if count == 0 {
            u64::MAX
        } else {
            count / tasks + u64::from(t < count % tasks)
        };
        let (ids, tx) = (ids.clone(), tx.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..share {
                let start = t0.elapsed().as_nanos() as u64;
                let id = ids.next_id().await?;
                let end = t0.elapsed().as_nanos() as u64;
                if tx.send((t, id.get(), start, end)).is_err() {
                    break;
                }
            }
            Ok::<_, lock_core::LockError>(())
        }));
    }
    drop(tx);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut written = 0u64;
    while let Some((t, id, start, end)) = rx.recv().await {
        writeln!(out, "{t} {id} {start} {end}")?;
        written += 1;
        while let Ok((t, id, start, end)) = rx.try_recv() {
            writeln!(out, "{t} {id} {start} {end}")?;
            written += 1;
        }
        out.flush()?;
    }
    for h in handles {
        h.await??;
    }
    writeln!(out, "done {written}")?;
    out.flush()?;
    Ok(())
}
