//! Retries natively and by copy (N1, N6, K7, D4): the cap, the dead letter, the retry
//! count, the delay, and a delayed copy held at a stop.

use std::time::Duration;

use ruststream::memory::MemoryBroker;
use ruststream::testing::TestApp;
use ruststream::{App, HandlerOutcome, Message, Meta, RETRY_COUNT_HEADER, on};

use crate::support::{Order, order};

async fn always_retry(Message(_o): Message<Order>) -> HandlerOutcome {
    HandlerOutcome::retry()
}

async fn retry_three_times_then_dead_letter(runtime_retries: bool) {
    let broker = MemoryBroker::recording();
    let topic = broker.topic("orders");
    let topic = if runtime_retries {
        topic.runtime_retries()
    } else {
        topic
    };
    let app = App::new().register(
        on(topic, always_retry)
            .name("orders")
            .max_attempts(3)
            .dead_letter("orders.dead"),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publisher()
        .to("orders")
        .key("k1")
        .header("trace", "abc")
        .send(&order(7))
        .await
        .unwrap();
    test.settled().await;

    let calls = test.calls_of("orders");
    assert_eq!(
        calls.len(),
        3,
        "the handler runs exactly max_attempts times"
    );
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let dead = test.published("orders.dead");
    assert_eq!(dead.len(), 1, "exactly one dead letter");
    let original = &test.published("orders")[0];
    assert_eq!(dead[0].payload, original.payload);
    assert_eq!(dead[0].key, original.key);
    assert_eq!(dead[0].headers.get_str("trace"), Some("abc"));
    // The dead letter is the last attempt as it arrived, with what says why beside it
    // under its own prefix (D6).
    let own: Vec<(&str, &[u8])> = dead[0]
        .headers
        .iter()
        .filter(|(name, _)| !name.starts_with(ruststream::core::DEAD_LETTER_PREFIX))
        .map(|(name, value)| (name, &value[..]))
        .collect();
    let arrived: Vec<(&str, &[u8])> = calls[2]
        .headers
        .iter()
        .map(|(name, value)| (name, &value[..]))
        .collect();
    assert_eq!(own, arrived);
    assert_eq!(
        dead[0]
            .headers
            .get_str(ruststream::core::DEAD_LETTER_ATTEMPTS),
        Some("3")
    );
    assert_eq!(broker.depth("orders", "default"), 0);
    test.stop().await;
}

#[tokio::test(start_paused = true)]
async fn n6_retry_under_cap_runs_three_times_then_one_dead_letter_native_count() {
    retry_three_times_then_dead_letter(false).await;
}

#[tokio::test(start_paused = true)]
async fn k7_retry_under_cap_dead_letters_after_three_runs_with_header_count() {
    retry_three_times_then_dead_letter(true).await;
}

#[tokio::test(start_paused = true)]
async fn k7_d4_copies_carry_the_retry_count_absent_one_two() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on(broker.topic("orders").runtime_retries(), always_retry)
            .max_attempts(3)
            .dead_letter("orders.dead"),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let seen: Vec<Option<String>> = test
        .calls()
        .iter()
        .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
        .collect();
    assert_eq!(seen, vec![None, Some("1".into()), Some("2".into())]);
    // Two copies were published to the retry address besides the original.
    assert_eq!(test.published("orders").len(), 3);
    test.stop().await;
}

async fn delayed_once(Meta { attempt, .. }: Meta) -> HandlerOutcome {
    if attempt.number() == 1 {
        HandlerOutcome::retry_after(Duration::from_secs(5))
    } else {
        HandlerOutcome::ack()
    }
}

async fn retry_after_waits(runtime_retries: bool) {
    let broker = MemoryBroker::recording();
    let topic = broker.topic("orders");
    let topic = if runtime_retries {
        topic.runtime_retries()
    } else {
        topic
    };
    let app = App::new().register(on(topic, delayed_once));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[1].at - calls[0].at >= Duration::from_secs(5),
        "redelivered after {:?}",
        calls[1].at - calls[0].at
    );
    test.stop().await;
}

#[tokio::test(start_paused = true)]
async fn n1_retry_after_is_redelivered_no_earlier_than_the_delay_native() {
    retry_after_waits(false).await;
}

#[tokio::test(start_paused = true)]
async fn k7_retry_after_copy_is_published_no_earlier_than_the_delay() {
    retry_after_waits(true).await;
}

#[tokio::test(start_paused = true)]
async fn a_delayed_copy_held_at_stop_is_handed_back_not_lost() {
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("orders").runtime_retries(), delayed_once));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("orders", &order(1)).await;
    while test.calls().is_empty() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    test.stop().await;
    // The copy was never published, and the original is back in the queue.
    assert_eq!(broker.published("orders").len(), 1);
    assert_eq!(broker.depth("orders", "default"), 1);
}
