//! Consumers the service named itself (`<hostname>-<pid>-<n>`), taken out of the group
//! once they hold nothing pending, so the group does not gain one at every start.
//!
//! Only a consumer with no pending entry is removed: `XGROUP DELCONSUMER` drops a
//! consumer's pending entries with it, and those could then never be claimed. A name the
//! user chose is kept (it is meant to outlive restarts).

use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::ConnectionManager;

/// This machine's host name, as the default consumer names carry it.
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "ruststream".to_owned())
}

/// A consumer name of this process: `<hostname>-<pid>-<n>`, n counting the
/// subscriptions it opened.
pub(crate) fn generated_name() -> String {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{n}", host(), std::process::id())
}

/// The group's consumers and how many entries each holds pending (`XINFO CONSUMERS`).
async fn consumers(
    commands: &mut ConnectionManager,
    stream: &str,
    group: &str,
) -> redis::RedisResult<Vec<(String, i64)>> {
    let listed: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg(group)
        .query_async(commands)
        .await?;
    Ok(listed
        .into_iter()
        .filter_map(|mut consumer| {
            let name = redis::from_redis_value(consumer.remove("name")?).ok()?;
            let pending = redis::from_redis_value(consumer.remove("pending")?).ok()?;
            Some((name, pending))
        })
        .collect())
}

async fn remove(commands: &mut ConnectionManager, stream: &str, group: &str, consumer: &str) {
    let removed = redis::cmd("XGROUP")
        .arg("DELCONSUMER")
        .arg(stream)
        .arg(group)
        .arg(consumer)
        .query_async::<i64>(commands)
        .await;
    match removed {
        Ok(_) => tracing::debug!(stream, group, consumer, "removed an idle consumer"),
        Err(e) => {
            tracing::debug!(stream, group, consumer, error = %e, "removing a consumer failed")
        }
    }
}

/// At a stop: removes `consumer` (named here) when it holds nothing pending; with
/// entries pending it stays, for a consumer of the group to claim them.
pub(crate) async fn remove_own(
    commands: &mut ConnectionManager,
    stream: &str,
    group: &str,
    consumer: &str,
) {
    let Ok(listed) = consumers(commands, stream, group).await else {
        return;
    };
    if listed
        .iter()
        .any(|(name, pending)| name == consumer && *pending == 0)
    {
        remove(commands, stream, group, consumer).await;
    }
}

/// At a start: removes the consumers that processes of this host named and that are
/// gone (no such pid here), when they hold nothing pending. A process that ended
/// without its stop (a crash) leaves its consumer behind; this takes it out once its
/// entries were claimed. Consumers of other hosts are not touched.
pub(crate) async fn remove_departed(commands: &mut ConnectionManager, stream: &str, group: &str) {
    let Ok(listed) = consumers(commands, stream, group).await else {
        return;
    };
    let (host, me) = (host(), std::process::id());
    for (name, pending) in listed {
        if pending == 0 && departed(&name, &host, me) {
            remove(commands, stream, group, &name).await;
        }
    }
}

/// Whether `name` is `<host>-<pid>-<n>` for this host and a pid that is not running.
fn departed(name: &str, host: &str, me: u32) -> bool {
    let mut parts = name.rsplitn(3, '-');
    let (Some(n), Some(pid), Some(named_on)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(_), Ok(pid)) = (n.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    named_on == host && pid != me && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The group's backlog (see `RedisSubscription::backlog`).
pub(crate) async fn backlog(
    commands: &mut ConnectionManager,
    shared: &crate::reader::Shared,
) -> Result<Vec<ruststream_core::Backlog>, String> {
    let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&*shared.stream)
        .query_async(commands)
        .await
        .map_err(|e| e.to_string())?;
    let group = groups
        .into_iter()
        .find(|g| {
            g.get("name")
                .and_then(|n| redis::from_redis_value::<String>(n.clone()).ok())
                .is_some_and(|n| n == shared.group)
        })
        .ok_or_else(|| format!("no group `{}` on the stream", shared.group))?;
    let figure = |name: &str| {
        group
            .get(name)
            .and_then(|v| redis::from_redis_value::<u64>(v.clone()).ok())
    };
    let mut backlog = Vec::with_capacity(2);
    if let Some(lag) = figure("lag") {
        backlog.push(ruststream_core::Backlog {
            kind: "pending",
            partition: None,
            value: lag,
        });
    }
    if let Some(pending) = figure("pending") {
        backlog.push(ruststream_core::Backlog {
            kind: "ack_pending",
            partition: None,
            value: pending,
        });
    }
    Ok(backlog)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_names_of_gone_processes_of_this_host_are_departed() {
        let me = std::process::id();
        assert!(!super::departed(&format!("box-{me}-0"), "box", me));
        assert!(super::departed("box-4000000-3", "box", me), "no such pid");
        assert!(!super::departed("other-4000000-3", "box", me));
        assert!(!super::departed("my-own-name", "box", me));
        assert!(
            super::departed("my-box-4000000-0", "my-box", me),
            "a host with dashes"
        );
        assert!(
            !super::departed(&format!("box-{}-1", 1), "box", me),
            "pid 1 runs"
        );
    }
}
