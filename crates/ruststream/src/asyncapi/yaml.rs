//! A JSON value written as block-style YAML. Strings are written double-quoted with
//! JSON's escapes (a subset of YAML's), so no value is ever read back as another type
//! (`"yes"`, `"1.0"`, `"null"` stay strings); keys are quoted unless plainly safe.

use serde_json::Value;

/// `value` as a YAML document.
pub(super) fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, value, 0),
        Value::Array(items) if !items.is_empty() => write_list(&mut out, value, 0),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, value: &Value, indent: usize) {
    let Value::Object(map) = value else { return };
    for (i, (key, item)) in map.iter().enumerate() {
        if i > 0 || indent > 0 {
            pad(out, indent);
        }
        out.push_str(&key_text(key));
        out.push(':');
        write_nested(out, item, indent);
    }
}

fn write_list(out: &mut String, value: &Value, indent: usize) {
    let Value::Array(items) = value else { return };
    for (i, item) in items.iter().enumerate() {
        if i > 0 || indent > 0 {
            pad(out, indent);
        }
        out.push('-');
        match item {
            // A map in a list starts on the dash's line: `- key: value`.
            Value::Object(map) if !map.is_empty() => {
                out.push(' ');
                let mut first = String::new();
                write_map(&mut first, item, 0);
                indent_after_first(out, &first, indent + 2);
            }
            _ => write_nested(out, item, indent),
        }
    }
}

/// What follows a `key:` or a `-`: a scalar on the same line, or a block below.
fn write_nested(out: &mut String, item: &Value, indent: usize) {
    match item {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, item, indent + 2);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_list(out, item, indent + 2);
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

/// Appends `block` (written at indent 0), indenting every line after its first.
fn indent_after_first(out: &mut String, block: &str, indent: usize) {
    for (i, line) in block.lines().enumerate() {
        if i > 0 {
            pad(out, indent);
        }
        out.push_str(line);
        out.push('\n');
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// A scalar (or an empty map or list) on one line.
fn inline(value: &Value) -> String {
    match value {
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
        other => other.to_string(),
    }
}

/// A key as written: plain when it is a simple word, else quoted.
fn key_text(key: &str) -> String {
    let plain = key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !matches!(
            key,
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain {
        key.to_owned()
    } else {
        Value::String(key.to_owned()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::to_yaml;

    #[test]
    fn maps_lists_and_scalars_in_block_style() {
        let value = json!({
            "asyncapi": "3.0.0",
            "info": {"title": "a \"b\"\nc", "version": "1.0"},
            "list": [1, "two", {"$ref": "#/x", "n": null}, [true], {}],
            "empty": {},
            "no": "yes"
        });
        // serde_json's maps keep their keys sorted.
        let expected = "asyncapi: \"3.0.0\"\n\
                        empty: {}\n\
                        info:\n  title: \"a \\\"b\\\"\\nc\"\n  version: \"1.0\"\n\
                        list:\n  - 1\n  - \"two\"\n  - \"$ref\": \"#/x\"\n    \"n\": null\n  -\n    - true\n  - {}\n\
                        \"no\": \"yes\"\n";
        assert_eq!(to_yaml(&value), expected);
    }
}
