//! Credentials on a real nats-server that requires them, started here from the binary the
//! test command installed: the right ones connect, consume and settle; wrong ones fail at
//! once with an error naming the reason and the address, and no secret is ever printed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{capture_logs, create_stream, eventually, own_server, unique};
use ruststream::{App, HandlerOutcome, Message, Publisher, State, on};
use ruststream_core::Secret;
use ruststream_nats::Nats;
use ruststream_nats::async_nats::{self, jetstream};

const USER: &str = "billing";
const PASSWORD: &str = "pw-7f3a9c";
const WRONG: &str = "wrong-91b2e4";

/// A nats-server on a free port with JetStream, requiring `USER`/`PASSWORD`.
struct Server {
    _process: common::OwnServer,
    _store: tempdir::Store,
    address: String,
}

mod tempdir {
    /// A directory removed on drop.
    pub(crate) struct Store(pub(crate) std::path::PathBuf);

    impl Drop for Store {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn server_with_password() -> Server {
    nats_server(&["--user", USER, "--pass", PASSWORD]).await
}

/// A nats-server of the test's own with JetStream (a store of its own) and `args`.
async fn nats_server<A: AsRef<std::ffi::OsStr>>(args: &[A]) -> Server {
    let store = tempdir::Store(std::env::temp_dir().join(unique("nats-secure")));
    let mut all: Vec<std::ffi::OsString> = vec!["-js".into(), "-sd".into(), store.0.clone().into()];
    all.extend(args.iter().map(|a| a.as_ref().to_owned()));
    let server = own_server(&all).await;
    Server {
        address: server.address.clone(),
        _process: server,
        _store: store,
    }
}

fn with_password(password: &Secret) -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::with_user_and_password(USER.into(), password.expose().into())
        .connection_timeout(Duration::from_secs(5))
}

async fn on_order(
    Message(id): Message<u64>,
    State(seen): State<Arc<AtomicUsize>>,
) -> HandlerOutcome {
    let _ = id;
    seen.fetch_add(1, Ordering::Relaxed);
    HandlerOutcome::ack()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_connect_consume_and_settle() {
    let server = server_with_password().await;
    let url = format!("nats://{}", server.address);
    let nats = Nats::connect_with(&url, with_password(&Secret::new(PASSWORD)))
        .await
        .expect("the right credentials connect");
    let base = unique("SECURE");
    let stream = create_stream(&nats, &base, &[format!("{base}.in")]).await;
    let seen = Arc::new(AtomicUsize::new(0));
    let running = App::new()
        .state(Arc::clone(&seen))
        .register(on(
            nats.consumer(base.clone(), "billing")
                .filter_subject(format!("{base}.in")),
            on_order,
        ))
        .start()
        .await
        .expect("starts");
    let publisher = Publisher::new(nats.publish_handle());
    for id in 0..3u64 {
        publisher
            .to(format!("{base}.in"))
            .send(&id)
            .await
            .expect("published");
    }
    eventually(Duration::from_secs(10), "three orders handled", || {
        seen.load(Ordering::Relaxed) == 3
    })
    .await;
    running.stop().await;
    // Settled: the durable consumer has nothing pending and nothing unacknowledged.
    let info = jetstream::new(nats.client().clone())
        .get_stream(&base)
        .await
        .expect("stream")
        .get_consumer::<jetstream::consumer::pull::Config>("billing")
        .await
        .expect("consumer")
        .info()
        .await
        .expect("info")
        .clone();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_once_naming_the_reason_and_the_address_not_the_secret() {
    capture_logs("debug,async_nats=debug");
    let server = server_with_password().await;
    let url = format!("nats://{}", server.address);
    let started = Instant::now();
    let error = Nats::connect_with(&url, with_password(&Secret::new(WRONG)))
        .await
        .expect_err("a wrong password is refused");
    let took = started.elapsed();
    let shown = format!("{error} {error:?}");
    assert!(took < Duration::from_secs(5), "failed after {took:?}");
    assert!(!error.is_unreachable(), "{shown}");
    assert!(shown.contains(&server.address), "{shown}");
    assert!(shown.to_lowercase().contains("authorization"), "{shown}");
    assert!(!shown.contains(WRONG), "{shown}");
    ruststream_test_support::assert_no_log_line_holds(WRONG);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_inside_the_url_is_never_printed() {
    capture_logs("debug,async_nats=debug");
    let server = server_with_password().await;
    let url = format!("nats://{USER}:{WRONG}@{}", server.address);
    // Refused credentials are not waited out: the waiting start returns at once too.
    let started = Instant::now();
    let error = Nats::connect_waiting(&url, Duration::from_millis(500))
        .await
        .expect_err("a wrong password is refused");
    assert!(started.elapsed() < Duration::from_secs(5));
    let shown = format!("{error} {error:?}");
    assert!(
        shown.contains(&format!("nats://***@{}", server.address)),
        "{shown}"
    );
    assert!(!shown.contains(WRONG), "{shown}");
    ruststream_test_support::assert_no_log_line_holds(WRONG);
    // The right password in the URL connects (async-nats reads user-info as credentials).
    let url = format!("nats://{USER}:{PASSWORD}@{}", server.address);
    Nats::connect(&url)
        .await
        .expect("credentials in the URL connect");
    ruststream_test_support::assert_no_log_line_holds(PASSWORD);
}

/// A CA, and a server certificate it signed for 127.0.0.1 and localhost, as PEM files.
struct Certificates {
    dir: tempdir::Store,
}

impl Certificates {
    fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
        let dir = tempdir::Store(std::env::temp_dir().join(unique("nats-tls")));
        std::fs::create_dir_all(&dir.0).expect("a directory for the certificates");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let server = params
            .signed_by(&server_key, &issuer)
            .expect("server certificate");
        let write = |name: &str, pem: String| std::fs::write(dir.0.join(name), pem).expect(name);
        write("ca.pem", ca.pem());
        write("server.pem", server.pem());
        write("server-key.pem", server_key.serialize_pem());
        Self { dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.0.join(name)
    }
}

/// A nats-server on a free port that speaks TLS only, with `certificates`' server pair.
async fn server_with_tls(certificates: &Certificates) -> Server {
    let (certificate, key) = (
        certificates.path("server.pem"),
        certificates.path("server-key.pem"),
    );
    nats_server(&[
        std::ffi::OsStr::new("--tls"),
        "--tlscert".as_ref(),
        certificate.as_os_str(),
        "--tlskey".as_ref(),
        key.as_os_str(),
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_servers_ca_connects_and_consumes() {
    let certificates = Certificates::new();
    let server = server_with_tls(&certificates).await;
    let options = async_nats::ConnectOptions::new()
        .add_root_certificates(certificates.path("ca.pem"))
        .require_tls(true)
        .connection_timeout(Duration::from_secs(5));
    let nats = Nats::connect_with(&format!("tls://{}", server.address), options)
        .await
        .expect("TLS with the right CA connects");
    let subject = unique("secure.prices");
    let seen = Arc::new(AtomicUsize::new(0));
    let running = App::new()
        .state(Arc::clone(&seen))
        .register(on(nats.subject(subject.clone()), on_order))
        .start()
        .await
        .expect("starts");
    nats.client().flush().await.expect("flush");
    let publisher = Publisher::new(nats.publish_handle());
    publisher.to(&subject).send(&7u64).await.expect("published");
    eventually(Duration::from_secs(10), "the message handled", || {
        seen.load(Ordering::Relaxed) == 1
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_fails_at_once_naming_the_address() {
    let certificates = Certificates::new();
    let server = server_with_tls(&certificates).await;
    // Another CA than the one that signed the server's certificate.
    let other = Certificates::new();
    let options = async_nats::ConnectOptions::new()
        .add_root_certificates(other.path("ca.pem"))
        .require_tls(true)
        .connection_timeout(Duration::from_secs(5));
    let started = Instant::now();
    let error = Nats::connect_with(&format!("tls://{}", server.address), options)
        .await
        .expect_err("a certificate no trusted CA signed is refused");
    let shown = format!("{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "{shown}");
    assert!(shown.contains(&server.address), "{shown}");
    assert!(
        shown.to_lowercase().contains("certificate") || shown.to_lowercase().contains("tls"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_connects_and_a_wrong_one_is_refused_without_being_printed() {
    capture_logs("debug,async_nats=debug");
    let token = "tok-4e7d20";
    let server = nats_server(&["--auth", token]).await;
    let url = format!("nats://{}", server.address);
    let options = |token: &str| {
        async_nats::ConnectOptions::with_token(token.to_owned())
            .connection_timeout(Duration::from_secs(5))
    };
    Nats::connect_with(&url, options(token))
        .await
        .expect("the right token connects");
    // A token inside the URL is read as one too.
    Nats::connect(&format!("nats://{token}@{}", server.address))
        .await
        .expect("the token in the URL connects");
    let wrong = "tok-wrong-93aa01";
    let error = Nats::connect(&format!("nats://{wrong}@{}", server.address))
        .await
        .expect_err("a wrong token is refused");
    let shown = format!("{error} {error:?}");
    assert!(
        shown.contains(&format!("nats://***@{}", server.address)),
        "{shown}"
    );
    assert!(!shown.contains(wrong) && !shown.contains(token), "{shown}");
    ruststream_test_support::assert_no_log_line_holds(token);
    ruststream_test_support::assert_no_log_line_holds(wrong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_connects_and_another_is_refused_without_its_seed_printed() {
    capture_logs("debug,async_nats=debug");
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let config = std::env::temp_dir().join(format!("{}.conf", unique("nats-nkey")));
    std::fs::write(
        &config,
        format!(
            "authorization {{ users = [ {{ nkey: {} }} ] }}\n",
            user.public_key()
        ),
    )
    .expect("config");
    let server = nats_server(&[std::ffi::OsStr::new("-c"), config.as_os_str()]).await;
    let url = format!("nats://{}", server.address);
    let seed = Secret::new(user.seed().expect("seed"));
    let options = |seed: &Secret| {
        async_nats::ConnectOptions::with_nkey(seed.expose().to_owned())
            .connection_timeout(Duration::from_secs(5))
    };
    let nats = Nats::connect_with(&url, options(&seed))
        .await
        .expect("the user's nkey connects");
    let subject = unique("nkey.in");
    let mut subscription = nats
        .client()
        .subscribe(subject.clone())
        .await
        .expect("subscribes");
    nats.client()
        .publish(subject, "signed in".into())
        .await
        .expect("publishes");
    let got = tokio::time::timeout(Duration::from_secs(5), futures_next(&mut subscription))
        .await
        .expect("a message within 5 s");
    assert_eq!(&got[..], b"signed in");

    let other = Secret::new(stranger.seed().expect("seed"));
    let error = Nats::connect_with(&url, options(&other))
        .await
        .expect_err("an nkey the server does not know is refused");
    let shown = format!("{error} {error:?}");
    assert!(shown.to_lowercase().contains("authorization"), "{shown}");
    assert!(shown.contains(&server.address), "{shown}");
    for secret in [seed.expose(), other.expose()] {
        assert!(!shown.contains(secret), "{shown}");
        ruststream_test_support::assert_no_log_line_holds(secret);
    }
    let _ = std::fs::remove_file(config);
}

async fn futures_next(subscription: &mut async_nats::Subscriber) -> bytes::Bytes {
    use futures_util::StreamExt;
    subscription.next().await.expect("subscribed").payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_from_the_environment_connect_and_name_what_is_missing() {
    use ruststream_core::{Env, EnvError, FromEnvError};
    let server = server_with_password().await;
    let url = format!("nats://{}", server.address);
    let env = |pairs: &[(&str, &str)]| {
        Env::from_pairs(
            "ORDERS_NATS",
            pairs.iter().map(|(k, v)| (format!("ORDERS_NATS_{k}"), *v)),
        )
    };
    let nats = Nats::connect_from_env(&env(&[
        ("URL", &url),
        ("USER", USER),
        ("PASSWORD", PASSWORD),
    ]))
    .await
    .expect("the right credentials from the environment connect");
    nats.client().flush().await.expect("a round trip");

    let Err(FromEnvError::Env(EnvError::Invalid { variables, .. })) =
        Nats::connect_from_env(&env(&[("URL", &url), ("USER", USER)])).await
    else {
        panic!("a user without a password is refused before connecting");
    };
    assert_eq!(variables, "ORDERS_NATS_USER, ORDERS_NATS_PASSWORD");
    let Err(FromEnvError::Env(EnvError::Missing { variable })) =
        Nats::connect_from_env(&env(&[("USER", USER), ("PASSWORD", PASSWORD)])).await
    else {
        panic!("no URL is refused");
    };
    assert_eq!(variable, "ORDERS_NATS_URL");
    let refused = Nats::connect_from_env(&env(&[
        ("URL", &url),
        ("USER", USER),
        ("PASSWORD", PASSWORD),
        ("TOKEN", WRONG),
    ]))
    .await
    .expect_err("two kinds of credentials");
    let shown = format!("{refused} {refused:?}");
    assert!(
        shown.contains("ORDERS_NATS_PASSWORD, ORDERS_NATS_TOKEN"),
        "{shown}"
    );
    assert!(
        !shown.contains(WRONG) && !shown.contains(PASSWORD),
        "{shown}"
    );

    let wrong = Nats::connect_from_env(&env(&[("URL", &url), ("USER", USER), ("PASSWORD", WRONG)]))
        .await
        .expect_err("a wrong password is refused by the server");
    assert!(matches!(wrong, FromEnvError::Connect(_)), "{wrong:?}");
    let shown = format!("{wrong} {wrong:?}");
    assert!(
        shown.contains(&server.address) && !shown.contains(WRONG),
        "{shown}"
    );
}

/// Issue #46, item 1: a password holding `/`, `,`, `#`, `?` or `@` in the URL is taken
/// out whole before the client sees the URL, refused by the real server, and masked
/// whole in the error and in every log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_url_delimiters_is_never_printed() {
    capture_logs("trace");
    let server = server_with_password().await;
    for password in ruststream_test_support::HOSTILE_PASSWORDS {
        let url = format!("nats://{USER}:{password}@{}", server.address);
        let error = Nats::connect_waiting(&url, Duration::from_millis(500))
            .await
            .expect_err("a wrong password is refused");
        let shown = format!("{error} {error:?}");
        assert!(
            shown.contains(&format!("nats://***@{}", server.address)),
            "{shown}"
        );
        ruststream_test_support::assert_shows_no_part_of(&shown, password);
        ruststream_test_support::assert_no_log_line_holds_part_of(password);
    }
}
