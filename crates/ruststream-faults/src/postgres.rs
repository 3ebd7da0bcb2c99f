//! A PostgreSQL cluster of a test's own, so the test can restart it without touching the
//! one other tests share: Debian's binaries (the test command installs them), run as the
//! `postgres` user on a directory under `/tmp` that user owns.

use std::path::PathBuf;
use std::process::Command;

/// A running cluster; stopped and removed when dropped.
pub struct OwnPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl OwnPostgres {
    /// Makes and starts a cluster on a free port (about 3 s); fails the test, saying why,
    /// when it cannot.
    pub fn start() -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is installed by the test command (scripts/brokers/postgres.sh)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("pg_ctl").exists())
            .max()
            .expect("a PostgreSQL bin directory");
        let port = crate::free_port();
        let dir = PathBuf::from(format!("/tmp/ruststream-own-postgres-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("its directory");
        let this = Self { bin, dir, port };
        run(
            &["chown", "postgres:postgres", this.dir.to_str().unwrap()],
            false,
        );
        this.as_postgres(&format!(
            "{} -D {}/data -A trust -U postgres",
            this.bin.join("initdb").display(),
            this.dir.display()
        ));
        this.pg_ctl("start");
        this
    }

    /// Its URL, database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops it (fast: open connections are cut) and starts it again.
    pub fn restart(&self) {
        self.pg_ctl("restart -m fast");
    }

    fn pg_ctl(&self, what: &str) {
        self.as_postgres(&format!(
            "{} -D {dir}/data -l {dir}/server.log -w -o '-p {} -k {dir} -c listen_addresses=127.0.0.1' {what}",
            self.bin.join("pg_ctl").display(),
            self.port,
            dir = self.dir.display(),
        ));
    }

    fn as_postgres(&self, command: &str) {
        run(&["su", "postgres", "-s", "/bin/bash", "-c", command], true);
    }
}

fn run(args: &[&str], must: bool) {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("running {args:?}: {e}"));
    assert!(
        !must || output.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Command::new("su")
            .args(["postgres", "-s", "/bin/bash", "-c"])
            .arg(format!(
                "{} -D {}/data -m immediate stop",
                self.bin.join("pg_ctl").display(),
                self.dir.display()
            ))
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
