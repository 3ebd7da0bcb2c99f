//! The command line as a user runs it: the service's binary (`cli-service`, whose `main`
//! is `App::cli`), its output and exit codes, against the real Kafka (tansu) and against
//! a Kafka that is down.

use std::process::{Command, Output};

use std::time::Duration;

use ruststream_faults::Service;
use ruststream_faults::kafka::{brokers, create_topics};
use ruststream_test_support::asyncapi::validate;

const SERVICE: &str = env!("CARGO_BIN_EXE_cli-service");

fn service(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(SERVICE);
    command
        .args(args)
        .env("RUSTSTREAM_KAFKA_BROKERS", brokers());
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run cli-service")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000
    )
}

#[test]
fn help_lists_the_commands_and_a_usage_error_exits_two() {
    let help = service(&["--help"], &[]);
    assert_eq!(help.status.code(), Some(0), "{}", text(&help));
    for command in ["run", "check", "asyncapi", "publish", "Exit codes"] {
        assert!(text(&help).contains(command), "{command}: {}", text(&help));
    }
    let wrong = service(&["chek"], &[]);
    assert_eq!(wrong.status.code(), Some(2), "{}", text(&wrong));
    assert!(
        text(&wrong).contains("check"),
        "a suggestion: {}",
        text(&wrong)
    );
}

#[test]
fn check_passes_a_valid_service_and_lists_every_refusal_of_a_broken_one() {
    let valid = service(&["check"], &[]);
    assert_eq!(valid.status.code(), Some(0), "{}", text(&valid));
    assert!(
        text(&valid).contains("every registration is valid (2)"),
        "{}",
        text(&valid)
    );

    let broken = service(&["check"], &[("CLI_SERVICE_BROKEN", "1")]);
    assert_eq!(broken.status.code(), Some(1), "{}", text(&broken));
    let said = text(&broken);
    assert!(
        said.contains("no-lanes") && said.contains("lanes must be at least 1"),
        "{said}"
    );
    assert!(said.contains("own-dead-letter"), "{said}");
}

#[tokio::test]
async fn check_connect_names_a_missing_topic_then_passes_once_it_exists() {
    let topic = unique("cli-check");
    let env = [("CLI_SERVICE_TOPIC", topic.as_str())];
    let missing = service(&["check", "--connect"], &env);
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing));
    let said = text(&missing);
    assert!(said.contains(&format!("has no topic `{topic}`")), "{said}");
    assert!(said.contains("FAILED: registration `take-order`"), "{said}");
    assert!(said.contains("ok: registration `audit`"), "{said}");

    create_topics(&brokers(), &[&topic]).await;
    let present = service(&["check", "--connect"], &env);
    assert_eq!(present.status.code(), Some(0), "{}", text(&present));
    assert!(
        text(&present).contains(&format!(
            "ok: registration `take-order` on `{topic}` (kafka "
        )),
        "{}",
        text(&present)
    );
}

#[test]
fn check_connect_against_a_kafka_that_is_down_fails_naming_it() {
    let mut command = Command::new(SERVICE);
    // Nothing listens on port 1.
    let down = command
        .args(["check", "--connect"])
        .env("RUSTSTREAM_KAFKA_BROKERS", "127.0.0.1:1")
        .output()
        .expect("run cli-service");
    assert_eq!(down.status.code(), Some(1), "{}", text(&down));
    let said = text(&down);
    assert!(
        said.contains("cannot reach Kafka at `127.0.0.1:1`"),
        "{said}"
    );
    // Without --connect nothing is asked: the check passes with the broker down.
    let offline = Command::new(SERVICE)
        .arg("check")
        .env("RUSTSTREAM_KAFKA_BROKERS", "127.0.0.1:1")
        .output()
        .expect("run cli-service");
    assert_eq!(offline.status.code(), Some(0), "{}", text(&offline));
}

#[test]
fn asyncapi_writes_a_valid_document_with_the_broker_down() {
    let out = std::env::temp_dir().join(format!("{}.yaml", unique("cli-asyncapi")));
    let written = Command::new(SERVICE)
        .args([
            "asyncapi",
            "--format",
            "yaml",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("RUSTSTREAM_KAFKA_BROKERS", "127.0.0.1:1")
        .output()
        .expect("run cli-service");
    assert_eq!(written.status.code(), Some(0), "{}", text(&written));
    let yaml = std::fs::read_to_string(&out).expect("the document");
    let _ = std::fs::remove_file(&out);
    let validated = validate(&yaml, "yaml");
    assert!(validated.clean, "{}\n{yaml}", validated.report);
    assert!(
        yaml.contains("take-order.receive") && yaml.contains("cli-orders.dead"),
        "{yaml}"
    );

    let json = service(&["asyncapi"], &[]);
    assert_eq!(json.status.code(), Some(0), "{}", text(&json));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    assert_eq!(value["info"]["title"], "cli-service");
}

#[tokio::test]
async fn publish_sends_one_message_and_says_when_it_cannot() {
    let topic = unique("cli-publish");
    create_topics(&brokers(), &[&topic]).await;
    let via = ["--via", "take-order"];
    let sent = service(
        &[
            &[
                "publish",
                &topic,
                r#"{"id": 7}"#,
                "--key",
                "k",
                "--header",
                "origin=cli",
            ][..],
            &via[..],
        ]
        .concat(),
        &[],
    );
    assert_eq!(sent.status.code(), Some(0), "{}", text(&sent));
    assert!(
        text(&sent).contains(&format!("published to `{topic}`")),
        "{}",
        text(&sent)
    );

    let several = service(&["publish", &topic, r#"{"id": 7}"#], &[]);
    assert_eq!(several.status.code(), Some(1), "{}", text(&several));
    assert!(
        text(&several).contains("--via REGISTRATION"),
        "{}",
        text(&several)
    );

    let not_json = service(
        &[&["publish", &topic, "{id: 7"][..], &via[..]].concat(),
        &[],
    );
    assert_eq!(not_json.status.code(), Some(1));
    assert!(text(&not_json).contains("not JSON"), "{}", text(&not_json));

    let bad_header = service(
        &[
            &["publish", &topic, "1", "--header", "novalue"][..],
            &via[..],
        ]
        .concat(),
        &[],
    );
    assert_eq!(bad_header.status.code(), Some(1));
    assert!(
        text(&bad_header).contains("NAME=VALUE"),
        "{}",
        text(&bad_header)
    );

    let refused = Command::new(SERVICE)
        .args([&["publish", &topic, "1", "--timeout", "2"][..], &via[..]].concat())
        .env("RUSTSTREAM_KAFKA_BROKERS", "127.0.0.1:1")
        .output()
        .expect("run cli-service");
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("no confirmation from the broker within 2s"),
        "{}",
        text(&refused)
    );
}

#[tokio::test]
async fn run_is_the_default_and_a_published_message_is_handled_until_sigterm() {
    let topic = unique("cli-run");
    create_topics(&brokers(), &[&topic]).await;
    let brokers = brokers();
    let env = [
        ("CLI_SERVICE_TOPIC", topic.as_str()),
        ("RUSTSTREAM_KAFKA_BROKERS", brokers.as_str()),
    ];
    let mut running = Service::spawn_with(SERVICE, &[], &env);
    let sent = service(
        &["publish", &topic, r#"{"id": 42}"#, "--via", "take-order"],
        &env,
    );
    assert_eq!(sent.status.code(), Some(0), "{}", text(&sent));
    running
        .until(Duration::from_secs(60), "order 42 handled", |t| {
            t.handled().contains("42")
        })
        .await;
    running.signal("TERM");
    assert_eq!(running.exits_within(Duration::from_secs(30)).await, Some(0));
}

/// `run`, its program setting no subscriber of its own, logs to standard error: each
/// registration's `consuming` line at start, the stop; `RUST_LOG` sets the level.
#[tokio::test]
async fn run_logs_to_stderr_by_default() {
    use std::io::{BufRead, BufReader};
    let topic = unique("cli-logs");
    create_topics(&brokers(), &[&topic]).await;
    let mut child = Command::new(SERVICE)
        .env("RUSTSTREAM_KAFKA_BROKERS", brokers())
        .env("CLI_SERVICE_TOPIC", &topic)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run cli-service");
    let stderr = child.stderr.take().expect("stderr");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut said = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !said
        .iter()
        .any(|l: &String| l.contains("take-order") && l.contains("consuming"))
    {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => said.push(line),
            Err(_) => panic!("no `consuming` line within 60 s: {said:#?}"),
        }
    }
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let exited = child.wait().expect("wait");
    said.extend(lines.try_iter());
    // The reader thread may still hold the last lines: give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    said.extend(lines.try_iter());
    assert_eq!(exited.code(), Some(0), "{said:#?}");
    let consuming = said
        .iter()
        .find(|l| l.contains("consuming"))
        .expect("consuming");
    assert!(
        consuming.contains("INFO") && consuming.contains(&format!("address=\"{topic}\"")),
        "{consuming}"
    );
    assert!(
        said.iter()
            .any(|l| l.contains("stop signal received; draining")),
        "{said:#?}"
    );
}
