//! R7: publish results: an unroutable publish is an error, and overlapping publishes
//! each get their own result.

use crate::common::{declare, rabbit};
use ruststream::Headers;
use ruststream_core::PublishErrorKind;
use ruststream_test_support::unique_suffix;

use crate::support::get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_an_unroutable_publish_is_an_error_not_a_silent_drop() {
    let rabbit = rabbit().await;
    let queue = format!("r7-nobody-{}", unique_suffix());
    let error = rabbit
        .publisher()
        .send(&queue, &Headers::new(), b"lost?")
        .await
        .expect_err("no queue takes it");
    assert_eq!(error.kind(), PublishErrorKind::NoSuchAddress, "{error}");
    assert!(error.to_string().contains(&queue), "{error}");
}

/// lapin gives a `basic.return` to whichever confirmation it completes next, so with
/// several publishes in flight on one channel a refusal can land on another message:
/// a message no queue took reported as sent (lost), one stored reported as refused.
/// Every result must belong to its own message, however many run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_each_result_is_its_own_while_many_publishes_overlap() {
    let rabbit = rabbit().await;
    let suffix = unique_suffix();
    let (queue, nobody) = (format!("r7-some-{suffix}"), format!("r7-none-{suffix}"));
    declare(&rabbit, &queue, &[]).await;
    let publisher = rabbit.publisher();
    let mut sends = tokio::task::JoinSet::new();
    for n in 0..4000_u32 {
        let publisher = publisher.clone();
        let to = if n % 4 == 0 {
            nobody.clone()
        } else {
            queue.clone()
        };
        sends.spawn(async move {
            let sent = publisher
                .send(&to, &Headers::new(), n.to_string().as_bytes())
                .await;
            (n, sent)
        });
    }
    let (mut stored, mut wrong) = (0, Vec::new());
    while let Some(joined) = sends.join_next().await {
        let (n, sent) = joined.expect("task");
        match (n % 4 == 0, sent) {
            (true, Err(e)) if e.kind() == PublishErrorKind::NoSuchAddress => {}
            (false, Ok(())) => stored += 1,
            (unroutable, other) => wrong.push(format!("{n} (to nobody: {unroutable}): {other:?}")),
        }
    }
    assert!(wrong.is_empty(), "results on the wrong message: {wrong:?}");
    let mut arrived = 0;
    while get(&rabbit, &queue).await.is_some() {
        arrived += 1;
    }
    assert_eq!((stored, arrived), (3000, 3000));
}
