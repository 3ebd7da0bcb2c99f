//! What the app reports for others: series and readiness from outside the registrations
//! (an outbox relay's lag, an inbox's skips), read at each scrape and readiness check.

use std::fmt::Write as _;
use std::sync::Arc;

/// Something an operator should see beside the registrations: a few series at each
/// scrape of `/metrics`, and a say in `/health/ready`. Added with
/// [`App::watch`](crate::App::watch); `ruststream-sql`'s inbox and outbox relay are
/// watches.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use ruststream::App;
/// use ruststream::ops::{Reading, Watch};
///
/// struct Cache(AtomicU64);
///
/// impl Watch for Cache {
///     fn readings(&self) -> Vec<Reading> {
///         vec![Reading::gauge("cache_entries", "entries in the cache", self.0.load(Ordering::Relaxed) as f64)]
///     }
///     fn not_ready(&self) -> Option<String> {
///         (self.0.load(Ordering::Relaxed) == 0).then(|| "the cache is not warm yet".to_owned())
///     }
/// }
///
/// let app = App::new().metrics().watch(Arc::new(Cache(AtomicU64::new(0))));
/// ```
pub trait Watch: Send + Sync + 'static {
    /// The series as they are now.
    fn readings(&self) -> Vec<Reading>;

    /// Why the service is not ready on this one's account; `None` when it is.
    fn not_ready(&self) -> Option<String> {
        None
    }
}

/// One sample of a series a [`Watch`] reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    name: String,
    help: String,
    counter: bool,
    labels: Vec<(String, String)>,
    value: f64,
}

impl Reading {
    /// A value that goes up and down. A name outside `[a-zA-Z_:][a-zA-Z0-9_:]*` has its
    /// other characters made `_`.
    pub fn gauge(name: impl Into<String>, help: impl Into<String>, value: f64) -> Self {
        Self {
            name: sane(name.into()),
            help: help.into(),
            counter: false,
            labels: Vec::new(),
            value,
        }
    }

    /// A count that only goes up; served as `<name>_total`.
    pub fn counter(name: impl Into<String>, help: impl Into<String>, value: f64) -> Self {
        Self {
            counter: true,
            ..Self::gauge(name, help, value)
        }
    }

    /// Adds a label.
    #[must_use]
    pub fn label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.push((sane(name.into()), value.into()));
        self
    }
}

/// A Prometheus name: what is not allowed made `_`.
fn sane(name: String) -> String {
    let allowed = |(i, c): (usize, char)| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    };
    if !name.is_empty() && name.chars().enumerate().all(allowed) {
        return name;
    }
    let fixed: String = name
        .chars()
        .enumerate()
        .map(|(i, c)| if allowed((i, c)) { c } else { '_' })
        .collect();
    if fixed.is_empty() {
        "_".to_owned()
    } else {
        fixed
    }
}

/// Appends every watch's readings to an OpenMetrics exposition, before its `# EOF`.
pub(crate) fn encode(out: &mut String, watches: &[Arc<dyn Watch>]) {
    if watches.is_empty() {
        return;
    }
    let end = out.rfind("# EOF").unwrap_or(out.len());
    let tail = out.split_off(end);
    let mut readings: Vec<Reading> = watches.iter().flat_map(|w| w.readings()).collect();
    // Samples of one name together, under one HELP and TYPE (the first reading's).
    readings.sort_by(|a, b| a.name.cmp(&b.name));
    let mut previous: Option<&str> = None;
    for r in &readings {
        if previous != Some(&r.name) {
            let kind = if r.counter { "counter" } else { "gauge" };
            let help = r.help.replace('\\', "\\\\").replace('\n', "\\n");
            let _ = write!(out, "# HELP {} {help}\n# TYPE {} {kind}\n", r.name, r.name);
            previous = Some(&r.name);
        }
        let suffix = if r.counter { "_total" } else { "" };
        let _ = write!(out, "{}{suffix}", r.name);
        if !r.labels.is_empty() {
            let labels: Vec<String> = r
                .labels
                .iter()
                .map(|(n, v)| {
                    let v = v
                        .replace('\\', "\\\\")
                        .replace('"', "\\\"")
                        .replace('\n', "\\n");
                    format!("{n}=\"{v}\"")
                })
                .collect();
            let _ = write!(out, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(out, " {}", r.value);
    }
    out.push_str(&tail);
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Vec<Reading>, Option<&'static str>);

    impl Watch for Fixed {
        fn readings(&self) -> Vec<Reading> {
            self.0.clone()
        }
        fn not_ready(&self) -> Option<String> {
            self.1.map(str::to_owned)
        }
    }

    #[test]
    fn readings_go_before_the_end_marker_grouped_by_name() {
        let watches: Vec<Arc<dyn Watch>> = vec![
            Arc::new(Fixed(
                vec![
                    Reading::counter("skips", "seen before", 3.0).label("registration", "a\"b"),
                    Reading::gauge("lag seconds", "oldest", 1.5),
                ],
                None,
            )),
            Arc::new(Fixed(
                vec![Reading::counter("skips", "other help", 4.0).label("registration", "c")],
                Some("x"),
            )),
        ];
        let mut out = "# HELP a b\n# EOF\n".to_owned();
        encode(&mut out, &watches);
        assert_eq!(
            out,
            "# HELP a b\n\
             # HELP lag_seconds oldest\n# TYPE lag_seconds gauge\nlag_seconds 1.5\n\
             # HELP skips seen before\n# TYPE skips counter\n\
             skips_total{registration=\"a\\\"b\"} 3\nskips_total{registration=\"c\"} 4\n\
             # EOF\n"
        );
    }
}
