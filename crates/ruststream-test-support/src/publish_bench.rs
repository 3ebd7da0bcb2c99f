//! What the publish benches share: `send_all` of n messages next to the raw client's own
//! pipelined publish of the same n, in alternating rounds, compared by rate and by the
//! CPU time the whole process spent per message.
//!
//! A publish's work is spread over threads (the calling task, the client's connection
//! task, librdkafka's producer threads), so the CPU figure sums every thread of the
//! process (`/proc/self/task/*/schedstat`, to the nanosecond); it leaves out the broker.
//! Wall-clock rates on a shared 2-core machine swing by tens of percent between rounds
//! of the same side, so the line gives the median of the rounds' own rate ratios (each
//! round runs both sides back to back) beside the best rate of each side.
//!
//! `BENCH_SIDE=raw` or `BENCH_SIDE=send_all` runs one side only, once, for a profile of the
//! whole process (`scripts/bench-callgrind-publish`).

use std::future::Future;
use std::time::Instant;

/// CPU time every thread of this process has run so far, in nanoseconds (threads that
/// ended are not counted: the benches' threads live as long as the process).
pub fn process_threads_cpu_ns() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("reading /proc/self/task");
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// One side's round: messages a second, and process CPU nanoseconds a message.
#[derive(Debug, Clone, Copy)]
struct Round {
    rate: f64,
    cpu_ns: f64,
}

async fn timed<Fut: Future<Output = ()>>(n: usize, side: Fut) -> Round {
    let (started, cpu) = (Instant::now(), process_threads_cpu_ns());
    side.await;
    Round {
        rate: n as f64 / started.elapsed().as_secs_f64(),
        cpu_ns: (process_threads_cpu_ns() - cpu) as f64 / n as f64,
    }
}

/// Runs `rounds` rounds of both sides (raw first on even rounds), each publishing `n`
/// messages and returning once all are confirmed; prints one line with each side's best
/// rate, the median of the rounds' rate ratios, and each side's lowest CPU a message.
pub async fn compare<R, F, RawF, FwF>(name: &str, n: usize, rounds: usize, raw: R, framework: F)
where
    R: Fn(usize) -> RawF,
    F: Fn(usize) -> FwF,
    RawF: Future<Output = ()>,
    FwF: Future<Output = ()>,
{
    match std::env::var("BENCH_SIDE").as_deref() {
        Ok("raw") => return raw(0).await,
        Ok("send_all") => return framework(0).await,
        _ => {}
    }
    let load = crate::bench::load_average();
    let (mut raws, mut fws) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            raws.push(timed(n, raw(round)).await);
            fws.push(timed(n, framework(round)).await);
        } else {
            fws.push(timed(n, framework(round)).await);
            raws.push(timed(n, raw(round)).await);
        }
    }
    let best = |v: &[Round]| v.iter().map(|r| r.rate).fold(0.0, f64::max);
    let least = |v: &[Round]| v.iter().map(|r| r.cpu_ns).fold(f64::INFINITY, f64::min);
    let mut ratios: Vec<f64> = raws
        .iter()
        .zip(&fws)
        .map(|(r, f)| f.rate / r.rate)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let each: Vec<String> = raws
        .iter()
        .zip(&fws)
        .map(|(r, f)| format!("{:.0}/{:.0}", r.rate, f.rate))
        .collect();
    println!(
        "{name}: {n} messages, rate raw {:.0}/s, send_all {:.0}/s ({:.2}x best, {:.2}x median of rounds); \
         process CPU ns/msg raw {:.0}, send_all {:.0} ({:.2}x); rounds raw/send_all {}; load {load} at start, {} at end",
        best(&raws),
        best(&fws),
        best(&fws) / best(&raws),
        median,
        least(&raws),
        least(&fws),
        least(&fws) / least(&raws),
        each.join(" "),
        crate::bench::load_average()
    );
}
