//! NATS subject rules: what may be published to, and what a pattern matches.

/// Why `subject` cannot be published to, or `None` when it can: not empty, no
/// whitespace, no empty token, no wildcard token.
pub(crate) fn publish_rule(subject: &str) -> Option<String> {
    if subject.is_empty() {
        return Some("a NATS subject cannot be empty".to_owned());
    }
    if subject.contains(char::is_whitespace) {
        return Some("a NATS subject cannot hold whitespace".to_owned());
    }
    if subject.split('.').any(str::is_empty) {
        return Some(
            "a NATS subject cannot have an empty token (`..`, or a `.` at either end)".to_owned(),
        );
    }
    if subject.split('.').any(|t| t == "*" || t == ">") {
        return Some(
            "a NATS subject published to cannot hold a wildcard token (`*`, `>`)".to_owned(),
        );
    }
    None
}

/// True when `pattern` (with `*` for one token and a final `>` for one or more) matches
/// `subject`.
pub(crate) fn matches(pattern: &str, subject: &str) -> bool {
    let mut tokens = subject.split('.');
    for p in pattern.split('.') {
        match (p, tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (p, Some(t)) if p == t => {}
            _ => return false,
        }
    }
    tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn g4_patterns_match_as_nats_does() {
        assert!(matches("p6.>", "p6.dead"));
        assert!(matches("p6.>", "p6.a.b"));
        assert!(!matches("p6.>", "p6"));
        assert!(matches("a.*.c", "a.b.c"));
        assert!(!matches("a.*.c", "a.b.d"));
        assert!(!matches("a.*", "a.b.c"));
        assert!(matches("orders", "orders"));
        assert!(!matches("orders", "orders.dead"));
    }

    #[test]
    fn g4_published_subjects_follow_the_rules() {
        assert_eq!(publish_rule("orders.dead"), None);
        for bad in ["", "a b", "a..b", ".a", "a.", "a.*", "a.>"] {
            assert!(publish_rule(bad).is_some(), "{bad:?}");
        }
    }
}
