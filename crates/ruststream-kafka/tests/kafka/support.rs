//! Helpers shared by the modules of this test binary.

use ruststream::{App, Running};

/// A subscription with quick commits, and a short session so the broker forms the group
/// quickly (tansu waits about half the session timeout for members to join).
pub(crate) async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}
