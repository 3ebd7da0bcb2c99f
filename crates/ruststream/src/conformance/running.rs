//! A running app: lanes and their order, the stop, competing consumers, refusals at
//! start, the handler deadline.

use std::collections::{HashMap, HashSet};
use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::Poll;
use std::time::Duration;

use ruststream_core::Delivery;

use crate::{App, HandlerOutcome, StopHandle, on};

use super::Bed;
use super::support::*;

/// `lanes(4)` keeps each key's order while keys run side by side.
pub async fn lanes_keep_per_key_order(bed: impl Bed) {
    let address = bed.address().await;
    let seen: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
    let handler = {
        let seen = Arc::clone(&seen);
        move |d: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                let n: u32 = std::str::from_utf8(d.payload())
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(u64::from(n % 3))).await;
                let key = d
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default();
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(key)
                    .or_default()
                    .push(n);
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler).lanes(4))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    for n in 0..60u32 {
        publish(
            &bed,
            &address,
            Some(&format!("key-{}", n % 4)),
            &[],
            n.to_string().as_bytes(),
        )
        .await;
    }
    // At-least-once: a broker may hand a message over again (an ack lost in a
    // reconnect), so what is checked is that every message was handled and that, per
    // key, the first handling of each follows the publishing order.
    until(Duration::from_secs(60), "all handled", || {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|order| first_handlings(order).len())
            .sum::<usize>()
            == 60
    })
    .await;
    for (key, order) in seen.lock().unwrap_or_else(PoisonError::into_inner).iter() {
        let first = first_handlings(order);
        assert!(first.windows(2).all(|w| w[0] < w[1]), "{key}: {order:?}");
    }
    app.stop().await;
}

/// Each number's first handling, in the order handled (a redelivered duplicate left out).
fn first_handlings(order: &[u32]) -> Vec<u32> {
    let mut seen = HashSet::new();
    order.iter().copied().filter(|n| seen.insert(*n)).collect()
}

/// A stop lets the running handler finish, and settles it: the next app does not see it.
pub async fn e3_stop_drains_and_settles(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let finished = Arc::new(Mutex::new(false));
    let handler = {
        let (log, finished) = (log.clone(), Arc::clone(&finished));
        move |d: Delivery| {
            let (log, finished) = (log.clone(), Arc::clone(&finished));
            async move {
                log.push(&d);
                tokio::time::sleep(Duration::from_millis(500)).await;
                *finished.lock().unwrap_or_else(PoisonError::into_inner) = true;
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler.clone()))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"slow").await;
    until(Duration::from_secs(30), "started", || log.len() == 1).await;
    app.stop().await;
    assert!(
        *finished.lock().unwrap_or_else(PoisonError::into_inner),
        "the running handler finished"
    );
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler))
        .start()
        .await
        .expect("restart");
    tokio::time::sleep(bed.warm_up()).await;
    read_past_a_marker(&bed, &address, &log).await;
    assert_eq!(
        count(&log, b"slow"),
        1,
        "it was settled before the stop ended"
    );
    app.stop().await;
}

/// A stop asked while the app works through a backlog ends the run within the
/// deadlines and fetches no more, also when it comes just as the driver's task has spent
/// tokio's cooperative budget (here the handler spends it, as tokio I/O in a handler
/// does, then asks the stop once, as `Running::stop` and SIGTERM do).
pub async fn e3_a_stop_during_a_backlog_stops_fetching(bed: impl Bed) {
    const BACKLOG: usize = 300;
    const STOP_AT: usize = 20;
    let address = bed.address().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let stop: Arc<OnceLock<StopHandle>> = Arc::default();
    let handler = {
        let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
        move |_d: Delivery| {
            let (calls, stop) = (Arc::clone(&calls), Arc::clone(&stop));
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) + 1 == STOP_AT {
                    poll_fn(|cx| {
                        while let Poll::Ready(unit) = tokio::task::coop::poll_proceed(cx) {
                            unit.made_progress();
                        }
                        Poll::Ready(())
                    })
                    .await;
                    stop.get().expect("set before the backlog").stop();
                }
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler))
        .start()
        .await
        .expect("start");
    let _ = stop.set(app.stop_handle());
    tokio::time::sleep(bed.warm_up()).await;
    publish_all(
        &bed,
        &address,
        (0..BACKLOG).map(|n| n.to_string().into_bytes()),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(60), app.wait())
        .await
        .expect("the app ended after the stop");
    let handled = calls.load(Ordering::SeqCst);
    assert!(
        (STOP_AT..BACKLOG).contains(&handled),
        "stopped at call {STOP_AT}, fetching no more: {handled} of {BACKLOG} handled"
    );
}

/// Two apps in one group share the work: every message is handled, and only once; where
/// the address can be shared ([`Bed::shares_one_address`]), both members take some.
pub async fn competing_consumers_share_the_work(bed: impl Bed) {
    let address = bed.address().await;
    let (one, two) = (Log::default(), Log::default());
    // Each message takes a little work, so a busy member leaves the next one to the other.
    let member = |log: Log| {
        let work = move |d: Delivery| {
            let log = log.clone();
            async move {
                log.push(&d);
                tokio::time::sleep(Duration::from_millis(10)).await;
                HandlerOutcome::ack()
            }
        };
        App::new()
            .register(on(bed.subscribe(&address, "suite"), work))
            .start()
    };
    let first = member(one.clone()).await.expect("start the first member");
    tokio::time::sleep(bed.warm_up()).await;
    let second = member(two.clone()).await.expect("start the second member");
    // The second member joining may move work (a Kafka rebalance): let it settle.
    tokio::time::sleep(bed.warm_up() * 2).await;
    let n = 40;
    for i in 0..n {
        let key = format!("key-{i}");
        publish(&bed, &address, Some(&key), &[], key.as_bytes()).await;
    }
    until(Duration::from_secs(60), "all handled", || {
        one.len() + two.len() >= n
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut payloads: Vec<Vec<u8>> = one
        .all()
        .iter()
        .chain(two.all().iter())
        .map(|(d, _)| d.payload().to_vec())
        .collect();
    payloads.sort();
    let total = payloads.len();
    payloads.dedup();
    assert_eq!(payloads.len(), n, "every message handled");
    assert_eq!(total, n, "no message handled by both members");
    if bed.shares_one_address() {
        assert!(
            one.len() > 0 && two.len() > 0,
            "both members took work: {} and {}",
            one.len(),
            two.len()
        );
    }
    first.stop().await;
    second.stop().await;
}

/// E4: a start with several broken registrations fails, listing each with its address
/// and the rule it breaks.
pub async fn e4_broken_registrations_are_all_refused(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let refused = App::new()
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(log.clone(), |_| HandlerOutcome::ack()),
            )
            .name("no-attempts")
            .max_attempts(0),
        )
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(log.clone(), |_| HandlerOutcome::ack()),
            )
            .name("dead-letters-to-itself")
            .dead_letter(&address),
        )
        .start()
        .await;
    assert_refused(
        refused,
        &address,
        &[
            ("no-attempts", "max_attempts must be at least 1"),
            (
                "dead-letters-to-itself",
                "is read by this registration itself",
            ),
        ],
    );
    assert_eq!(log.len(), 0, "no handler ran");
}

/// SPEC G4: a dead letter without `max_attempts` (never reached), a dead letter the
/// registration reads itself (handled again without end), a lane count above the bound
/// and a zero handler deadline are all refused at start, each named.
pub async fn g4_unbounded_registrations_are_refused(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let log = Log::default();
    let handler = || recorder(log.clone(), |_| HandlerOutcome::ack());
    let refused = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("uncapped")
                .dead_letter(&dead),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("reads-its-dead-letter")
                .max_attempts(2)
                .dead_letter(&address),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("too-many-lanes")
                .lanes(crate::MAX_LANES + 1),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("no-time")
                .timeout(Duration::ZERO),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("too-many-consumers")
                .consumers(crate::MAX_CONSUMERS + 1),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("no-consumer")
                .consumers(0),
        )
        .start()
        .await;
    assert_refused(
        refused,
        &address,
        &[
            ("uncapped", "without max_attempts"),
            (
                "reads-its-dead-letter",
                "is read by this registration itself",
            ),
            ("too-many-lanes", "above the bound"),
            ("no-time", "timeout must be longer than zero"),
            ("too-many-consumers", "run more processes instead"),
            ("no-consumer", "consumers must be at least 1"),
        ],
    );
    assert_eq!(log.len(), 0, "no handler ran");
    guard_rail(
        &bed,
        "a dead letter without max_attempts, a dead letter the registration reads itself, lanes above the bound, a zero deadline",
        "refused at start, each named",
        "no handler ran",
        "none",
    );
}

/// SPEC G1: a handler that never returns is cancelled at its deadline, and the attempt
/// counts as failed: the delivery comes back as the next attempt.
pub async fn g1_a_hung_handler_is_cancelled_at_its_deadline(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let log = Log::default();
    let deadline = Duration::from_millis(500);
    let hang_first = {
        let log = log.clone();
        move |d: Delivery| {
            let log = log.clone();
            async move {
                log.push(&d);
                if d.attempt().number() == 1 {
                    std::future::pending::<()>().await;
                }
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), hang_first)
                .timeout(deadline)
                .max_attempts(3)
                .dead_letter(dead),
        )
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"hangs once").await;
    until(Duration::from_secs(30), "back after the deadline", || {
        log.len() == 2
    })
    .await;
    let runs = log.all();
    assert_eq!(runs[1].0.attempt().number(), 2, "the cancelled run counted");
    assert!(
        runs[1].1 - runs[0].1 >= deadline - Duration::from_millis(20),
        "cancelled no earlier than its deadline"
    );
    app.stop().await;
    guard_rail(
        &bed,
        "hung handler: the first attempt never returns, timeout(500 ms), max_attempts(3)",
        "lost 0 of 1 (cancelled at the deadline, back as attempt 2)",
        "0 handled twice",
        "0 dead-lettered",
    );
}
