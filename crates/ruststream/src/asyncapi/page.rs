//! What the ops endpoint serves of the description: the document in JSON and YAML, and
//! an HTML page rendering it with the AsyncAPI project's React component (its
//! standalone bundle, a file the user points the app at; nothing is fetched from the
//! internet, by the build or by the page).

use std::path::Path;

use bytes::Bytes;

use super::AsyncApi;

/// The description's files, made once at start.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) json: Bytes,
    pub(crate) yaml: Bytes,
    pub(crate) page: Bytes,
    /// `browser/standalone/index.js` of `@asyncapi/react-component`.
    pub(crate) bundle: Option<Bytes>,
    /// Its `styles/default.min.css`, when found beside the bundle.
    pub(crate) styles: Option<Bytes>,
}

/// Where the page loads the bundle and the styles from (the ops endpoint itself).
pub(crate) const BUNDLE_PATH: &str = "/asyncapi/bundle.js";
pub(crate) const STYLES_PATH: &str = "/asyncapi/default.min.css";

impl Served {
    /// The files for `document`, with the page's bundle read from `bundle` (its styles
    /// from `../../styles/default.min.css` beside it, when there).
    pub(crate) fn new(document: &AsyncApi, bundle: Option<&Path>) -> std::io::Result<Self> {
        let json = document.json();
        let bundle_bytes = bundle.map(std::fs::read).transpose()?.map(Bytes::from);
        let styles = bundle
            .and_then(|b| {
                b.parent()?
                    .parent()?
                    .parent()
                    .map(|root| root.join("styles/default.min.css"))
            })
            .and_then(|path| std::fs::read(path).ok())
            .map(Bytes::from);
        let title = document.value()["info"]["title"]
            .as_str()
            .unwrap_or("service")
            .to_owned();
        let page = match bundle_bytes {
            Some(_) => rendered(&title, &json, styles.is_some()),
            None => without_bundle(&title),
        };
        Ok(Self {
            yaml: Bytes::from(document.yaml()),
            json: Bytes::from(json),
            page: Bytes::from(page),
            bundle: bundle_bytes,
            styles,
        })
    }
}

/// The page with the document inline, rendered by the bundle.
fn rendered(title: &str, json: &str, styles: bool) -> String {
    // Inside a <script>, `</` would end it early: JSON allows `<\/` for the same text.
    let inline = json.replace("</", "<\\/");
    let styles = if styles {
        format!(r#"<link rel="stylesheet" href="{STYLES_PATH}">"#)
    } else {
        String::new()
    };
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}: AsyncAPI</title>
{styles}
</head>
<body>
<div id="asyncapi"></div>
<script src="{BUNDLE_PATH}"></script>
<script>
AsyncApiStandalone.render({{ schema: {inline}, config: {{ show: {{ sidebar: true }} }} }}, document.getElementById("asyncapi"));
</script>
</body>
</html>
"#,
        title = escape(title),
    )
}

/// The page when no bundle was given: how to get one, and the document's links.
fn without_bundle(title: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}: AsyncAPI</title></head>
<body>
<h1>{title}</h1>
<p>The description of this service: <a href="/asyncapi.json">/asyncapi.json</a>, <a href="/asyncapi.yaml">/asyncapi.yaml</a>.</p>
<p>To see it rendered here, give the app the AsyncAPI React component's standalone bundle:
<code>npm install @asyncapi/react-component@3</code>, then
<code>App::asyncapi_page("node_modules/@asyncapi/react-component/browser/standalone/index.js")</code>.
The page loads it from this endpoint, never from the internet.</p>
</body>
</html>
"#,
        title = escape(title),
    )
}

/// Text safe inside HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
