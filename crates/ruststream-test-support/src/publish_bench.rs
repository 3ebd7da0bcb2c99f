//! What the publish benches share: `send_all` of n messages next to the raw client's own
//! pipelined publish of the same n, in alternating rounds, compared by rate.

use std::future::Future;
use std::time::Instant;

/// Runs `rounds` rounds of both sides (raw first on even rounds), each publishing `n`
/// messages and returning once all are confirmed; prints one line with each side's best
/// rate and their ratio.
pub async fn compare<R, F, RawF, FwF>(name: &str, n: usize, rounds: usize, raw: R, framework: F)
where
    R: Fn(usize) -> RawF,
    F: Fn(usize) -> FwF,
    RawF: Future<Output = ()>,
    FwF: Future<Output = ()>,
{
    let load = crate::bench::load_average();
    let (mut raws, mut fws) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let timed = |started: Instant| n as f64 / started.elapsed().as_secs_f64();
        if round % 2 == 0 {
            let t = Instant::now();
            raw(round).await;
            raws.push(timed(t));
            let t = Instant::now();
            framework(round).await;
            fws.push(timed(t));
        } else {
            let t = Instant::now();
            framework(round).await;
            fws.push(timed(t));
            let t = Instant::now();
            raw(round).await;
            raws.push(timed(t));
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let rounds: Vec<String> = raws
        .iter()
        .zip(&fws)
        .map(|(r, f)| format!("{r:.0}/{f:.0}"))
        .collect();
    println!(
        "{name}: {n} messages, rate raw {:.0}/s, send_all {:.0}/s ({:.2}x); rounds raw/send_all {}; load {load} at start, {} at end",
        best(&raws),
        best(&fws),
        best(&fws) / best(&raws),
        rounds.join(" "),
        crate::bench::load_average()
    );
}
