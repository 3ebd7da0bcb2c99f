//! `dead-letters list | show | replay`: a registration's dead letters, read back from
//! its dead-letter address, shown, and replayed to where they came from.

use std::time::SystemTime;

use bytes::Bytes;
use clap::{Arg, ArgAction, ArgMatches, Command};
use ruststream_core::{
    DEAD_LETTER_AT, DEAD_LETTER_ATTEMPTS, DEAD_LETTER_PREFIX, DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE, Headers, Letter, LetterBox, Outgoing, Publish, REPLAYS_HEADER,
    RETRY_COUNT_HEADER,
};

use super::{Report, fail};
use crate::app::App;
use crate::runtime::Mount;

/// How many times a dead letter may be replayed unless `--max-replays` says otherwise.
pub(crate) const DEFAULT_MAX_REPLAYS: u32 = 3;

/// How many letters `list` and `replay` read unless `--limit` says otherwise.
const DEFAULT_LIMIT: usize = 1000;

pub(super) fn command() -> Command {
    let registration = || {
        Arg::new("registration")
            .required(true)
            .value_name("REGISTRATION")
    };
    let limit = || {
        Arg::new("limit")
            .long("limit")
            .value_name("N")
            .value_parser(clap::value_parser!(usize))
    };
    Command::new("dead-letters")
        .about("Lists, shows and replays a registration's dead letters")
        .subcommand_required(true)
        .subcommand(
            Command::new("list")
                .about(
                    "Lists the dead letters, oldest first: id, age, attempts, reason, key, payload",
                )
                .arg(registration())
                .arg(limit().default_value("20")),
        )
        .subcommand(
            Command::new("show")
                .about("Shows one dead letter whole: every header and the payload")
                .arg(registration())
                .arg(Arg::new("id").required(true).value_name("ID")),
        )
        .subcommand(
            Command::new("replay")
                .about(
                    "Publishes dead letters back to their source (or --to), each removed from \
                     the dead-letter address only once the broker confirmed its copy",
                )
                .arg(registration())
                .arg(limit().help("Replay at most N (default: every one read, up to 1000)"))
                .arg(
                    Arg::new("dry-run")
                        .long("dry-run")
                        .action(ArgAction::SetTrue),
                )
                .arg(Arg::new("to").long("to").value_name("ADDRESS"))
                .arg(
                    Arg::new("where")
                        .long("where")
                        .value_name("reason~TEXT")
                        .help("Only dead letters whose reason contains TEXT"),
                )
                .arg(
                    Arg::new("max-replays")
                        .long("max-replays")
                        .value_name("N")
                        .value_parser(clap::value_parser!(u32))
                        .default_value("3")
                        .help("A dead letter replayed N times already is refused"),
                ),
        )
}

pub(super) async fn run(app: &App, args: &ArgMatches) -> Report {
    let Some((verb, args)) = args.subcommand() else {
        return fail("dead-letters: list, show or replay".to_owned());
    };
    let name = args
        .get_one::<String>("registration")
        .cloned()
        .unwrap_or_default();
    let Some(mount) = app.mounts().iter().find(|m| m.name() == name) else {
        let names: Vec<&str> = app.mounts().iter().map(|m| m.name()).collect();
        return fail(format!(
            "no registration `{name}`; there are: {}",
            names.join(", ")
        ));
    };
    let mut letters = match mount.dead_letters().await {
        Ok(letters) => letters,
        Err(reason) => return fail(reason),
    };
    let report = match verb {
        "list" => list(letters.as_mut(), args).await,
        "show" => show(letters.as_mut(), args).await,
        _ => replay(mount.as_ref(), letters.as_mut(), args).await,
    };
    letters.close().await;
    report
}

async fn list(letters: &mut dyn LetterBox, args: &ArgMatches) -> Report {
    let limit = args.get_one::<usize>("limit").copied().unwrap_or(20);
    let read = match letters.peek(limit).await {
        Ok(read) => read,
        Err(reason) => return fail(reason),
    };
    println!("{} dead letter(s)", read.len());
    for letter in &read {
        let header = |name| letter.headers.get_str(name).unwrap_or("-");
        println!(
            "{}\tage {}\tattempts {}\treason {}\tkey {}\tpayload {}",
            letter.id,
            age(header(DEAD_LETTER_AT)),
            header(DEAD_LETTER_ATTEMPTS),
            header(DEAD_LETTER_REASON),
            letter
                .key
                .as_ref()
                .map_or("-".to_owned(), |k| preview(k, 40)),
            preview(&letter.payload, 80),
        );
    }
    Report { failed: false }
}

async fn show(letters: &mut dyn LetterBox, args: &ArgMatches) -> Report {
    let id = args.get_one::<String>("id").cloned().unwrap_or_default();
    let read = match letters.peek(DEFAULT_LIMIT * 10).await {
        Ok(read) => read,
        Err(reason) => return fail(reason),
    };
    let Some(letter) = read.iter().find(|l| l.id == id) else {
        return fail(format!(
            "no dead letter `{id}` among the {} read",
            read.len()
        ));
    };
    println!("id: {}", letter.id);
    if let Some(key) = &letter.key {
        println!("key: {}", preview(key, usize::MAX));
    }
    for (name, value) in letter.headers.iter() {
        println!("header {name}: {}", preview(value, usize::MAX));
    }
    println!(
        "payload ({} bytes):\n{}",
        letter.payload.len(),
        preview(&letter.payload, usize::MAX)
    );
    Report { failed: false }
}

async fn replay(mount: &dyn Mount, letters: &mut dyn LetterBox, args: &ArgMatches) -> Report {
    let limit = args.get_one::<usize>("limit").copied();
    let bound = args
        .get_one::<u32>("max-replays")
        .copied()
        .unwrap_or(DEFAULT_MAX_REPLAYS);
    let dry_run = args.get_flag("dry-run");
    let filter = match args
        .get_one::<String>("where")
        .map(|w| w.strip_prefix("reason~"))
    {
        None => None,
        Some(Some(text)) => Some(text.to_owned()),
        Some(None) => return fail("--where takes reason~TEXT".to_owned()),
    };
    if filter.is_some()
        && let Err(reason) = letters.selective()
    {
        return fail(format!("--where cannot be used here: {reason}"));
    }
    let read = match letters.peek(limit.unwrap_or(DEFAULT_LIMIT)).await {
        Ok(read) => read,
        Err(reason) => return fail(reason),
    };
    let publisher = mount.publisher();
    let (mut replayed, mut failed) = (0, false);
    for letter in &read {
        let reason = letter.headers.get_str(DEAD_LETTER_REASON).unwrap_or("");
        if filter
            .as_ref()
            .is_some_and(|text| !reason.contains(text.as_str()))
        {
            continue;
        }
        let to = args
            .get_one::<String>("to")
            .map(String::as_str)
            .or_else(|| letter.headers.get_str(DEAD_LETTER_SOURCE))
            .unwrap_or(mount.address())
            .to_owned();
        match replay_one(publisher.as_ref(), letters, letter, &to, bound, dry_run).await {
            Ok(()) => replayed += 1,
            Err(reason) => {
                println!("not replayed: {}: {reason}", letter.id);
                failed = true;
                // Without selective removal, a letter left behind stops the rest: removing a
                // later one would remove this one with it.
                if letters.selective().is_err() {
                    println!(
                        "stopped: the letters after {} stay where they are",
                        letter.id
                    );
                    break;
                }
            }
        }
    }
    let verb = if dry_run { "would replay" } else { "replayed" };
    println!("{verb} {replayed} of {} dead letter(s) read", read.len());
    Report { failed }
}

/// Publishes one letter to `to` and, once confirmed, removes it.
async fn replay_one(
    publisher: &dyn Publish,
    letters: &mut dyn LetterBox,
    letter: &Letter,
    to: &str,
    bound: u32,
    dry_run: bool,
) -> Result<(), String> {
    let replays: u32 = match letter.headers.get_str(REPLAYS_HEADER) {
        None => 0,
        Some(text) => text
            .parse()
            .map_err(|_| format!("{REPLAYS_HEADER} is `{text}`, not a count"))?,
    };
    if replays >= bound {
        return Err(format!(
            "replayed {replays} time(s) already, the bound is {bound} (--max-replays): a \
             message that keeps failing needs a fix, not another replay"
        ));
    }
    if dry_run {
        println!(
            "would replay {} to `{to}` (replay {})",
            letter.id,
            replays + 1
        );
        return Ok(());
    }
    let mut copy = Outgoing::new(to.to_owned(), letter.payload.clone());
    copy.key = letter.key.clone();
    copy.headers = replayed_headers(&letter.headers, replays + 1);
    publisher
        .publish(copy)
        .await
        .map_err(|e| format!("the broker refused the copy to `{to}`: {e}"))?;
    letters.remove(letter).await.map_err(|e| {
        format!("replayed to `{to}`, but not removed (it will be replayed again): {e}")
    })?;
    println!("replayed {} to `{to}` (replay {})", letter.id, replays + 1);
    Ok(())
}

/// The original's headers: the dead letter's own and the retry count dropped (a replay
/// starts its attempts again), the replay count set.
fn replayed_headers(headers: &Headers, replays: u32) -> Headers {
    let mut kept = Headers::new();
    for (name, value) in headers.iter() {
        let dropped = name.starts_with(DEAD_LETTER_PREFIX)
            || name == RETRY_COUNT_HEADER
            || name == REPLAYS_HEADER;
        if !dropped {
            kept.append(name, value.clone());
        }
    }
    kept.insert(REPLAYS_HEADER, Bytes::from(replays.to_string()));
    kept
}

/// Up to `max` characters of `bytes` as text, control characters escaped.
fn preview(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown: String = text
        .chars()
        .take(max)
        .flat_map(char::escape_default)
        .collect();
    if text.chars().count() > max {
        shown.push('…');
    }
    shown
}

/// How long ago an RFC 3339 UTC time (`2026-12-05T10:00:00.123Z`) was, roughly.
fn age(at: &str) -> String {
    let seconds = parse_utc(at).and_then(|then| SystemTime::now().duration_since(then).ok());
    match seconds.map(|d| d.as_secs()) {
        None => "-".to_owned(),
        Some(s) if s < 120 => format!("{s}s"),
        Some(s) if s < 7200 => format!("{}m", s / 60),
        Some(s) if s < 172_800 => format!("{}h", s / 3600),
        Some(s) => format!("{}d", s / 86_400),
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` as a time (the form the runtime writes).
fn parse_utc(at: &str) -> Option<SystemTime> {
    let field = |range: std::ops::Range<usize>| at.get(range)?.parse::<i64>().ok();
    let (year, month, day) = (field(0..4)?, field(5..7)?, field(8..10)?);
    let (hour, minute, second) = (field(11..13)?, field(14..16)?, field(17..19)?);
    // Days from 1970-01-01 to the date (the civil-from-days inverse, proleptic Gregorian).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(seconds)
        .ok()
        .map(|s| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use ruststream_core::{DEAD_LETTER_REASON, Headers, REPLAYS_HEADER, RETRY_COUNT_HEADER};

    use super::{parse_utc, replayed_headers};

    #[test]
    fn times_the_runtime_writes_are_read_back() {
        let at = parse_utc("2026-12-05T10:00:00.123Z").unwrap();
        let unix = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(unix, Duration::from_secs(1_796_464_800));
        assert_eq!(
            parse_utc("1970-01-01T00:00:00Z"),
            Some(SystemTime::UNIX_EPOCH)
        );
        assert_eq!(parse_utc("yesterday"), None);
    }

    #[test]
    fn a_replay_keeps_the_original_headers_and_counts_itself() {
        let mut headers = Headers::new();
        headers.append("trace", "t1");
        headers.append(RETRY_COUNT_HEADER, "2");
        headers.append(DEAD_LETTER_REASON, "retry at the cap");
        headers.append(REPLAYS_HEADER, "1");
        let replayed = replayed_headers(&headers, 2);
        let names: Vec<&str> = replayed.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["trace", REPLAYS_HEADER]);
        assert_eq!(replayed.get_str(REPLAYS_HEADER), Some("2"));
    }
}
