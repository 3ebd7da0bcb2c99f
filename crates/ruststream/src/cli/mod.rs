//! The service's command line ([`App::cli`](crate::App::cli)): `run`, `check`,
//! `asyncapi` and `publish`, over `clap`.

mod letters;

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use bytes::Bytes;
use clap::{Arg, ArgAction, ArgMatches, Command};
use ruststream_core::{Outgoing, Publish};

use crate::app::App;
use crate::publisher::Publisher;

impl App {
    /// The service's command line: one call in `main` gives its binary the commands
    /// `run` (the default), `check [--connect]`, `asyncapi [--format json|yaml] [--out
    /// FILE]` and `publish ADDRESS JSON|@FILE [--key K] [--header NAME=VALUE] [--via
    /// REGISTRATION]`, each with `--help`. Exit codes: 0 done, 1 the command failed, 2 a
    /// usage error. See the guide's "The command line". Unless the program set a
    /// `tracing` subscriber first, this installs one that logs INFO and above (or what
    /// `RUST_LOG` says) to standard error, apart from the commands' own output.
    ///
    /// ```no_run
    /// # use ruststream::App;
    /// #[tokio::main]
    /// async fn main() -> std::process::ExitCode {
    ///     let app = App::new(); // .register(..) as usual
    ///     app.cli().await
    /// }
    /// ```
    pub async fn cli(self) -> std::process::ExitCode {
        crate::logs::init_default();
        main(self, std::env::args_os()).await
    }

    /// [`cli`](Self::cli) with the given arguments (the first is the program's name).
    pub async fn cli_with<I, T>(self, args: I) -> std::process::ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        main(self, args).await
    }
}

/// What the commands report, and the exit code they end with.
struct Report {
    failed: bool,
}

fn command(program: &str) -> Command {
    Command::new("service")
        .bin_name(program.to_owned())
        .about("An event-driven service built with ruststream")
        .after_help(
            "Exit codes: 0 done; 1 the command failed (a refused registration, a broker that \
             does not answer, a refused publish, a start or run that failed); 2 a usage error.",
        )
        .subcommand(
            Command::new("run").about("Runs the service until SIGINT or SIGTERM (the default)"),
        )
        .subcommand(
            Command::new("check")
                .about("Checks every registration and prints every refusal, without starting")
                .arg(
                    Arg::new("connect")
                        .long("connect")
                        .action(ArgAction::SetTrue)
                        .help(
                            "Also ask each broker whether it answers and has what each \
                             registration reads (metadata, a passive declare), without \
                             joining a group or receiving a message",
                        ),
                ),
        )
        .subcommand(
            Command::new("asyncapi")
                .about("Writes the service's AsyncAPI 3.0.0 document")
                .arg(
                    Arg::new("format")
                        .long("format")
                        .value_parser(["json", "yaml"])
                        .default_value("json"),
                )
                .arg(
                    Arg::new("out")
                        .long("out")
                        .value_name("FILE")
                        .help("Write to FILE instead of standard output"),
                ),
        )
        .subcommand(
            Command::new("publish")
                .about("Publishes one message and waits for the broker's confirmation")
                .arg(Arg::new("address").required(true).value_name("ADDRESS"))
                .arg(
                    Arg::new("message")
                        .required(true)
                        .value_name("JSON|@FILE")
                        .help("The payload: JSON text, or @FILE to read it from FILE"),
                )
                .arg(Arg::new("key").long("key").value_name("KEY"))
                .arg(
                    Arg::new("timeout")
                        .long("timeout")
                        .value_name("SECONDS")
                        .value_parser(clap::value_parser!(u64))
                        .default_value("10")
                        .help("How long to wait for the broker's confirmation"),
                )
                .arg(
                    Arg::new("header")
                        .long("header")
                        .value_name("NAME=VALUE")
                        .action(ArgAction::Append),
                )
                .arg(Arg::new("via").long("via").value_name("REGISTRATION").help(
                    "Publish through this registration's broker (needed when the service \
                     uses several and ADDRESS is not a declared send)",
                )),
        )
        .subcommand(letters::command())
}

/// Runs the command `args` names (the first is the program).
pub(crate) async fn main<I, T>(app: App, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let program = args
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "service".to_owned());
    let matches = match command(&program).try_get_matches_from(args) {
        Ok(matches) => matches,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    let report = match matches.subcommand() {
        None | Some(("run", _)) => run(app).await,
        Some(("check", args)) => check(&app, args.get_flag("connect")).await,
        Some(("asyncapi", args)) => asyncapi(&app, args),
        Some(("publish", args)) => publish(&app, args).await,
        Some(("dead-letters", args)) => letters::run(&app, args).await,
        Some((other, _)) => fail(format!("unknown command `{other}`")),
    };
    if report.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn fail(message: String) -> Report {
    eprintln!("error: {message}");
    Report { failed: true }
}

async fn run(app: App) -> Report {
    match app.run().await {
        Ok(()) => Report { failed: false },
        Err(error) => fail(error.to_string()),
    }
}

async fn check(app: &App, connect: bool) -> Report {
    let mut failed = false;
    match app.validate() {
        Ok(()) => println!("every registration is valid ({})", app.mounts().len()),
        Err(error) => {
            println!("{error}");
            failed = true;
        }
    }
    if connect {
        for mount in app.mounts() {
            let server = mount.publisher().describe();
            let broker = match server.protocol {
                "" => "in-process".to_owned(),
                protocol => format!("{protocol} {}", server.host),
            };
            let line = format!(
                "registration `{}` on `{}` ({broker})",
                mount.name(),
                mount.address()
            );
            match mount.verify().await {
                Ok(()) => println!("ok: {line}"),
                Err(reason) => {
                    println!("FAILED: {line}: {reason}");
                    failed = true;
                }
            }
        }
    }
    Report { failed }
}

fn asyncapi(app: &App, args: &ArgMatches) -> Report {
    let document = app.asyncapi();
    let text = match args.get_one::<String>("format").map(String::as_str) {
        Some("yaml") => document.yaml(),
        _ => document.json() + "\n",
    };
    let written = match args.get_one::<String>("out") {
        Some(file) => std::fs::write(file, text).map_err(|e| format!("cannot write `{file}`: {e}")),
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string()),
    };
    match written {
        Ok(()) => Report { failed: false },
        Err(message) => fail(message),
    }
}

async fn publish(app: &App, args: &ArgMatches) -> Report {
    let address = args
        .get_one::<String>("address")
        .cloned()
        .unwrap_or_default();
    let message = args
        .get_one::<String>("message")
        .cloned()
        .unwrap_or_default();
    let payload = match message.strip_prefix('@') {
        Some(file) => match std::fs::read(file) {
            Ok(bytes) => bytes,
            Err(e) => return fail(format!("cannot read `{file}`: {e}")),
        },
        None => message.into_bytes(),
    };
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&payload) {
        return fail(format!("the message is not JSON: {e}"));
    }
    let mut outgoing = Outgoing::new(address.clone(), Bytes::from(payload));
    if let Some(key) = args.get_one::<String>("key") {
        outgoing.key = Some(Bytes::from(key.clone()));
    }
    for header in args.get_many::<String>("header").into_iter().flatten() {
        let Some((name, value)) = header.split_once('=') else {
            return fail(format!("a header is NAME=VALUE, not `{header}`"));
        };
        outgoing.headers.append(name, Bytes::from(value.to_owned()));
    }
    let publisher = match broker_for(app, &address, args.get_one::<String>("via")) {
        Ok(publisher) => publisher,
        Err(message) => return fail(message),
    };
    let seconds = args.get_one::<u64>("timeout").copied().unwrap_or(10);
    let waited = std::time::Duration::from_secs(seconds);
    match tokio::time::timeout(waited, publisher.publish(outgoing)).await {
        Ok(Ok(())) => {
            println!("published to `{address}`");
            Report { failed: false }
        }
        Ok(Err(error)) => fail(format!("the broker refused the message: {error}")),
        Err(_) => fail(format!(
            "no confirmation from the broker within {seconds}s: the message may or may not \
             have been stored (is the broker up?)"
        )),
    }
}

/// The broker to publish to `address` through: `--via`'s registration, a declared send
/// to that address, or the service's only broker.
fn broker_for(app: &App, address: &str, via: Option<&String>) -> Result<Publisher, String> {
    let mounts = app.mounts();
    if let Some(name) = via {
        return mounts
            .iter()
            .find(|m| m.name() == name.as_str())
            .map(|m| Publisher::new(m.publisher()))
            .ok_or_else(|| {
                let names: Vec<&str> = mounts.iter().map(|m| m.name()).collect();
                format!("no registration `{name}`; there are: {}", names.join(", "))
            });
    }
    if let Some(sends) = app.declared_sends().iter().find(|s| s.address == address) {
        return Ok(sends.publisher.clone());
    }
    let mut brokers: Vec<(String, std::sync::Arc<dyn Publish>)> = Vec::new();
    for mount in mounts {
        let server = mount.publisher().describe();
        let id = format!("{} {}", server.protocol, server.host);
        if !brokers.iter().any(|(seen, _)| *seen == id) {
            brokers.push((id, mount.publisher()));
        }
    }
    match brokers.len() {
        1 => Ok(Publisher::new(brokers.remove(0).1)),
        0 => Err("the service has no registration, so no broker to publish to".to_owned()),
        _ => Err(format!(
            "the service uses several brokers ({}); name one with --via REGISTRATION",
            brokers
                .into_iter()
                .map(|(id, _)| id)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
