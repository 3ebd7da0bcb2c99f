//! Several consumers of one registration (`consumers(n)`) in one app.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ruststream_core::{Declaration, Delivery, Descriptor};

use crate::{App, HandlerOutcome, on};

use super::Bed;
use super::support::*;

/// `consumers(2)` shares one registration's work in one app: every message handled
/// exactly once, none lost; where the address is shared by several consumers, two calls
/// run at once on the two-thread runtime, although each handler blocks its thread (one
/// driver could not overlap them). Where the subscription cannot be shared (a Kafka
/// `Transactional` pipeline, a Pulsar `Exclusive` subscription), the start is refused
/// naming the rule.
pub async fn consumers_share_the_work_in_one_app(bed: impl Bed) {
    let address = bed.address().await;
    let mut declaration = Declaration::default();
    declaration.consumers = 2;
    let rules = bed.subscribe(&address, "suite").check(&declaration);
    if let Some(rule) = rules.iter().find(|rule| rule.contains("consumers(2)")) {
        let refused = App::new()
            .register(
                on(bed.subscribe(&address, "suite"), |_: Delivery| async {
                    HandlerOutcome::ack()
                })
                .name("consumers")
                .consumers(2),
            )
            .start()
            .await;
        assert_refused(refused, &address, &[("consumers", rule)]);
        return;
    }
    let log = Log::default();
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let work = {
        let (log, running, most) = (log.clone(), Arc::clone(&running), Arc::clone(&most));
        move |d: Delivery| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // Blocks the thread: only another driver's task can run beside it.
            std::thread::sleep(Duration::from_millis(20));
            running.fetch_sub(1, Ordering::SeqCst);
            log.push(&d);
            async { HandlerOutcome::ack() }
        }
    };
    let app = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), work)
                .consumers(2)
                .max_in_flight(2),
        )
        .start()
        .await
        .expect("starts");
    tokio::time::sleep(bed.warm_up()).await;
    let n = 40;
    for i in 0..n {
        let key = format!("key-{i}");
        publish(&bed, &address, Some(&key), &[], key.as_bytes()).await;
    }
    until(Duration::from_secs(60), "all handled", || log.len() >= n).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    app.stop().await;
    let mut payloads: Vec<Vec<u8>> = log
        .all()
        .iter()
        .map(|(d, _)| d.payload().to_vec())
        .collect();
    payloads.sort();
    let total = payloads.len();
    payloads.dedup();
    assert_eq!(payloads.len(), n, "every message handled");
    if bed.shares_one_address() {
        assert_eq!(total, n, "no message handled twice");
    }
    // (Kafka: a rebalance while the group forms may hand a record running on one member
    // to the other, K5; the partition is read by one member, so nothing runs at once.)
    if bed.shares_one_address() {
        assert!(
            most.load(Ordering::SeqCst) >= 2,
            "two consumers' handlers never ran at once"
        );
    }
}
