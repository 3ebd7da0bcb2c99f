//! The app: registrations, state, start, stop.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ruststream_core::{Cause, SubscribeError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::asyncapi::{AsyncApi, Sends, Served, Source};
use crate::group::Registrations;
use crate::in_flight::InFlight;
use crate::ops::{Health, Metrics, Ops, Watch};
use crate::registration::Registration;
use crate::runtime::{Env, Mount, Observe};
use crate::signals::Signals;
use crate::state::StateMap;

/// How long running handlers get to finish on stop, unless set.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long closing each subscription may take after the drain, unless set (SPEC G6):
/// a stop ends within `shutdown_timeout` + this, whatever the brokers do.
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The handler deadline of every registration that sets none (SPEC G1): past it a call
/// is cancelled and counts as a failed attempt. Equal to JetStream's default `ack_wait`.
pub const DEFAULT_HANDLER_TIMEOUT: Duration = Duration::from_secs(30);

/// A service: registrations over one or more brokers, and shared state.
///
/// ```
/// use ruststream::{on, App, HandlerOutcome, Message, memory::MemoryBroker};
///
/// async fn greet(Message(name): Message<String>) -> HandlerOutcome {
///     println!("hello, {name}");
///     HandlerOutcome::ack()
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ruststream::StartError> {
/// let broker = MemoryBroker::new();
/// let app = App::new().register(on(broker.topic("names"), greet));
/// let running = app.start().await?;
/// broker.publisher().to("names").send("world").await.unwrap();
/// running.stop().await;
/// # Ok(()) }
/// ```
pub struct App {
    mounts: Vec<Box<dyn Mount>>,
    state: StateMap,
    shutdown_timeout: Duration,
    close_timeout: Duration,
    handler_timeout: Duration,
    stop_tx: watch::Sender<bool>,
    observer: Option<Arc<dyn Observe>>,
    metrics: bool,
    ops: Option<SocketAddr>,
    info: Option<(String, String)>,
    sends: Vec<Sends>,
    asyncapi_page: Option<PathBuf>,
    watches: Vec<Arc<dyn Watch>>,
}

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for App {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("App")
            .field(
                "registrations",
                &self.mounts.iter().map(|m| m.name()).collect::<Vec<_>>(),
            )
            .field("state", &self.state)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("handler_timeout", &self.handler_timeout)
            .finish()
    }
}

impl App {
    /// An app with no registrations.
    pub fn new() -> Self {
        Self {
            mounts: Vec::new(),
            state: StateMap::default(),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            handler_timeout: DEFAULT_HANDLER_TIMEOUT,
            stop_tx: watch::channel(false).0,
            observer: None,
            metrics: false,
            ops: None,
            info: None,
            sends: Vec::new(),
            asyncapi_page: None,
            watches: Vec::new(),
        }
    }

    /// Serves the ops endpoint on `127.0.0.1:port` while the app runs: `/metrics`
    /// (Prometheus), `/health/live`, `/health/ready` (see [`ops`](crate::ops) for every
    /// series and what readiness checks). Port 0 picks a free port
    /// ([`Running::ops_addr`] tells which). Turns metrics on.
    ///
    /// ```no_run
    /// # use ruststream::App;
    /// let app = App::new().ops(9464);
    /// ```
    pub fn ops(self, port: u16) -> Self {
        self.ops_on(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// Serves the ops endpoint on `addr`, any address. Binding every interface
    /// (`0.0.0.0`) shows the metrics and health to the whole network: a choice to make
    /// on purpose, e.g. for a scraper in another container. Turns metrics on.
    pub fn ops_on(mut self, addr: SocketAddr) -> Self {
        self.ops = Some(addr);
        self.metrics = true;
        self
    }

    /// Renders the service's description at the ops endpoint's `/asyncapi` with the
    /// AsyncAPI project's React component: `bundle` is its standalone bundle, a file
    /// you fetch once (`npm install @asyncapi/react-component@3`, then
    /// `node_modules/@asyncapi/react-component/browser/standalone/index.js`; its
    /// `styles/default.min.css` is found beside it). The page loads it from the endpoint,
    /// never from the internet. Without it, `/asyncapi` says how to get one and links
    /// `/asyncapi.json` and `/asyncapi.yaml`, which are always served. A bundle that
    /// cannot be read fails the start ([`StartError::Ops`]).
    pub fn asyncapi_page(mut self, bundle: impl Into<PathBuf>) -> Self {
        self.asyncapi_page = Some(bundle.into());
        self
    }

    /// Collects metrics without serving them: read them with [`Running::metrics`] (to
    /// serve from a server of your own).
    pub fn metrics(mut self) -> Self {
        self.metrics = true;
        self
    }

    /// Reports `watch`'s series at `/metrics` and its reasons at `/health/ready`, beside
    /// the registrations' (an outbox relay's lag, an inbox's skips: see
    /// [`Watch`](crate::ops::Watch)).
    pub fn watch(mut self, watch: Arc<dyn Watch>) -> Self {
        self.watches.push(watch);
        self
    }

    /// Adds a registration (see [`on`](crate::on)).
    pub fn register<D, S>(mut self, registration: Registration<D, S>) -> Self {
        self.mounts.push((registration.mount)(registration));
        self
    }

    /// Adds every registration of `group`: a service split across modules has each
    /// module return its [`Registrations`], and the app merges them.
    pub fn merge(mut self, group: Registrations) -> Self {
        self.mounts.extend(group.into_mounts());
        self
    }

    /// The service's title and version in its description (AsyncAPI `info`). Unset,
    /// the title is the program's file name and the version `0.0.0`; a service names its
    /// package with `.info(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))`.
    pub fn info(mut self, title: impl Into<String>, version: impl Into<String>) -> Self {
        self.info = Some((title.into(), version.into()));
        self
    }

    /// Declares a message the service sends (from handlers or elsewhere), so its
    /// description shows it: a `send` operation on its address, with its schema.
    pub fn sends(mut self, sends: Sends) -> Self {
        self.sends.push(sends);
        self
    }

    /// The service's AsyncAPI 3.0.0 document (see [`asyncapi`](crate::asyncapi)),
    /// written from the registrations and declared sends without connecting to anything.
    pub fn asyncapi(&self) -> AsyncApi {
        let program = std::env::current_exe()
            .ok()
            .and_then(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "service".to_owned());
        let (title, version) = match &self.info {
            Some((title, version)) => (title.clone(), version.clone()),
            None => (program, "0.0.0".to_owned()),
        };
        AsyncApi::from_source(Source {
            title: &title,
            version: &version,
            entries: self
                .mounts
                .iter()
                .map(|m| m.describe(self.handler_timeout))
                .collect(),
            sends: &self.sends,
        })
    }

    /// Shares `value` with handlers that take `State<T>`. One value per type.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.state.insert(value);
        self
    }

    /// How long running handlers get to finish on stop (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// How long closing each subscription may take after the drain (default
    /// [`DEFAULT_CLOSE_TIMEOUT`], 10 s): from a stop signal the app ends within
    /// `shutdown_timeout` + `close_timeout`, even with every broker unreachable (SPEC G6).
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// The handler deadline of registrations that set none with
    /// [`Registration::timeout`] (default [`DEFAULT_HANDLER_TIMEOUT`], 30 s). Past it a
    /// call is cancelled and counts as a failed attempt (SPEC G1).
    pub fn handler_timeout(mut self, deadline: Duration) -> Self {
        self.handler_timeout = deadline;
        self
    }

    /// A handle that stops the app, usable before and after it starts.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            tx: self.stop_tx.clone(),
        }
    }

    pub(crate) fn observe(mut self, observer: Arc<dyn Observe>) -> Self {
        self.observer = Some(observer);
        self
    }

    pub(crate) fn mounts(&self) -> &[Box<dyn Mount>] {
        &self.mounts
    }

    pub(crate) fn declared_sends(&self) -> &[Sends] {
        &self.sends
    }

    /// Every violation of every registration (SPEC E4), without opening anything.
    pub fn validate(&self) -> Result<(), StartError> {
        let app_rules = self.handler_timeout.is_zero().then(|| Violation {
            registration: "(the app)".to_owned(),
            address: "-".to_owned(),
            rule: "the app's handler timeout must be longer than zero".to_owned(),
        });
        let violations: Vec<Violation> = app_rules
            .into_iter()
            .chain(self.mounts.iter().flat_map(|m| {
                m.violations(&self.state).into_iter().map(|rule| Violation {
                    registration: m.name().to_owned(),
                    address: m.address().to_owned(),
                    rule,
                })
            }))
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(StartError::Invalid(violations))
        }
    }

    /// Validates every registration, opens every subscription and starts their drivers.
    /// On any error nothing keeps running.
    pub async fn start(self) -> Result<Running, StartError> {
        self.validate()?;
        crate::runtime::quiet_handler_panics();
        let metrics = self.metrics.then(|| Metrics::new(self.watches.clone()));
        let health = Health::new(self.stop_tx.subscribe(), self.watches.clone());
        // The endpoint is up before the subscriptions open: live at once, ready once
        // every subscription is open.
        let ops = match self.ops {
            Some(addr) => {
                let listener =
                    tokio::net::TcpListener::bind(addr)
                        .await
                        .map_err(|e| StartError::Ops {
                            addr,
                            source: Cause::new(e),
                        })?;
                let bound = listener.local_addr().unwrap_or(addr);
                let page = self.asyncapi_page.as_deref();
                let asyncapi = Served::new(&self.asyncapi(), page).map_err(|e| {
                    let bundle = page.map(|p| p.display().to_string()).unwrap_or_default();
                    let source = Cause::new(format!("the AsyncAPI page's bundle `{bundle}`: {e}"));
                    StartError::Ops { addr, source }
                })?;
                let ops = Arc::new(Ops {
                    metrics: metrics.clone(),
                    health: Arc::clone(&health),
                    asyncapi,
                });
                tracing::info!(address = %bound, "ops endpoint serving /metrics, /health/live, /health/ready, /asyncapi");
                Some((bound, tokio::spawn(crate::ops::serve(listener, ops))))
            }
            None => None,
        };
        let (ops_addr, server) = ops.unzip();
        let env = Env {
            state: Arc::new(self.state),
            stop: self.stop_tx.subscribe(),
            drain_timeout: self.shutdown_timeout,
            close_timeout: self.close_timeout,
            handler_timeout: self.handler_timeout,
            observer: self.observer,
            metrics: metrics.clone(),
            health: Arc::clone(&health),
        };
        let mut running = Running {
            stop_tx: self.stop_tx,
            drivers: Vec::with_capacity(self.mounts.len()),
            in_flight: Vec::with_capacity(self.mounts.len()),
            metrics,
            ops_addr,
            server,
        };
        for mount in self.mounts {
            let (name, address) = (mount.name().to_owned(), mount.address().to_owned());
            let mut started = Vec::new();
            let opened = mount.start(env.clone(), &mut started).await;
            for started in started {
                running.drivers.push(started.driver);
                running.in_flight.push(started.in_flight);
            }
            if let Err(source) = opened {
                running.stop().await;
                return Err(StartError::Open {
                    registration: name,
                    address,
                    source,
                });
            }
            tracing::info!(registration = name, address, "consuming");
        }
        health.started();
        Ok(running)
    }

    /// Starts, then runs until SIGINT, SIGTERM or a [`StopHandle`], then drains: see
    /// [`Running::until_signal`].
    ///
    /// Unless the program set a `tracing` subscriber first, this installs one that logs
    /// INFO and above (or what `RUST_LOG` says) to standard error.
    pub async fn run(self) -> Result<(), StartError> {
        crate::logs::init_default();
        // Listening before the start: a signal while it starts, or just after, drains.
        let signals = Signals::listen();
        self.start().await?.until(signals).await;
        Ok(())
    }
}

/// Stops an app: fetching stops, running handlers get the shutdown timeout to finish.
#[derive(Debug, Clone)]
pub struct StopHandle {
    tx: watch::Sender<bool>,
}

impl StopHandle {
    /// Asks the app to stop. Returns at once; [`Running::wait`] sees the end.
    pub fn stop(&self) {
        self.tx.send_replace(true);
    }
}

/// A started app. Dropping it stops the app without waiting.
#[derive(Debug)]
pub struct Running {
    stop_tx: watch::Sender<bool>,
    drivers: Vec<JoinHandle<()>>,
    in_flight: Vec<Arc<InFlight>>,
    metrics: Option<Arc<Metrics>>,
    ops_addr: Option<SocketAddr>,
    server: Option<JoinHandle<()>>,
}

impl Running {
    /// A handle that stops the app.
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            tx: self.stop_tx.clone(),
        }
    }

    /// Runs until SIGINT, SIGTERM or a [`StopHandle`], then stops as [`Running::stop`]
    /// does: it returns within the shutdown timeout + the close timeout of the signal,
    /// whatever the brokers do. A second SIGINT or SIGTERM during the drain ends the
    /// process at once (exit code 130), after logging at ERROR how many deliveries each
    /// registration leaves unsettled (SPEC G6).
    ///
    /// The signals are listened to from this call on; before it, one ends the process
    /// without a drain. [`App::run`] listens from before the app starts.
    pub async fn until_signal(self) {
        self.until(Signals::listen()).await;
    }

    async fn until(self, mut signals: Signals) {
        let mut stop = self.stop_tx.subscribe();
        tokio::select! {
            () = signals.recv() => tracing::info!("stop signal received; draining"),
            _ = stop.wait_for(|s| *s) => {}
        }
        let in_flight = self.in_flight.clone();
        tokio::select! {
            () = self.stop() => {}
            () = signals.recv() => {
                // A registration's consumers (`consumers(n)`) are told as one.
                let mut held: Vec<(&str, &str, usize)> = Vec::new();
                for one in in_flight.iter().filter(|h| h.count() > 0) {
                    match held.iter_mut().find(|(r, a, _)| *r == &*one.registration && *a == one.address) {
                        Some((_, _, count)) => *count += one.count(),
                        None => held.push((&one.registration, &one.address, one.count())),
                    }
                }
                for (registration, address, unsettled) in held {
                    tracing::error!(
                        registration,
                        address,
                        unsettled,
                        "second stop signal: exiting now; these deliveries stay unsettled and come back as the broker's rules say"
                    );
                }
                let total: usize = in_flight.iter().map(|h| h.count()).sum();
                tracing::error!(unsettled = total, "second stop signal: exiting now");
                std::process::exit(130);
            }
        }
    }

    /// Where the ops endpoint listens, when [`App::ops`] or [`App::ops_on`] turned it on.
    pub fn ops_addr(&self) -> Option<SocketAddr> {
        self.ops_addr
    }

    /// Every metric in the Prometheus text format, when metrics are on (the brokers are
    /// asked for their backlog first, as at a scrape of `/metrics`).
    pub async fn metrics(&self) -> Option<String> {
        let metrics = self.metrics.as_ref()?;
        metrics.refresh().await;
        Some(metrics.encode())
    }

    /// Deliveries fetched and not settled yet, over every subscription.
    pub fn in_flight(&self) -> usize {
        self.in_flight.iter().map(|h| h.count()).sum()
    }

    /// Stops fetching, lets running handlers finish within the shutdown timeout, settles
    /// what finished and closes every subscription (SPEC E3).
    pub async fn stop(self) {
        self.stop_tx.send_replace(true);
        self.wait().await;
    }

    /// Waits until every subscription has ended (after a stop, or when the brokers close them).
    pub async fn wait(mut self) {
        for driver in self.drivers.drain(..) {
            if let Err(e) = driver.await {
                tracing::error!(error = %e, "a subscription driver failed");
            }
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Also when a start was cut short: drivers it spawned, not yet handed over here,
        // see the stop and end.
        self.stop_tx.send_replace(true);
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// One rule one registration breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The registration's name.
    pub registration: String,
    /// The descriptor's address.
    pub address: String,
    /// The rule, for an operator.
    pub rule: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "registration `{}` on `{}`: {}",
            self.registration, self.address, self.rule
        )
    }
}

/// Why the app did not start. No subscription is left open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// Registrations break rules; every one is listed.
    #[error("the app refuses to start; {} rule(s) broken:{}", .0.len(), list(.0))]
    Invalid(Vec<Violation>),
    /// A subscription could not be opened; the transport's error (which names the
    /// address, and keeps the client's error as its own source) is the source.
    #[error("registration `{registration}` could not open its subscription: {source}")]
    Open {
        /// The registration's name.
        registration: String,
        /// The descriptor's address.
        address: String,
        /// What the transport said.
        #[source]
        source: SubscribeError,
    },
    /// The ops endpoint could not listen on its address.
    #[error("the ops endpoint cannot listen on {addr}: {source}")]
    Ops {
        /// The address asked for.
        addr: SocketAddr,
        /// Why (address in use, permission denied...): the I/O error.
        #[source]
        source: Cause,
    },
}

fn list(violations: &[Violation]) -> String {
    violations.iter().map(|v| format!("\n  - {v}")).collect()
}
