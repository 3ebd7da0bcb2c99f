//! Reading an app's ops endpoint and a real Prometheus from tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET path` over HTTP/1.0: the status code and the body.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the ops endpoint at {addr}: {e}"));
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("request written");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the one sample of `series` (name and labels exactly as exposed, e.g.
/// `ruststream_outcomes_total{registration="a",...}`) summed over every line whose name
/// and labels contain all of `parts`.
pub fn sample(metrics: &str, name: &str, parts: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.split(['{', ' '])
                .next()
                .is_some_and(|series| series == name)
        })
        .filter(|line| parts.iter().all(|p| line.contains(p)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A Prometheus server of the test's own, scraping `targets` every 500 ms.
pub struct Prometheus {
    child: Child,
    /// Where its HTTP API listens.
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts `prometheus` (the binary in `RUSTSTREAM_PROMETHEUS_BIN`, which the test
    /// command installs) and waits until it is ready. Panics when it cannot: a test that
    /// needs it fails, never skips.
    pub async fn start(targets: &[SocketAddr]) -> Self {
        let bin = std::env::var("RUSTSTREAM_PROMETHEUS_BIN").expect(
            "RUSTSTREAM_PROMETHEUS_BIN must name the prometheus binary (scripts/brokers/prometheus.sh installs it)",
        );
        let dir = std::env::temp_dir().join(format!("ruststream-prom-{}", crate::unique_suffix()));
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\nscrape_configs:\n  - job_name: service\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("config written");
        let child = Command::new(&bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let prometheus = Self { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(addr).await.is_ok() && get(addr, "/-/ready").await.0 == 200 {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30 s; its log: {}",
                std::fs::read_to_string(prometheus.dir.join("log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// An instant query through the HTTP API: the values of the result vector.
    pub async fn query(&self, expr: &str) -> Vec<f64> {
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = get(self.addr, &format!("/api/v1/query?query={encoded}")).await;
        assert_eq!(status, 200, "query {expr}: {body}");
        // The values sit in `"value":[<time>,"<v>"]`; no JSON parser needed for that.
        body.split("\"value\":[")
            .skip(1)
            .filter_map(|rest| {
                let (_, value) = rest.split_once(",\"")?;
                value.split('"').next()?.parse().ok()
            })
            .collect()
    }

    /// Waits until `expr` has one value equal to `want`, for up to `within`; panics with
    /// the last values seen otherwise.
    pub async fn wait_for(&self, expr: &str, want: f64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let values = self.query(expr).await;
            if values.len() == 1 && (values[0] - want).abs() < 1e-9 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus: `{expr}` is {values:?}, expected {want} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the scrape tests publish, one message each, as JSON strings.
pub const WORDS: [&str; 6] = ["ack", "ack", "ack", "drop", "drop", "fail"];

/// A payload [`answer`] cannot decode (not JSON): counted `undecodable`, and
/// dead-lettered where a dead letter is declared.
pub const UNDECODABLE: &[u8] = b"not json";

/// A JSON string payload.
pub fn payload(word: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!("\"{word}\""))
}

/// The scrape tests' handler: acks `ack`, drops `drop`, fails anything else.
pub async fn answer(
    ruststream::Message(word): ruststream::Message<String>,
) -> Result<ruststream::HandlerOutcome, String> {
    match word.as_str() {
        "ack" => Ok(ruststream::HandlerOutcome::ack()),
        "drop" => Ok(ruststream::HandlerOutcome::drop()),
        _ => Err("refused".to_owned()),
    }
}

/// Outcome counts that differ by transport for [`WORDS`] under `max_attempts(3)`.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// `kind="error"`: attempts the handler failed (the last one too).
    pub error: f64,
    /// `kind="undecodable"`: the [`UNDECODABLE`] payloads the test published.
    pub undecodable: f64,
    /// Whether the broker stamps deliveries, so `ruststream_delivery_age_seconds`
    /// observes every attempt.
    pub stamped: bool,
    /// Dead letters confirmed (`ruststream_copies_published_total{kind="dead_letter"}`):
    /// where the runtime or the subscription dead-letters (everywhere but Pulsar, whose
    /// client moves the message itself).
    pub dead_lettered: f64,
    /// The `ruststream_backlog` kinds the transport tells, which must come back to 0.
    pub backlog: &'static [&'static str],
}

/// Starts a real Prometheus scraping `running`'s ops endpoint and waits until what it
/// scraped for `registration` equals what [`WORDS`] must give: 3 acks, 2 drops, the
/// failures and dead letters of `expect`, nothing left in flight; and checks readiness.
pub async fn assert_scraped(
    running: &ruststream::Running,
    registration: &str,
    expect: Expect,
) -> Prometheus {
    let addr = running
        .ops_addr()
        .expect("the app serves its ops endpoint (App::ops)");
    let prometheus = Prometheus::start(&[addr]).await;
    let within = Duration::from_secs(60);
    let of = |series: &str, kind: &str| {
        format!("sum({series}{{registration=\"{registration}\",kind=\"{kind}\"}})")
    };
    prometheus
        .wait_for("up{job=\"service\"}", 1.0, within)
        .await;
    prometheus
        .wait_for(&of("ruststream_outcomes_total", "ack"), 3.0, within)
        .await;
    prometheus
        .wait_for(&of("ruststream_outcomes_total", "drop"), 2.0, within)
        .await;
    prometheus
        .wait_for(
            &of("ruststream_outcomes_total", "error"),
            expect.error,
            within,
        )
        .await;
    prometheus
        .wait_for(
            &format!(
                "sum(ruststream_outcomes_total{{registration=\"{registration}\",kind=\"undecodable\"}}) or vector(0)"
            ),
            expect.undecodable,
            within,
        )
        .await;
    if expect.dead_lettered > 0.0 {
        prometheus
            .wait_for(
                &of("ruststream_copies_published_total", "dead_letter"),
                expect.dead_lettered,
                within,
            )
            .await;
    }
    prometheus
        .wait_for(
            &format!("sum(ruststream_in_flight{{registration=\"{registration}\"}})"),
            0.0,
            within,
        )
        .await;
    prometheus
        .wait_for(
            &format!(
                "sum(ruststream_handler_duration_seconds_count{{registration=\"{registration}\"}})"
            ),
            5.0 + expect.error + expect.undecodable,
            within,
        )
        .await;
    if expect.stamped {
        prometheus
            .wait_for(
                &format!(
                    "sum(ruststream_delivery_age_seconds_count{{registration=\"{registration}\"}})"
                ),
                5.0 + expect.error + expect.undecodable,
                within,
            )
            .await;
    }
    let (status, body) = get(addr, "/health/ready").await;
    assert_eq!(status, 200, "ready while the broker is up: {body}");
    prometheus
}

/// Every query of the project's Grafana dashboard (`ops/grafana-dashboard.json`) runs on
/// `prometheus` without an error, and those over counters and gauges the scenario
/// touched return series.
pub async fn assert_dashboard_queries(prometheus: &Prometheus) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    // A rate needs two samples in its window: wait for a few scrapes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus
        .query("count_over_time(up[1m])")
        .await
        .first()
        .is_none_or(|scrapes| *scrapes < 3.0)
    {
        assert!(
            Instant::now() < deadline,
            "prometheus scraped fewer than 3 times in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut queried = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"]
                .as_str()
                .expect("expr")
                .replace("$registration", ".*")
                .replace("$__rate_interval", "1m");
            // `query` asserts Prometheus answered 200 (a parse error is a 400).
            let values = prometheus.query(&expr).await;
            let title = panel["title"].as_str().unwrap_or_default();
            if title.starts_with("Throughput")
                || title.starts_with("Outcomes")
                || title.starts_with("In flight")
            {
                assert!(!values.is_empty(), "`{expr}` ({title}) returned nothing");
            }
            queried += 1;
        }
    }
    assert!(queried >= 6, "the dashboard has its queries");
}

/// Polls `running.metrics()` until the sum of `ruststream_backlog` over `kinds` for
/// `registration` is `want`; panics with the last exposition otherwise.
pub async fn backlog_becomes(
    running: &ruststream::Running,
    registration: &str,
    kinds: &[&str],
    want: f64,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let metrics = running.metrics().await.expect("metrics on");
        let registration = format!("registration=\"{registration}\"");
        let total: f64 = kinds
            .iter()
            .map(|kind| {
                let kind = format!("kind=\"{kind}\"");
                sample(&metrics, "ruststream_backlog", &[&registration, &kind])
            })
            .sum();
        if (total - want).abs() < 1e-9 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backlog {kinds:?} is {total}, expected {want} within {within:?}:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A handler that waits for a permit of the app's `Arc<Semaphore>` state, then acks.
pub async fn held(
    ruststream::Message(_): ruststream::Message<String>,
    ruststream::State(gate): ruststream::State<std::sync::Arc<tokio::sync::Semaphore>>,
) -> ruststream::HandlerOutcome {
    let _permit = gate.acquire().await;
    ruststream::HandlerOutcome::ack()
}

/// `series` summed over `running`'s samples that carry every one of `parts` (label
/// pairs as `kind="refused"`): what an alert over that series sees now. The app must
/// collect metrics (`App::metrics()` or `App::ops(..)`).
pub async fn metric(running: &ruststream::Running, series: &str, parts: &[&str]) -> f64 {
    let metrics = running
        .metrics()
        .await
        .expect("the app collects metrics (App::metrics)");
    sample(&metrics, series, parts)
}
